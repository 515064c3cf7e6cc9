"""Benchmark: fingerprint time over plain read time on a ~1B-parameter checkpoint (TinyLlama-1.1B shape, bf16).

    nice python bench/bench_fingerprint_io.py                      # CPU
    python bench/bench_fingerprint_io.py --device cuda              # with a GPU

Writes a random-weight checkpoint (bf16, Hub-style shards) into a temporary folder under
.hubtrace-cache/bench, then, in one process and with the page cache warm for both (each is run once
before it is timed): (1) read every tensor with safetensors (``get_tensor`` copies it out of the
file), (2) ``fingerprint_model`` on the canonical inputs. Prints both times and their ratio (goal <= 1.5).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from safetensors import safe_open
from synthetic_checkpoint import scratch_checkpoint

from scanner.fingerprint import fingerprint_model
from scanner.inputs import InputSpec


def read_all(model: Path) -> int:
    """Read every tensor of every shard into memory, one at a time; returns the bytes read."""
    total = 0
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name)
                total += tensor.numel() * tensor.element_size()
                del tensor
    return total


def _best_of(repeats: int, fn, *args, **kwargs) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    args = parser.parse_args()
    spec = InputSpec(n_sequences=args.sequences, seq_len=args.seq_len)
    with scratch_checkpoint(args.cache, "1b", shard_bytes=2 * 10**9) as model:
        nbytes = read_all(model)  # warms the page cache
        read_s = _best_of(2, read_all, model)
        fingerprint_model(model, inputs=spec, device=args.device)  # warm-up (imports, kernels, cache)
        fp_s = _best_of(2, fingerprint_model, model, inputs=spec, device=args.device)
    print(f"{nbytes / 1e9:.2f} GB of tensors; {spec.n_sequences * spec.seq_len} tokens; device {args.device}")
    print(f"read all tensors: {read_s:.2f} s ({nbytes / read_s / 1e9:.2f} GB/s); fingerprint: {fp_s:.2f} s; "
          f"ratio {fp_s / read_s:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
