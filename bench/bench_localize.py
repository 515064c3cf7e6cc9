"""Benchmark: `localize` of two 7B-shaped models (32 x 32 block pairs of 11008 units), screened and in full.

    python bench/bench_localize.py                      # 32 x 32 blocks, screened; 4 x 4 in full for the rate
    python bench/bench_localize.py --device cuda

B is a depth prune of A that kept 24 of its 32 blocks (every fourth block dropped), with units permuted and
noise of equal scale (bench_7b_pair's synthetic fingerprints). Prints the time of the screened localize, how
many pairs ended after their screen, whether the map is exactly the kept blocks, and the cost per block pair in
full (timed on the first 4 x 4 blocks) from which a full 32 x 32 localize is estimated.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from pathlib import Path

import torch
from bench_7b_pair import BLOCKS, UNITS, zoo_template

from scanner.inputs import InputSpec
from scanner.localize import localize
from scanner.testing.synthetic import synthetic_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=Path(".hubtrace-cache/zoo"))
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences)
    parser.add_argument("--blocks", type=int, default=BLOCKS)
    parser.add_argument("--units", type=int, default=UNITS)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    kept = [layer for layer in range(args.blocks) if layer % 4 != 3]
    a, b = synthetic_pair(zoo_template(args.zoo, args.sequences), args.blocks, args.units,
                          dict(enumerate(kept)), 11, noise=1.0, up_scale=2.5)
    b = dataclasses.replace(b, meta=dataclasses.replace(b.meta, n_layers=len(kept)), blocks=b.blocks[: len(kept)])
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}, device {args.device}; "
          f"A {len(a.blocks)} blocks, B {len(b.blocks)} blocks (A's blocks {kept[:6]}...), {args.units} units")
    start = time.perf_counter()
    result = localize(a, b, device=args.device)
    screened_s = time.perf_counter() - start
    print(f"screened localize: {screened_s:.1f} s for {len(result.pairs)} block pairs; {result.notes[-1]}")
    print(f"map is exactly the kept blocks: {result.map == [(k, j) for j, k in enumerate(kept)]}")
    small = [dataclasses.replace(x, blocks=x.blocks[:4]) for x in (a, b)]
    start = time.perf_counter()
    localize(*small, device=args.device, screen_units=None)
    per_pair = (time.perf_counter() - start) / 16
    print(f"in full: {per_pair:.2f} s per block pair (4 x 4 timed); a full {len(a.blocks)} x {len(b.blocks)} "
          f"localize would take about {per_pair * len(result.pairs) / 60:.0f} min; screened/full "
          f"{screened_s / (per_pair * len(result.pairs)):.2f}")


if __name__ == "__main__":
    main()
