"""The `hubtrace` command line. Refusals print one clear line and exit non-zero, never a traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from scanner.errors import HubtraceError
from scanner.inputs import InputSpec

app = typer.Typer(
    name="hubtrace",
    help="Tells, from weights alone, which language models were derived from which.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

EXIT_REFUSED = 2


def _fail(message: str) -> None:
    typer.echo(f"hubtrace: error: {message}", err=True)
    raise typer.Exit(EXIT_REFUSED)


@app.callback()
def main() -> None:
    """hubtrace: independence tests between language-model checkpoints."""


@app.command("test")
def test_command(
    model_a: Annotated[Path, typer.Argument(help="First model: a Hugging Face-format directory (or a fingerprint file).")],
    model_b: Annotated[Path, typer.Argument(help="Second model: a Hugging Face-format directory (or a fingerprint file).")],
    stat: Annotated[str, typer.Option("--stat", help="match (robust, default) | up | hidden | l2 | jsd")] = "match",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    sequences: Annotated[int, typer.Option(help="Canonical input sequences (activation statistics).")] = InputSpec.n_sequences,
    seq_len: Annotated[int, typer.Option(help="Tokens per canonical sequence.")] = InputSpec.seq_len,
    seed: Annotated[int, typer.Option(help="Seed of the canonical inputs and of PERMTEST.")] = 0,
    permutations: Annotated[int, typer.Option(help="PERMTEST samples T for --stat l2.")] = 99,
    device: Annotated[str, typer.Option(help="torch device for forward passes, e.g. cpu or cuda.")] = "cpu",
    fingerprint: Annotated[
        bool, typer.Option("--fingerprint", help="Compare fingerprints (implied when a side is a fingerprint file).")
    ] = False,
) -> None:
    """Test whether MODEL_A and MODEL_B were trained independently."""
    from scanner.compare import STATISTICS, compare_models
    from scanner.results import render_table

    if stat not in STATISTICS:
        _fail(f"unknown statistic {stat!r}; choose one of {', '.join(STATISTICS)}")
    spec = InputSpec(seed=seed, n_sequences=sequences, seq_len=seq_len)
    try:
        if fingerprint or model_a.is_file() or model_b.is_file():
            from scanner.cli_fingerprint import compare_sides

            result = compare_sides(model_a, model_b, stat, spec, device)
        else:
            result = compare_models(
                model_a, model_b, stat, inputs=spec, permutations=permutations, seed=seed, device=device
            )
    except HubtraceError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(result.to_json_dict(), indent=2) if as_json else render_table(result))


from scanner.cli_fingerprint import fingerprint_command  # noqa: E402 (registered after app exists)

app.command("fingerprint")(fingerprint_command)

from scanner.cli_localize import localize_command  # noqa: E402 (registered after app exists)

app.command("localize")(localize_command)

from scanner import cli_lineage  # noqa: E402

for _name, _command in (("lineage", cli_lineage.lineage_command), ("graph", cli_lineage.graph_command),
                        ("discrepancies", cli_lineage.discrepancies_command), ("report", cli_lineage.report_command)):
    app.command(_name)(_command)


from jobs.cli_scan import scan_command  # noqa: E402

app.command("scan")(scan_command)

from scanner.cli_query import query_command  # noqa: E402 (registered after app exists)

app.command("query")(query_command)

if __name__ == "__main__":
    sys.exit(app())
