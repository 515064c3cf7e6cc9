"""Benchmark: pairs per hour through one PairWorker, in the mix candidate retrieval produces (mostly dependent).

    python bench/bench_pair_worker.py --device cuda                       # 7B-shaped: 32 blocks x 11008 units
    python bench/bench_pair_worker.py --device cpu --units 2048 --blocks 8 --families 2 --derivatives 2

Fingerprints are synthetic (tests.fixtures.synthetic, on a tiny random Llama's metadata): ``--families`` bases,
each with ``--derivatives`` derived models (every block derived, permuted and rescaled, cosine ~0.7), written to
a local fingerprint store; the pairs are every within-family pair (dependent) plus each base against the next
family's base (independent), sorted by first model as a scan sends them. A PairWorker per matching rule streams
them with the scan's sequential design, side by side in one run: the exact assignment first (the rule before
phi_MATCH version 3, the baseline), then the default rule (screened), then the greedy matching alone. Each worker
reads and screens its fingerprints itself, as a scan's worker does. On CUDA a torch profiler trace of one more run
(the default rule) gives the GPU's busy time: the sum of kernel times over the wall time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from synthetic_checkpoint import tiny_template

from scanner.fingerprints.inputs import InputSpec
from scanner.fingerprints.store import FingerprintStore
from scanner.pairs.worker import PairWorker
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_derivative, synthetic_pair

REVISION = "0" * 40


def build_hub(store: FingerprintStore, args: argparse.Namespace) -> list[tuple[str, str, bool]]:
    """Write the fingerprints; return the pairs (address, address, dependent) in a scan's order."""
    with tempfile.TemporaryDirectory() as tmp:
        base_meta = tiny_template(Path(tmp), args.tokens)
    families: list[list[str]] = []
    for family in range(args.families):
        base = synthetic_pair(base_meta, args.blocks, args.units, {}, seed=100 * family)[0]
        members = [store.write(base, f"family{family}/base", REVISION)[0]]
        for k in range(args.derivatives):
            derived = synthetic_derivative(base, f"family{family}/derivative{k}", seed=100 * family + k + 1,
                                           noise=1.0, up_scale=2.5)
            members.append(store.write(derived, derived.meta.model, REVISION)[0])
        families.append(members)
    pairs = [(x, y, True) for members in families for i, x in enumerate(members) for y in members[i + 1:]]
    pairs += [(families[f][0], families[(f + 1) % len(families)][0], False) for f in range(len(families))
              if len(families) > 1]
    return sorted(pairs)


def run(worker: PairWorker, pairs: list[tuple[str, str, bool]], device: str) -> tuple[float, list]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    results = [worker.compare(x, y) for x, y, _ in pairs]
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, results


def gpu_busy_fraction(worker: PairWorker, pairs: list[tuple[str, str, bool]]) -> float:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
        wall, _ = run(worker, pairs, "cuda")
    kernel_us = sum(getattr(e, "self_device_time_total", 0.0) for e in trace.key_averages())
    return kernel_us / 1e6 / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--units", type=int, default=11008)
    parser.add_argument("--blocks", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=InputSpec().n_sequences * InputSpec().seq_len)
    parser.add_argument("--families", type=int, default=2)
    parser.add_argument("--derivatives", type=int, default=3, help="derived models per base")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store = FingerprintStore(folder)
        pairs = build_hub(store, args)
        dependent = sum(d for _, _, d in pairs)
        print(f"# device {args.device}, {args.blocks} blocks x {args.units} units x {args.tokens} tokens; "
              f"{len(pairs)} pairs ({dependent} dependent), sequential design")
        design = SequentialDesign()
        timings = {}
        for rule in ("exact", "screened", "greedy"):
            worker = PairWorker(args.device, design=design, rule=rule)
            wall, results = run(worker, pairs, args.device)
            timings[rule] = wall
            wrong = sum((r.log10_p < -20) != d for r, (_, _, d) in zip(results, pairs, strict=True))
            print(f"{rule:<8} {wall:8.1f} s  {3600 * len(pairs) / wall:10.0f} pairs/hour  "
                  f"{worker.reads} fingerprint reads  {wrong} pairs called wrongly at log10 p < -20", flush=True)
        print(f"ratio exact / screened: {timings['exact'] / timings['screened']:.2f}x; exact / greedy: "
              f"{timings['exact'] / timings['greedy']:.2f}x")
        if args.device.startswith("cuda"):
            busy = gpu_busy_fraction(PairWorker(args.device, design=design), pairs)
            print(f"GPU busy during a screened run (kernel time / wall): {100 * busy:.0f}%")


if __name__ == "__main__":
    main()
