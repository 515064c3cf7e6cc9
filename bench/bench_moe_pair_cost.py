"""Benchmark: a pair test's cost on a DeepSeek-V3-shaped fingerprint, its MoE block 257 MLPs (526,336 units).

    nice python bench/bench_moe_pair_cost.py --keep /path/with/30GB/free    # writes the checkpoint once, then reuses it

The checkpoint is bench_large_shapes.py's (`--shape deepseek-v3`: one dense layer and one MoE layer, 27.9 GB of
bf16). It is fingerprinted in this process, then each block's unit contributions are made (what a pair test does
first with a fingerprint's MoE block, once per fingerprint and worker: scanner.pairs.fingerprint_compare.contributions)
and the fingerprint is compared with itself. Prints the seconds and this process's peak RSS after each step. Needs
about 18 GiB of memory at today's code (BENCHMARKS.md, "Today's largest shapes").
"""

from __future__ import annotations

import argparse
import resource
import time
from pathlib import Path

from synthetic_checkpoint import write_random_checkpoint

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints, contributions


def peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, required=True, help="the checkpoint's folder (written if empty)")
    args = parser.parse_args()
    start = time.perf_counter()
    if not (args.keep / "config.json").is_file():
        write_random_checkpoint(args.keep, "deepseek-v3", shard_bytes=int(2e9))
    print(f"checkpoint ready in {time.perf_counter() - start:.0f} s", flush=True)
    start = time.perf_counter()
    fp = fingerprint_model(args.keep)
    print(f"fingerprint {time.perf_counter() - start:.0f} s, peak {peak_gib():.2f} GiB", flush=True)
    for layer, block in enumerate(fp.blocks):
        start = time.perf_counter()
        contributions(fp, layer)
        print(f"block {layer}: {len(block)} MLPs, {sum(m.gate.shape[0] for m in block)} units; contributions "
              f"{time.perf_counter() - start:.1f} s, peak {peak_gib():.2f} GiB", flush=True)
    start = time.perf_counter()
    result = compare_fingerprints(fp, fp)
    print(f"self comparison {time.perf_counter() - start:.1f} s (log10 p {result.log10_p:.1f}), peak "
          f"{peak_gib():.2f} GiB")


if __name__ == "__main__":
    main()
