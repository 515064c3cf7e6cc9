"""The `hubtrace` command line: `app` (jobs/cli/app.py) and a module per command; refusals in refusals.py."""

from jobs.cli.app import app
from jobs.cli.refusals import EXIT_REFUSED

__all__ = ["EXIT_REFUSED", "app"]
