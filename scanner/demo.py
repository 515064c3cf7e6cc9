"""The quick-start demo: build (or reuse) the model zoo and test a base model against three others.

`make demo` runs this. It shows the three outcomes an investigator meets: a disguised copy caught, a
pruned derivative caught across depths, and an independently trained twin left alone.
"""

from __future__ import annotations

from pathlib import Path

from scanner.compare import compare_models
from scanner.results import render_table
from scanner.zoo import build_zoo

ZOO_DIR = Path(".hubtrace-cache/zoo")
BASE = "aurora-labs/aurora-base"
SUSPECTS = ("nimbus/nimbus-1", "kestrel/aurora-lite", "tundra-research/tundra-64")


def main() -> None:
    print(f"building or reusing the demo model zoo in {ZOO_DIR} ...", flush=True)
    zoo = build_zoo(ZOO_DIR)
    for suspect in SUSPECTS:
        truth = zoo[suspect]
        print(f"\n== {BASE} vs {suspect} (truth: {truth.relation}) ==")
        print(render_table(compare_models(zoo[BASE].path, truth.path, "match")))


if __name__ == "__main__":
    main()
