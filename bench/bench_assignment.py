"""Benchmark: scipy's dense linear_sum_assignment vs the certified sparse solver on MATCH-sized problems.

    python bench/bench_assignment.py                      # 11008 units, the canonical input set's tokens
    python bench/bench_assignment.py --size 4096 --dims 2048

Times both solvers, in one process, on the cosine matrices of (a) an independent pair (Gaussian activations,
size units x dims tokens each) and (b) a dependent pair (a permuted noisy copy), and checks that the matchings
are identical. A whole 7B-shaped pair through compare_fingerprints is bench/bench_7b_pair.py.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from scanner.fingerprints.inputs import InputSpec
from scanner.stats.assignment import solve_assignment
from scanner.stats.matching import cosine_similarity_matrix


def _pair(rng: np.random.Generator, size: int, dims: int, dependent: bool, noise: float):
    a = rng.standard_normal((size, dims), dtype=np.float32)
    if not dependent:
        return a, rng.standard_normal((size, dims), dtype=np.float32), None
    permutation = rng.permutation(size)
    b = a[permutation]
    b += noise * rng.standard_normal((size, dims), dtype=np.float32)
    return a, b, permutation


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def compare_with_scipy(size: int, dims: int, repeats: int, noise: float, seed: int) -> None:
    print(f"## scipy dense vs sparse certified: {size}x{size} cosine matrices from {dims}-dim rows")
    print(f"{'pair':<12} {'cosine s':>9} {'scipy s':>9} {'ours s (median, min)':>22} {'ratio':>7} identical  path")
    for name, dependent in (("independent", False), ("dependent", True)):
        rng = np.random.default_rng(seed + dependent)
        a, b, _ = _pair(rng, size, dims, dependent, noise)
        similarity, cosine_s = _timed(cosine_similarity_matrix, a, b)
        del a, b
        (rows, cols), scipy_s = _timed(linear_sum_assignment, similarity, maximize=True)
        times, result = [], None
        for _ in range(repeats):
            result, seconds = _timed(solve_assignment, similarity)
            times.append(seconds)
        ours = statistics.median(times)
        identical = np.array_equal(result.row_ind, rows) and np.array_equal(result.col_ind, cols)
        stats = result.stats
        path = f"{stats.method}/{stats.solver}, rounds={stats.rounds}, edges={stats.edges[-1] if stats.edges else 0}"
        split = ", ".join(f"{k}={v:.3f}" for k, v in stats.seconds.items())
        print(
            f"{name:<12} {cosine_s:>9.2f} {scipy_s:>9.2f} {ours:>12.3f} ({min(times):.3f}) "
            f"{scipy_s / ours:>6.1f}x {str(identical):>9}  {path}; last run: {split}"
        )
        del similarity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=11008, help="hidden units per block (matrix side)")
    parser.add_argument("--dims", type=int, default=InputSpec().n_sequences * InputSpec().seq_len,
                        help="tokens per unit (activation length; default: the canonical input set)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the sparse solver per matrix")
    parser.add_argument("--noise", type=float, default=1.0, help="noise scale of the dependent copies")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch  # only to report the thread count numpy's BLAS peers use

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
        f"torch threads {torch.get_num_threads()}"
    )
    compare_with_scipy(args.size, args.dims, args.repeats, args.noise, args.seed)


if __name__ == "__main__":
    main()
