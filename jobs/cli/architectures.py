"""`hubtrace architectures`: every causal-LM model type of the installed transformers, supported or refused."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from scanner.text_safety import terminal


def architectures_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the docs table (docs/architectures.md).")] = False,
) -> None:
    """List each causal-LM model_type as supported (gated, plain, moe, hybrid) or refused with its reason."""
    from scanner.architectures.coverage import coverage, coverage_markdown

    rows = list(coverage())
    if markdown:
        typer.echo(coverage_markdown(rows), nl=False)
    elif as_json:
        typer.echo(json.dumps([{"model_type": r.model_type, "verdict": r.verdict, "reason": r.reason,
                                "out_of_scope": r.out_of_scope} for r in rows], indent=2))
    else:
        width = max(len(r.model_type) for r in rows)
        for r in rows:
            typer.echo(f"{terminal(r.model_type):<{width}}  {r.verdict:<8}  {terminal(r.reason)}")
        in_scope = [r for r in rows if r.out_of_scope is None]
        supported = sum(r.supported for r in in_scope)
        typer.echo(f"\n{supported} of {len(in_scope)} decoder-only causal-LM model types with an MLP supported "
                   f"({100 * supported / max(len(in_scope), 1):.1f}%); {len(rows) - len(in_scope)} more causal-LM "
                   "types are encoders, encoder-decoders or have no MLP")
