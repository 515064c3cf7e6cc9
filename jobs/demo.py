"""The quick-start demo (`make demo`): build (or reuse) the model zoo and scan it as a hub.

It runs the real scan job (configs/demo.yaml) on a local Ray with a DuckDB file under ``hubtrace-out/``, then
prints the families it found, which cards disagree with the weights, and where the database and exports are.
A second run finds nothing new and finishes in seconds.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

ZOO_DIR = Path(".hubtrace-cache/zoo")
CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def main() -> None:
    from jobs.config import load_config
    from jobs.scan import run_scan
    from jobs.summary import render_summary
    from scanner.zoo import build_zoo

    console = Console()
    console.print(f"building or reusing the demo model zoo in {ZOO_DIR} ...")
    build_zoo(ZOO_DIR)
    summary = run_scan(load_config(CONFIG).with_overrides(local=ZOO_DIR), console=console)
    console.print(render_summary(summary))
    console.print(f"\nquery the results:  hubtrace query --db {summary.db} "
                  f"\"SELECT model_a, model_b, log10_p FROM current_pair_tests ORDER BY log10_p\"")
    console.print(f"family tree:        hubtrace query --db {summary.db} --derives-from aurora-labs/aurora-base")
    console.print(f"lineage graph:      hubtrace graph --db {summary.db} --format html --out lineage.html")
    console.print(f"cards vs weights:   hubtrace discrepancies --db {summary.db}")


if __name__ == "__main__":
    main()
