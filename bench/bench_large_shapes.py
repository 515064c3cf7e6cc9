"""Benchmark: peak memory and time per block fingerprinting today's largest shapes, from synthetic checkpoints with a
few layers (memory is per block, so a few layers show what the whole model costs).

    nice python bench/bench_large_shapes.py --shape 70b            # Llama-3-70B widths, 3 layers, 9.3 GB bf16
    nice python bench/bench_large_shapes.py --shape deepseek-v3    # one dense + one 256-expert MoE layer, 27 GB

Writes the random bf16 checkpoint (synthetic_checkpoint.py: Hub-style shards, values drawn and written a chunk at a
time) into a temporary folder under .hubtrace-cache/bench, fingerprints it in a fresh child process with
``fingerprint_model`` and reports the child's peak RSS (VmHWM, file-backed pages of the memory-mapped shards
included), the seconds and the time of each block. The child's data segment is capped (RLIMIT_DATA, 2 GiB above the
goal), so a regression fails with a MemoryError instead of pushing a shared machine into the OOM killer. The
checkpoint is deleted afterwards. Goals: 70B-shaped within 6 GB, the DeepSeek-V3 MoE block within 8 GB.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from synthetic_checkpoint import scratch_checkpoint

GOALS_GB = {"70b": 6.0, "deepseek-v3": 8.0}

CHILD = """
import json, resource, sys, time
from pathlib import Path
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
import scanner.fingerprint as fingerprint
inner, spent = fingerprint.stream_blocks, []

def timed(*args, **kwargs):
    start = time.perf_counter()
    for block in inner(*args, **kwargs):
        spent.append(time.perf_counter() - start)  # reading and running this block (and its summaries' reads)
        yield block
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


def fingerprint_in_child(model: Path, data_limit: int) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), str(data_limit)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fingerprinting failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="70b", choices=sorted(GOALS_GB))
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    parser.add_argument("--shard-gb", type=float, default=2.0)
    args = parser.parse_args()
    goal = GOALS_GB[args.shape]
    with scratch_checkpoint(args.cache, args.shape, shard_bytes=int(args.shard_gb * 1e9)) as model:
        started = time.perf_counter()
        report = fingerprint_in_child(model, int((goal + 2) * 2**30))
    hwm = report["hwm_kib"] * 1024
    print(f"{args.shape}: {report['params'] / 1e9:.2f}e9 parameters, blocks of {report['blocks']} MLPs "
          f"({report['units']} units), fingerprinted in {report['seconds']:.0f} s "
          f"({time.perf_counter() - started:.0f} s with the child's start)")
    print("time per block: " + ", ".join(f"{s:.1f} s" for s in report["block_seconds"]))
    print(f"peak RSS (VmHWM): {hwm / 2**30:.2f} GiB = {hwm / 1e9:.2f} GB; goal <= {goal:.0f} GB: "
          + ("met" if hwm <= goal * 1e9 else "NOT met"))


if __name__ == "__main__":
    main()
