"""Benchmark: one 7B-shaped pair (32 blocks x 11008 units) compared from synthetic fingerprints, by each matching rule.

    python bench/bench_7b_pair.py                          # both pairs, both designs, every matching rule, on the CPU
    python bench/bench_7b_pair.py --device cuda            # cosine matrices (and greedy matchings) on the GPU
    python bench/bench_7b_pair.py --pairs dependent --design sequential --rules screened
    python bench/bench_7b_pair.py --workers 2              # also blocks compared two at a time on threads

The fingerprints are real ``Fingerprint`` objects (metadata of a tiny random Llama's fingerprint on the chosen
input set, so they are comparable) whose blocks are replaced by synthetic gate, up and write views, as a real gated
fingerprint (format 3+) holds them (three cosine products and matchings a block): Gaussian
for model A; for the dependent model B, A's units permuted per block, up rescaled, plus noise of equal
scale (cosine ~0.7 with the true partner); for the independent B, fresh Gaussians. Synthesis is not
timed. ``compare_fingerprints`` (phi_MATCH, FISHER) runs under cProfile, which reports where the time goes (unit
screen, cosine products, matching), for the scan's sequential design (``--design sequential``: screening blocks
first, stopping when they settle the test) and every block (``--design all``, as `hubtrace test`).

Per pair and design, side by side in one process: the first rule (default: the default rule, screened) on fresh
fingerprints (``cold``: each side's unit screen is computed on the way, as for the first test a fingerprint takes part
in), then every rule again on the same fingerprints (``warm``: the screens are kept on the fingerprints, as a pair
worker keeps them for the fingerprints it holds), and the ratio of each rule's warm time to the first rule's. With
``--workers`` the pair is compared again by the first rule with that many blocks at once on threads (not profiled:
cProfile sees one thread), and the results must be identical.
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

from scanner.fingerprints.fingerprint import Fingerprint
from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.pairs.results import PairTestResult
from scanner.stats.matching import MATCHING_RULES
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_pair

UNITS, BLOCKS = 11008, 32
PROFILED = ("screen_units", "decoupled_up", "cosine_similarity_matrix", "greedy_matching", "solve_assignment",
            "spearman", "paired_cosine")


def profile_compare(a: Fingerprint, b: Fingerprint, device: str, design: SequentialDesign | None, rule: str,
                    label: str) -> tuple[PairTestResult, float]:
    """One compare under cProfile: its wall time and where it went."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    result = profiler.runcall(compare_fingerprints, a, b, device=device, design=design, rule=rule)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    total = time.perf_counter() - start
    rhos = [x.rho for x in result.layers]
    print(f"{rule:<7} {label:<5} {total:7.2f} s  {result.n_layers} blocks compared, log10 p = {result.log10_p:.1f}, "
          f"rho per block {min(rhos):+.3f} .. {max(rhos):+.3f}")
    stats = pstats.Stats(profiler)
    parts = []
    for (_, _, name), row in sorted(stats.stats.items(), key=lambda kv: -kv[1][3]):
        if name in PROFILED:
            parts.append(f"{name} {row[3]:.2f} s / {row[1]}")
    print(f"        {'; '.join(parts)}")
    return result, total


def threaded_compare(a: Fingerprint, b: Fingerprint, device: str, design: SequentialDesign | None, workers: int,
                     single: tuple[PairTestResult, float]) -> None:
    """The same comparison with ``workers`` blocks at once; its time against one worker's, and equal results."""
    start = time.perf_counter()
    result = compare_fingerprints(a, b, device=device, design=design, workers=workers)
    total = time.perf_counter() - start
    same = result.layers == single[0].layers and result.log10_p == single[0].log10_p
    print(f"        workers={workers}: {total:.2f} s = {single[1] / total:.2f}x one worker's {single[1]:.2f} s; "
          f"results {'identical' if same else 'DIFFERENT'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences, help="canonical sequences of 64 tokens")
    parser.add_argument("--units", type=int, default=UNITS)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--pairs", choices=("dependent", "independent", "both"), default="both")
    parser.add_argument("--device", default="cpu", help="where the cosine matrices are computed (cpu, cuda)")
    parser.add_argument("--design", choices=("all", "sequential", "both"), default="both")
    parser.add_argument("--rules", nargs="+", choices=MATCHING_RULES, default=list(MATCHING_RULES),
                        help="matching rules timed side by side (the first one also cold)")
    parser.add_argument("--workers", type=int, nargs="*", default=[], help="also time these many blocks at once")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        template = tiny_template(Path(folder), 64 * args.sequences)
    print(f"# load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs, torch {torch.__version__} threads "
          f"{torch.get_num_threads()}, device "
          f"{args.device}{' ' + torch.cuda.get_device_name() if args.device.startswith('cuda') else ''}; "
          f"{args.blocks} blocks x {args.units} units, {template.blocks[0][0].gate.shape[1]} tokens "
          f"({template.meta.input_set})")
    designs = {"all": [None], "sequential": [SequentialDesign()], "both": [SequentialDesign(), None]}[args.design]
    for dependent in {"dependent": [True], "independent": [False], "both": [True, False]}[args.pairs]:
        parents = {layer: layer for layer in range(args.blocks)} if dependent else {}
        for design in designs:
            a, b = synthetic_pair(template, args.blocks, args.units, parents, 7 + dependent, noise=1.0,
                                  up_scale=2.5, write_views=True)  # fresh fingerprints: no screen computed yet
            print(f"## {'dependent' if dependent else 'independent'} pair, "
                  f"{'sequential design' if design else 'every block'}")
            profile_compare(a, b, args.device, design, args.rules[0], "cold")
            warm = {rule: profile_compare(a, b, args.device, design, rule, "warm") for rule in args.rules}
            for rule in args.rules[1:]:
                print(f"        {rule} / {args.rules[0]} (warm): {warm[rule][1] / warm[args.rules[0]][1]:.2f}x")
            for workers in args.workers:
                if workers > 1:
                    threaded_compare(a, b, args.device, design, workers, warm[args.rules[0]])
            del a, b


if __name__ == "__main__":
    main()
