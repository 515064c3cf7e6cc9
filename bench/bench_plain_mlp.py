"""Benchmark: what a plain-MLP checkpoint costs to fingerprint against a gated one of the same size (CPU).

    nice python bench/bench_plain_mlp.py               # 7B-shaped: Llama-2-7B (gated) vs Pythia-6.9B (plain)
    nice python bench/bench_plain_mlp.py --size 1b     # TinyLlama-1.1B vs Pythia-1.4B shapes

Writes each random bf16 checkpoint in turn (synthetic_checkpoint.py; ~13.5 GB at 7B, deleted afterwards) and
fingerprints it in a fresh child process: the seconds, the seconds per block and per 1e9 parameters, the child's peak
RSS (VmHWM), and where the time goes (the stages of `TIMED`, timed on whichever thread runs them: the module-tree
stream runs the model's forward on a worker thread). The gated checkpoint goes through the Llama
row of scanner.reading.architectures.families and the record-then-replay stream; the plain one through transformers'
module tree, its own forward pass and the plain views (fc pre-activation, proj read-back with its per-unit projection
removed). Goal: the plain checkpoint within 3x the gated one's time, peak memory about one block.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from synthetic_checkpoint import scratch_checkpoint

CHILD = """
import importlib, json, sys, threading, time
from collections import defaultdict
from pathlib import Path
from scanner.fingerprints.fingerprint import fingerprint_model
SPENT = defaultdict(float)
NESTED = threading.local()

def timed(owner, name, label):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        stack = NESTED.__dict__.setdefault("stack", [])
        stack.append(0.0)
        start = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            elapsed = time.perf_counter() - start
            SPENT[label] += elapsed - stack.pop()  # own time: timed calls inside it count for themselves
            if stack:
                stack[-1] += elapsed
    setattr(owner, name, wrapper)

for module, owner, name, label in json.loads(sys.argv[2]):
    target = importlib.import_module(module)
    timed(getattr(target, owner) if owner else target, name, label)
start = time.perf_counter()
fp = fingerprint_model(sys.argv[1])
seconds = time.perf_counter() - start
hwm = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM"))
print(json.dumps({"seconds": seconds, "blocks": len(fp.blocks), "units": fp.blocks[0][0].gate.shape[0],
                  "kind": fp.meta.mlp_kind, "params": fp.meta.parameter_count, "hwm_kib": int(hwm),
                  "spent": dict(SPENT)}))
"""
#: Where the time goes: (module, class or "", function, label); every call is timed on whichever thread runs it, for
#: its own time (a timed call inside another, the value pass inside a read, counts for itself), so what is left is the
#: forward pass of attention, norms and the MLP itself, the embedding and the fingerprint's own summaries.
TIMED = [
    ("scanner.reading.validate", "ValuesAsRead", "__call__", "value pass: sha256 and finiteness of every tensor read"),
    ("scanner.reading.architectures.module_tree", "ModuleTree", "load",
     "read a block's tensors and place them (module tree)"),
    ("scanner.reading.streaming", "", "_load_block", "read a block's tensors and place them (Llama row)"),
    ("scanner.reading.architectures.families", "ArchitectureAdapter", "mlp",
     "read a block's MLP for its summaries (Llama row)"),
    ("scanner.reading.streaming", "", "site_activations", "the views of every unit (both paths)"),
    ("scanner.fingerprints.fingerprint", "", "stored_activations", "scale each unit to its peak, round to float16"),
]


def fingerprint_in_child(model: Path) -> dict:
    """The child's report (see CHILD)."""
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), json.dumps(TIMED)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"fingerprinting failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="7b", choices=("7b", "1b"))
    parser.add_argument("--cache", type=Path, default=Path(".hubtrace-cache/bench"))
    args = parser.parse_args()
    reports = {}
    for shape in (args.size, f"{args.size}-plain"):
        with scratch_checkpoint(args.cache, shape) as model:
            reports[shape] = report = fingerprint_in_child(model)
        print(f"{shape:9} {report['kind']:5} {report['params'] / 1e9:.2f}e9 params, {report['blocks']} blocks of "
              f"{report['units']} units: {report['seconds']:.1f} s ({report['seconds'] / report['blocks']:.2f} s a "
              f"block, {report['seconds'] / (report['params'] / 1e9):.1f} s per 1e9 parameters), peak RSS "
              f"{report['hwm_kib'] / 2**20:.2f} GiB")
        for *_, label in TIMED:
            if label in report["spent"]:
                print(f"    {report['spent'][label]:7.1f} s  {label}")
        print(f"    {report['seconds'] - sum(report['spent'].values()):7.1f} s  the rest: the forward pass of "
              "attention, norms and MLPs, embedding, summaries")
    gated, plain = reports[args.size], reports[f"{args.size}-plain"]
    per_parameter = (plain["seconds"] / plain["params"]) / (gated["seconds"] / gated["params"])
    print(f"plain / gated: {plain['seconds'] / gated['seconds']:.2f}x the time, {per_parameter:.2f}x per parameter "
          "(goal <= 3x)")


if __name__ == "__main__":
    main()
