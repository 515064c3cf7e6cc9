"""Benchmark: peak memory while fingerprinting a 7B-shaped bf16 checkpoint (13.5 GB, Hub-style shards).

    nice python bench/bench_streaming_memory.py                   # default input set
    nice python bench/bench_streaming_memory.py --sequences 8     # 512 tokens
    nice python bench/bench_streaming_memory.py --shape 7b-plain  # Pythia-6.9B's shape: a plain (GELU) MLP

Writes a random-weight Llama-2-7B-shaped checkpoint (bf16, ~5 GB shards, index; or another shape of
synthetic_checkpoint.py) into a temporary folder under .hubtrace-cache/bench, fingerprints it in a child
process with ``fingerprint_model`` (streamed block by block), and reports the child's peak RSS (its VmHWM),
with the anonymous and file-backed parts sampled from /proc every 0.2 s, and the fingerprint file's size with
the part its write views take (the file without them is what a fingerprint held before the write view,
format 2). The checkpoint is deleted afterwards. Goal: <= 4 GB.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from synthetic_checkpoint import scratch_checkpoint

from scanner.fingerprints.inputs import InputSpec

CHILD = """
import sys, time
from pathlib import Path
from safetensors import safe_open
from scanner.fingerprints.fingerprint import fingerprint_model, write_fingerprint
from scanner.fingerprints.inputs import InputSpec
start = time.perf_counter()
fp = fingerprint_model(
    sys.argv[1], inputs=InputSpec(n_sequences=int(sys.argv[3]), seq_len=int(sys.argv[4])), device=sys.argv[5]
)
seconds = time.perf_counter() - start
write_fingerprint(fp, sys.argv[2])
hwm = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
with safe_open(sys.argv[2], "pt") as stored:
    write = sum(stored.get_tensor(k).nbytes for k in stored.keys() if k.rsplit(".", 1)[-1] in ("write", "write_scale"))
size = Path(sys.argv[2]).stat().st_size
print(f"fingerprint: {seconds:.1f} s, {len(fp.blocks)} blocks, {fp.blocks[0][0].gate.shape[0]} units, input set "
      f"{fp.meta.input_set}, file {size / 2**20:.1f} MiB, of which write views {write / 2**20:.1f} MiB "
      f"(without them {(size - write) / 2**20:.1f} MiB); VmHWM {hwm}")
"""


def _status(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile of a live process, in KiB (empty once it has exited)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {
        k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines) if k in ("VmRSS", "RssAnon", "RssFile")
    }


def measure(model: Path, out: Path, sequences: int, seq_len: int, device: str) -> None:
    """Peak RSS of a fresh fingerprinting process: its own VmHWM (the kernel's high-water mark of the process's
    memory since exec; getrusage's maxrss of a child would also count the pages it shared with this parent at
    fork, and this parent has just written gigabytes of shards), and the anonymous / file-backed split sampled
    every 0.2 s."""
    cmd = [sys.executable, "-c", CHILD, str(model), str(out), str(sequences), str(seq_len), device]
    peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    while child.poll() is None:
        for key, value in _status(child.pid).items():
            peak[key] = max(peak[key], value)
        time.sleep(0.2)
    report = child.stdout.read()
    if child.returncode != 0:
        raise SystemExit(f"fingerprinting failed with exit status {child.returncode}")
    hwm_kib = int(report.rsplit("VmHWM", 1)[1].split()[0])
    gib = 2**20
    print(report.strip())
    print(f"peak RSS (VmHWM of the fingerprinting process): {hwm_kib / gib:.2f} GiB; sampled peaks: RSS "
          f"{peak['VmRSS'] / gib:.2f} GiB, anonymous {peak['RssAnon'] / gib:.2f} GiB, file-backed (mmap) "
          f"{peak['RssFile'] / gib:.2f} GiB; goal <= 4 GB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="7b", choices=("7b", "1b", "7b-plain", "1b-plain"))
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences)
    parser.add_argument("--seq-len", type=int, default=InputSpec.seq_len)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    args = parser.parse_args()
    with scratch_checkpoint(args.cache, args.shape) as model:
        measure(model, model.parent / "fingerprint.safetensors", args.sequences, args.seq_len, args.device)


if __name__ == "__main__":
    main()
