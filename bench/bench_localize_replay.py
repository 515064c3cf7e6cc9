"""Benchmark: `localize` on depth(-and-width) prunes, from fingerprints (own streams) and with replayed streams.

    python bench/bench_localize_replay.py

Three prunes (scanner.zoo.deep_prune, the demo zoo): the zoo's depth prune kestrel/aurora-lite (4 -> 3 blocks,
healed); an 8-block zoo Llama trained on a synthetic language, pruned to blocks 0, 1, 3, 5, 7 and 96 of 128
units, healed 80 steps (built once, cached under .hubtrace-cache); and an untrained 8-block Llama with strong
blocks, pruned the same way to 48 of 64 units. For each: the kept blocks, the map from fingerprints, the map
with replay, each mapped pair's log10 p, and the seconds each method took (fingerprinting included).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.localize import LocalizeResult, localize, localize_replayed
from scanner.zoo import build_zoo
from scanner.zoo.deep_prune import build_deep_prune, build_random_deep_prune

CACHE = Path(".hubtrace-cache")


def _mapped(result: LocalizeResult) -> str:
    matrix = result.matrix()
    return ", ".join(f"{a}->{b} ({matrix[a, b]:.0f})" for a, b in result.map) or "nothing"


def main() -> None:
    print(f"# {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    zoo = build_zoo(CACHE / "zoo")
    trained = build_deep_prune(CACHE)
    random = build_random_deep_prune(Path(tempfile.mkdtemp()))
    cases = [
        (
            "zoo depth prune (aurora-lite)",
            zoo["aurora-labs/aurora-base"].path,
            zoo["kestrel/aurora-lite"].path,
            zoo["kestrel/aurora-lite"].details["kept_blocks"],
        ),
        ("trained 8-block depth+width prune", trained.parent, trained.child, trained.kept_blocks),
        ("untrained 8-block depth+width prune", random.parent, random.child, random.kept_blocks),
    ]
    for name, parent, child, kept in cases:
        expected = [(a, b) for b, a in enumerate(kept)]
        start = time.perf_counter()
        own = localize(fingerprint_model(parent), fingerprint_model(child))
        own_s = time.perf_counter() - start
        start = time.perf_counter()
        replayed = localize_replayed(parent, child)
        replay_s = time.perf_counter() - start
        print(f"\n{name}: kept blocks {kept}")
        for label, result, seconds in (("fingerprints", own, own_s), ("replay", replayed, replay_s)):
            hits = len(set(result.map) & set(expected))
            print(
                f"  {label:<13} {hits}/{len(kept)} kept blocks mapped{' (exact)' if result.map == expected else ''}, "
                f"{seconds:5.1f} s: {_mapped(result)}"
            )


if __name__ == "__main__":
    main()
