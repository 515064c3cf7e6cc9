"""`hubtrace scan` (also `python -m jobs.scan`): the command line of the scan job; Ray loads only when it runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def scan_command(
    config: Annotated[Path, typer.Option("--config", help="YAML scan config (see configs/ and docs/scan.md).")],
    local: Annotated[Path | None, typer.Option("--local", help="Scan this org/name folder tree instead of the "
                                                              "config's sources.")] = None,
    db: Annotated[Path | None, typer.Option("--db", help="DuckDB file (default <output_dir>/hubtrace.duckdb).")] = None,
    output: Annotated[Path | None, typer.Option("--output", help="Output folder for fingerprints and exports.")] = None,
) -> None:
    """Scan models into a DuckDB database: fingerprints, pair tests, lineage (Ray; local or a cluster)."""
    from rich.console import Console

    from jobs.config import ConfigError, load_config
    from jobs.pool import NoGpuError
    from jobs.scan import run_scan
    from jobs.summary import render_summary

    try:
        cfg = load_config(config).with_overrides(local=local, db=db, output_dir=output)
        summary = run_scan(cfg)
    except (ConfigError, NoGpuError) as e:
        typer.echo(f"hubtrace: error: {e}", err=True)
        raise typer.Exit(2) from e
    Console().print(render_summary(summary))
