"""Benchmark: one 7B-shaped pair (32 blocks x 11008 units) compared from synthetic fingerprints.

    python bench/bench_7b_pair.py                          # default tokens, dependent and independent pair
    python bench/bench_7b_pair.py --sequences 32 --pairs dependent
    python bench/bench_7b_pair.py --device cuda            # on the GPU: cosine matrices and the batched auction
    python bench/bench_7b_pair.py --device cuda --solver host   # the same, assignments on the host (the old path)
    python bench/bench_7b_pair.py --workers 1 2            # blocks compared one at a time, then two at once

The fingerprints are real ``Fingerprint`` objects (metadata of a tiny random Llama's fingerprint on the chosen
input set, so they are comparable) whose blocks are replaced by synthetic gate/up activations: Gaussian
for model A; for the dependent model B, A's units permuted per block, up rescaled, plus noise of equal
scale (cosine ~0.7 with the true partner); for the independent B, fresh Gaussians. Synthesis is not
timed. ``compare_fingerprints`` (phi_MATCH, FISHER) runs once per pair and design under cProfile, which
reports where the time goes (cosine products vs assignments): every block (``--design all``), and the scan's
sequential design (``--design sequential``: screening blocks first, stopping when they settle the test).
With ``--workers`` the same pair is compared again with that many blocks at once on threads (not profiled:
cProfile sees one thread), in the same process, and the time is printed as a ratio to one worker; the results
must be identical.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

import torch
from synthetic_checkpoint import tiny_template

from scanner.fingerprint import Fingerprint
from scanner.fingerprint_compare import compare_fingerprints
from scanner.inputs import InputSpec
from scanner.stats.sequential import SequentialDesign
from scanner.testing.synthetic import synthetic_pair

UNITS, BLOCKS = 11008, 32


def profile_compare(a: Fingerprint, b: Fingerprint, device: str, design: SequentialDesign | None,
                    solver: str = "auto") -> tuple:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    result = profiler.runcall(compare_fingerprints, a, b, device=device, design=design, solver=solver)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    print(f"compare_fingerprints ({'sequential' if design else 'all blocks'}): {total:.1f} s total, "
          f"{result.n_layers} blocks compared, log10 p = {result.log10_p:.1f}, "
          f"rho per block {min(x.rho for x in result.layers):+.3f} .. {max(x.rho for x in result.layers):+.3f}")
    stats = pstats.Stats(profiler)
    wanted = ("cosine_similarity_matrix", "unit_rows", "solve_assignment", "auction_assignments", "spearman",
              "log10_matching_p", "phi_match")
    for (filename, _, name), row in sorted(stats.stats.items(), key=lambda kv: -kv[1][3]):
        if name in wanted:
            print(f"  {name:<26} {row[3]:8.2f} s cumulative over {row[1]} calls  ({Path(filename).name})")
    return result, total


def threaded_compare(a: Fingerprint, b: Fingerprint, device: str, design: SequentialDesign | None, workers: int,
                     single: tuple) -> None:
    """The same comparison with ``workers`` blocks at once; its time against one worker's, and equal results."""
    start = time.perf_counter()
    result = compare_fingerprints(a, b, device=device, design=design, workers=workers)
    total = time.perf_counter() - start
    same = result.layers == single[0].layers and result.log10_p == single[0].log10_p
    print(f"  workers={workers}: {total:.1f} s = {single[1] / total:.2f}x one worker's {single[1]:.1f} s; "
          f"results {'identical' if same else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences, help="canonical sequences of 64 tokens")
    parser.add_argument("--units", type=int, default=UNITS)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--pairs", choices=("dependent", "independent", "both"), default="both")
    parser.add_argument("--device", default="cpu", help="where the cosine matrices are computed (cpu, cuda)")
    parser.add_argument("--design", choices=("all", "sequential", "both"), default="both")
    parser.add_argument("--workers", type=int, nargs="*", default=[], help="also time these many blocks at once")
    parser.add_argument("--solver", choices=("auto", "host", "auction"), default="auto",
                        help="assignment solver (auto: the batched auction on a GPU, the host solver on the CPU)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        template = tiny_template(Path(folder), 64 * args.sequences)
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {args.device}; "
          f"{args.blocks} blocks x {args.units} units, {template.blocks[0][0].gate.shape[1]} tokens "
          f"({template.meta.input_set})")
    for dependent in {"dependent": [True], "independent": [False], "both": [True, False]}[args.pairs]:
        parents = {layer: layer for layer in range(args.blocks)} if dependent else {}
        a, b = synthetic_pair(template, args.blocks, args.units, parents, 7 + dependent, noise=1.0, up_scale=2.5)
        print(f"## {'dependent' if dependent else 'independent'} pair")
        designs = {"all": [None], "sequential": [SequentialDesign()], "both": [SequentialDesign(), None]}
        for design in designs[args.design]:
            single = profile_compare(a, b, args.device, design, args.solver)
            for workers in args.workers:
                if workers > 1:
                    threaded_compare(a, b, args.device, design, workers, single)
        del a, b


if __name__ == "__main__":
    main()
