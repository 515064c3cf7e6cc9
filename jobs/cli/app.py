"""The `hubtrace` command line: one typer app with a module per command (jobs/cli/*.py). Every command is a
`RefusingCommand`, so a refusal prints one ``hubtrace: error: ...`` line and exits 2 (jobs/cli/refusals.py)."""

from __future__ import annotations

import sys

import typer

from jobs.cli import architectures, compare, fingerprint, lineage, localize, query, scan, serve
from jobs.cli.refusals import RefusingCommand

app = typer.Typer(
    name="hubtrace",
    help="Tells, from weights alone, which language models were derived from which.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

COMMANDS = {
    "test": compare.test_command,
    "fingerprint": fingerprint.fingerprint_command,
    "localize": localize.localize_command,
    "query": query.query_command,
    "lineage": lineage.lineage_command,
    "graph": lineage.graph_command,
    "discrepancies": lineage.discrepancies_command,
    "report": lineage.report_command,
    "scan": scan.scan_command,
    "architectures": architectures.architectures_command,
    "serve": serve.serve_command,
}
"""Every command by the name a person types."""


@app.callback()
def main() -> None:
    """hubtrace: independence tests between language-model checkpoints."""


for _name, _command in COMMANDS.items():
    app.command(_name, cls=RefusingCommand)(_command)


if __name__ == "__main__":
    sys.exit(app())
