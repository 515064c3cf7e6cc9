"""Benchmark: scipy's dense linear_sum_assignment vs the certified sparse solver on MATCH-sized problems.

    python bench/bench_assignment.py                      # 11008 units, 2048 tokens, 7B-shaped pair too
    python bench/bench_assignment.py --size 4096 --blocks 4 --model-pair both

Part 1 times both solvers, in one process, on the cosine matrices of (a) an independent pair (Gaussian
activations, size units x dims tokens each) and (b) a dependent pair (a permuted noisy copy), and
checks that the matchings are identical. Part 2 runs phi_MATCH's two matchings (gate, up) for every
block of a 7B-shaped pair (blocks x size units, synthetic activations) with the sparse solver only,
timing the cosine matrices and the assignments separately (activation synthesis is not counted).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np
from scipy.optimize import linear_sum_assignment

from scanner.stats.assignment import solve_assignment
from scanner.stats.matching import cosine_similarity_matrix, spearman


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


def model_pair(size: int, dims: int, blocks: int, dependent: bool, noise: float, seed: int) -> None:
    kind = "dependent (permuted noisy copy)" if dependent else "independent"
    print(f"## 7B-shaped {kind} pair: {blocks} blocks x {size} units, gate + up matchings, {dims} tokens")
    rng = np.random.default_rng(seed + 100 + dependent)
    synth_s = cosine_s = lap_s = 0.0
    lap_times, rhos, extra_rounds, dense = [], [], 0, 0
    wall = time.perf_counter()
    for _ in range(blocks):
        start = time.perf_counter()
        gate_a, gate_b, permutation = _pair(rng, size, dims, dependent, noise)
        up_a = rng.standard_normal((size, dims), dtype=np.float32)
        up_b = up_a[permutation] + noise * rng.standard_normal((size, dims), dtype=np.float32) if dependent else (
            rng.standard_normal((size, dims), dtype=np.float32)
        )
        synth_s += time.perf_counter() - start
        matchings = []
        for a, b in ((gate_a, gate_b), (up_a, up_b)):
            similarity, seconds = _timed(cosine_similarity_matrix, a, b)
            cosine_s += seconds
            result, seconds = _timed(solve_assignment, similarity)
            lap_s += seconds
            lap_times.append(seconds)
            extra_rounds += result.stats.rounds > 1
            dense += result.stats.method == "dense"
            matchings.append(result.col_ind)
            del similarity
        rhos.append(spearman(matchings[0].astype(float), matchings[1].astype(float)))
    wall = time.perf_counter() - wall
    print(
        f"cosine matrices: {cosine_s:.1f} s ({cosine_s / (2 * blocks):.2f} s each); "
        f"assignments: {lap_s:.1f} s ({statistics.median(lap_times):.3f} s median, {max(lap_times):.3f} s max); "
        f"cosine + assignments: {cosine_s + lap_s:.1f} s; wall incl. synthesis: {wall:.1f} s (synthesis {synth_s:.1f} s)"
    )
    print(
        f"matchings needing a second sparse round: {extra_rounds}/{2 * blocks}; dense fallbacks: {dense}; "
        f"phi_MATCH rho (gate vs up) mean {np.mean(rhos):+.4f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=11008, help="hidden units per block (matrix side)")
    parser.add_argument("--dims", type=int, default=2048, help="tokens per unit (activation length)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of the sparse solver per matrix")
    parser.add_argument("--blocks", type=int, default=32, help="blocks of the 7B-shaped pair (0: skip)")
    parser.add_argument("--model-pair", choices=("independent", "dependent", "both"), default="independent")
    parser.add_argument("--no-scipy", action="store_true", help="skip part 1 (scipy comparison)")
    parser.add_argument("--noise", type=float, default=1.0, help="noise scale of the dependent copies")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch  # only to report the thread count numpy's BLAS peers use

    print(
        f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, numpy {np.__version__}, "
        f"torch threads {torch.get_num_threads()}"
    )
    if not args.no_scipy:
        compare_with_scipy(args.size, args.dims, args.repeats, args.noise, args.seed)
    if args.blocks:
        kinds = {"independent": [False], "dependent": [True], "both": [False, True]}[args.model_pair]
        for dependent in kinds:
            model_pair(args.size, args.dims, args.blocks, dependent, args.noise, args.seed)


if __name__ == "__main__":
    main()
