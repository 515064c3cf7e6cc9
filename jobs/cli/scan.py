"""`hubtrace scan` (also `python -m jobs.scan`): the command line of the scan job; Ray loads only when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.refusals import CommandError


def scan_command(
    config: Annotated[Path | None, typer.Option(
        "--config", help="YAML scan config (see configs/ and docs/scan.md); optional with --local.")] = None,
    local: Annotated[Path | None, typer.Option("--local", help="Scan this org/name folder tree instead of the "
                                                              "config's sources.")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="DuckDB file (default <output_dir>/hubtrace.duckdb).")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Output folder for fingerprints and exports.")] = None,
    follow_links: Annotated[bool, typer.Option("--follow-links", help="Follow links out of local source folders "
                                               "(your own tree of linked downloads); off by default.")] = False,
) -> None:
    """Scan models into a DuckDB database: fingerprints, pair tests, lineage (Ray; local or a cluster).

    `--local DIR` alone scans that folder with the defaults of configs/local-folder.yaml (output in
    hubtrace-out/local)."""
    from rich.console import Console

    from jobs.config import load_config, local_folder_config
    from jobs.scan_job import run_scan
    from jobs.summary import render_summary

    if config is not None:
        cfg = load_config(config)
    elif local is not None:
        cfg = local_folder_config(local)
    else:
        raise CommandError("give --config FILE, or --local DIR to scan a folder with the defaults")
    summary = run_scan(cfg.with_overrides(local=local, db=db, output_dir=output, follow_links=follow_links))
    Console().print(render_summary(summary))
