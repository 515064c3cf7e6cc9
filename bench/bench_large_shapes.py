"""Benchmark: peak memory and time per block fingerprinting today's largest shapes, from synthetic checkpoints with a
few layers (memory is per block, so a few layers show what the whole model costs).

    nice python bench/bench_large_shapes.py --shape 70b            # Llama-3-70B widths, 3 layers, 9.3 GB bf16
    nice python bench/bench_large_shapes.py --shape deepseek-v3    # one dense + one 256-expert MoE layer, 27 GB
    ... --keep DIR          # write the checkpoint into DIR once and keep it (a later run reuses it)

Writes the random bf16 checkpoint (synthetic_checkpoint.py: Hub-style shards, values drawn and written a chunk at a
time) into a temporary folder under .hubtrace-cache/bench, fingerprints it in a fresh child process with
``fingerprint_model`` and reports the child's peak RSS (VmHWM, file-backed pages of the memory-mapped shards
included), the seconds and the time of each block. The child's RSS is sampled every 0.1 s and the child is stopped
once it passes 2 GiB above the goal, so a regression ends the run instead of pushing a shared machine into the OOM
killer (a cap on the data segment would count the memory-mapped shards too). The checkpoint is deleted afterwards.
Goals: 70B-shaped within 6 GB, the DeepSeek-V3 MoE block within 8 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from synthetic_checkpoint import scratch_checkpoint, write_random_checkpoint

GOALS_GB = {"70b": 6.0, "deepseek-v3": 8.0}

CHILD = """
import json, sys, time
from pathlib import Path
import scanner.fingerprints.fingerprint as fingerprint
inner, spent = fingerprint.stream_blocks, []

def timed(*args, **kwargs):
    start = time.perf_counter()
    for block in inner(*args, **kwargs):
        spent.append(time.perf_counter() - start)  # reading and running this block (and its summaries' reads)
        yield block
        del block  # as fingerprint_model does: no block outlives its turn
        start = time.perf_counter()

fingerprint.stream_blocks = timed
start = time.perf_counter()
fp = fingerprint.fingerprint_model(sys.argv[1])
seconds = time.perf_counter() - start
hwm = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "blocks": [len(b) for b in fp.blocks], "block_seconds": spent,
                  "units": [b[0].gate.shape[0] for b in fp.blocks], "hwm_kib": int(hwm),
                  "params": fp.meta.parameter_count}))
"""


def fingerprint_in_child(model: Path, rss_cap: int) -> dict:
    """The child's report; stopped (and this run ended) once its RSS passes ``rss_cap`` bytes."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:  # no pipe to fill and block on
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(model)], stdout=out, stderr=err, text=True)
        while child.poll() is None:
            if _rss(child.pid) > rss_cap:
                child.kill()
                child.wait()
                raise SystemExit(f"stopped: the fingerprinting process passed {rss_cap / 2**30:.1f} GiB of RSS")
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        if child.returncode != 0:
            raise SystemExit(f"fingerprinting failed:\n{err.read()[-3000:]}")
        return json.loads(out.read().strip().splitlines()[-1])


def _rss(pid: int) -> int:
    """VmRSS of a live process in bytes (0 once it has exited)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0
    return next((int(line.split()[1]) * 1024 for line in lines if line.startswith("VmRSS")), 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="70b", choices=sorted(GOALS_GB))
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    parser.add_argument("--shard-gb", type=float, default=2.0)
    parser.add_argument("--keep", type=Path, help="write the checkpoint here and keep it (or reuse it if it is there)")
    args = parser.parse_args()
    goal = GOALS_GB[args.shape]
    limit = int((goal + 2) * 2**30)
    started = time.perf_counter()
    if args.keep is not None:
        if not (args.keep / "config.json").is_file():
            write_random_checkpoint(args.keep, args.shape, shard_bytes=int(args.shard_gb * 1e9))
        started = time.perf_counter()
        report = fingerprint_in_child(args.keep, limit)
    else:
        with scratch_checkpoint(args.cache, args.shape, shard_bytes=int(args.shard_gb * 1e9)) as model:
            started = time.perf_counter()
            report = fingerprint_in_child(model, limit)
    hwm = report["hwm_kib"] * 1024
    print(f"{args.shape}: {report['params'] / 1e9:.2f}e9 parameters, blocks of {report['blocks']} MLPs "
          f"({report['units']} units), fingerprinted in {report['seconds']:.0f} s "
          f"({time.perf_counter() - started:.0f} s with the child's start)")
    print("time per block: " + ", ".join(f"{s:.1f} s" for s in report["block_seconds"]))
    print(f"peak RSS (VmHWM): {hwm / 2**30:.2f} GiB = {hwm / 1e9:.2f} GB; goal <= {goal:.0f} GB: "
          + ("met" if hwm <= goal * 1e9 else "NOT met"))


if __name__ == "__main__":
    main()
