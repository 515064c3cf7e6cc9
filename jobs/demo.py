"""The quick-start demo (`make demo`, run from the repository root): build (or reuse) the model zoo and scan it
as a hub.

    python -m jobs.demo [--config configs/demo.yaml]

It runs the real scan job (configs/demo.yaml, a path relative to the working directory like every path in it)
on a local Ray with a DuckDB file under ``hubtrace-out/``, then prints the families it found, which cards
disagree with the weights, and where the database and exports are. A second run finds nothing new and finishes
in seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from jobs.cli.refusals import RefusingCommand

ZOO_DIR = Path(".hubtrace-cache/zoo")
CONFIG = Path("configs/demo.yaml")


def demo_command(
    config: Annotated[Path, typer.Option("--config", help="The demo's scan config.")] = CONFIG,
) -> None:
    """Build or reuse the demo model zoo, scan it with Ray into DuckDB, and say where to look next."""
    from jobs.config import load_config
    from jobs.scan_job import run_scan
    from jobs.summary import render_summary
    from scanner.zoo import build_zoo

    scan_config = load_config(config).with_overrides(local=ZOO_DIR)
    console = Console()
    console.print(f"building or reusing the demo model zoo in {ZOO_DIR} ...")
    build_zoo(ZOO_DIR)
    summary = run_scan(scan_config, console=console)
    console.print(render_summary(summary))
    console.print(f"\nquery the results:  hubtrace query --db {summary.db} "
                  f"\"SELECT model_a, model_b, log10_p FROM current_pair_tests ORDER BY log10_p\"")
    console.print(f"family tree:        hubtrace query --db {summary.db} --derives-from aurora-labs/aurora-base")
    console.print(f"lineage graph:      hubtrace graph --db {summary.db} --format html --out lineage.html")
    console.print(f"cards vs weights:   hubtrace discrepancies --db {summary.db}")


def main() -> None:
    demo = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    demo.command(cls=RefusingCommand)(demo_command)
    demo(prog_name="python -m jobs.demo")


if __name__ == "__main__":
    main()
