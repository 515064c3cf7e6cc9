"""Benchmark: fingerprint time over plain read time on a ~1B-parameter checkpoint (TinyLlama-1.1B shape, bf16).

    nice python bench/bench_fingerprint_io.py                      # CPU
    python bench/bench_fingerprint_io.py --device cuda              # with a GPU
    python bench/bench_fingerprint_io.py --device cuda --shape 7b   # Llama-2-7B shape (13.5 GB)

Writes a random-weight checkpoint (bf16, Hub-style shards) into a temporary folder under
.hubtrace-cache/bench, then times in one process (1) reading every tensor into memory with safetensors and
(2) ``fingerprint_model`` on the canonical inputs, both from a cold page cache (``/proc/sys/vm/drop_caches``,
which needs root; skipped with a note otherwise) and from a warm one (best of two). Prints both times, their
ratio (goal <= 1.5) and the models per hour one device fingerprints from local disk at the cold time (the
fingerprint actor's code path without Ray: fetch and store aside, an actor runs ``fingerprint_model``). Also
times, as the baseline of one read per tensor, checking then running: the separate value pass
(``validate_checkpoint``) and then ``fingerprint_model`` given its hashes, two reads of every weight (what
``hubtrace test`` and a scan's worker do).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from safetensors import safe_open
from synthetic_checkpoint import scratch_checkpoint

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.fingerprints.inputs import InputSpec
from scanner.reading.validate import validate_checkpoint


def read_all(model: Path) -> int:
    """Copy every tensor of every shard into memory, one at a time; returns the bytes read.

    ``get_tensor`` may hand back a view of the memory-mapped file that touches no byte, so each tensor is copied
    into fresh memory: every byte is read, as fingerprinting must.
    """
    total = 0
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            for name in f.keys():
                tensor = f.get_tensor(name).clone()
                total += tensor.numel() * tensor.element_size()
                del tensor
    return total


def check_then_run(model: Path, **kwargs) -> None:
    """The two-read baseline: every weight read by the value pass, then again by the forward pass."""
    valid = validate_checkpoint(model)
    valid.checkpoint.close()
    fingerprint_model(model, tensor_hashes=valid.tensor_hashes, **kwargs)


def drop_page_cache() -> bool:
    """Empty the kernel's page cache so the next read comes from the disk; False when not permitted."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def _cold(fn, *args, **kwargs) -> float | None:
    if not drop_page_cache():
        return None
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


def _best_of(repeats: int, fn, *args, **kwargs) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences)
    parser.add_argument("--seq-len", type=int, default=InputSpec.seq_len)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    parser.add_argument("--shape", default="1b", choices=("1b", "7b"))
    args = parser.parse_args()
    spec = InputSpec(n_sequences=args.sequences, seq_len=args.seq_len)
    with scratch_checkpoint(args.cache, args.shape, shard_bytes=2 * 10**9) as model:
        fingerprint_model(model, inputs=spec, device=args.device)  # warm-up: imports, kernels
        cold = {"read": _cold(read_all, model), "fingerprint": _cold(fingerprint_model, model, inputs=spec,
                                                                        device=args.device),
                "check then run": _cold(check_then_run, model, inputs=spec, device=args.device)}
        nbytes = read_all(model)
        warm = {"read": _best_of(2, read_all, model),
                "fingerprint": _best_of(2, fingerprint_model, model, inputs=spec, device=args.device),
                "check then run": _best_of(2, check_then_run, model, inputs=spec, device=args.device)}
    print(f"{args.shape}: {nbytes / 1e9:.2f} GB of tensors; {spec.n_sequences * spec.seq_len} tokens; "
          f"device {args.device}")
    for cache, times in (("cold", cold), ("warm", warm)):
        if times["read"] is None:
            print(f"{cache} page cache: not measured (dropping the page cache needs root)")
            continue
        print(f"{cache} page cache: read all tensors {times['read']:.2f} s ({nbytes / times['read'] / 1e9:.2f} GB/s); "
              f"fingerprint {times['fingerprint']:.2f} s; "
              f"ratio {times['fingerprint'] / times['read']:.2f} (goal <= 1.5); "
              f"{3600 / times['fingerprint']:.0f} models/hour; "
              f"check then run (two reads) {times['check then run']:.2f} s "
              f"({times['check then run'] / times['fingerprint']:.2f}x the one-read fingerprint)")


if __name__ == "__main__":
    main()
