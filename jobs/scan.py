"""``python -m jobs.scan``: the scan job's entry point for ``ray job submit`` and cron, the same command as
``hubtrace scan`` (same options, same one-line refusals). The job itself is jobs/scan_job.py.

    ray job submit --working-dir . -- python -m jobs.scan --config configs/nightly-hub.yaml
"""

from __future__ import annotations

import sys

import typer

from jobs.cli.refusals import RefusingCommand
from jobs.cli.scan import scan_command


def main() -> None:
    scan = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
    scan.command(cls=RefusingCommand)(scan_command)
    scan(prog_name="python -m jobs.scan")


if __name__ == "__main__":
    sys.exit(main())
