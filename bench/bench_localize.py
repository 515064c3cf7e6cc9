"""Benchmark: `localize` of two 7B-shaped models (32 x 32 block pairs of 11008 units), screened and in full.

    python bench/bench_localize.py                      # 32 x 32 blocks, screened; 4 x 4 in full for the rate
    python bench/bench_localize.py --device cuda
    python bench/bench_localize.py --rules greedy exact  # each matching rule, side by side

A localize screened like this is what a scan's pair worker runs for a related pair whose depths differ, to make its
block map (scanner.pairs.block_map).

B is a depth prune of A that kept 24 of its 32 blocks (every fourth block dropped), with units permuted and
noise of equal scale (bench_7b_pair's synthetic fingerprints). Prints the time of the screened localize, how
many pairs ended after their screen, whether the map is exactly the kept blocks, and the cost per block pair in
full (timed on the first 4 x 4 blocks) from which a full 32 x 32 localize is estimated.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import torch
from bench_7b_pair import BLOCKS, UNITS
from synthetic_checkpoint import tiny_template

from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.localize import localize
from scanner.stats.matching import MATCHING_RULES
from tests.fixtures.synthetic import synthetic_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--units", type=int, default=UNITS)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rules", nargs="+", choices=MATCHING_RULES, default=["screened"])
    args = parser.parse_args()
    kept = [layer for layer in range(args.blocks) if layer % 4 != 3]
    with tempfile.TemporaryDirectory() as folder:
        template = tiny_template(Path(folder), 64 * args.sequences)
    a, b = synthetic_pair(template, args.blocks, args.units, dict(enumerate(kept)), 11, noise=1.0, up_scale=2.5)
    b = dataclasses.replace(b, meta=dataclasses.replace(b.meta, n_layers=len(kept)), blocks=b.blocks[: len(kept)])
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {args.device}; "
          f"A {len(a.blocks)} blocks, B {len(b.blocks)} blocks (A's blocks {kept[:6]}...), {args.units} units")
    for rule in args.rules:
        start = time.perf_counter()
        result = localize(a, b, device=args.device, rule=rule)
        screened_s = time.perf_counter() - start
        print(f"{rule}: screened localize {screened_s:.1f} s for {len(result.pairs)} block pairs; {result.notes[-1]}")
        print(f"{rule}: map is exactly the kept blocks: {result.map == [(k, j) for j, k in enumerate(kept)]}")
        small = [dataclasses.replace(x, blocks=x.blocks[:4]) for x in (a, b)]
        start = time.perf_counter()
        localize(*small, device=args.device, screen_units=None, rule=rule)
        per_pair = (time.perf_counter() - start) / 16
        print(f"{rule}: in full {per_pair:.2f} s per block pair (4 x 4 timed); a full {len(a.blocks)} x "
              f"{len(b.blocks)} localize would take about {per_pair * len(result.pairs) / 60:.0f} min; screened/full "
              f"{screened_s / (per_pair * len(result.pairs)):.2f}", flush=True)


if __name__ == "__main__":
    main()
