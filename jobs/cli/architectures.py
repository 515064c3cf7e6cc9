"""`hubtrace architectures`: every model type of the installed transformers, by kind, supported or refused."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from scanner.text_safety import terminal


def architectures_command(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list instead of a table.")] = False,
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the docs table (docs/architectures.md).")] = False,
) -> None:
    """List each model_type of the causal LMs, the image-text-to-text models (their language model) and the encoder
    masked LMs as supported (gated, plain, moe, hybrid) or refused with its reason."""
    from scanner.reading.architectures.coverage import TASKS, all_coverage, coverage_markdown, coverage_summary

    rows = all_coverage()
    if markdown:
        typer.echo(coverage_markdown(rows), nl=False)
    elif as_json:
        typer.echo(json.dumps([{"task": r.task, "model_type": r.model_type, "verdict": r.verdict, "reason": r.reason,
                                "out_of_scope": r.out_of_scope} for r in rows], indent=2))
    else:
        width = max(len(r.model_type) for r in rows)
        for task, (_, heading) in TASKS.items():
            typer.echo(f"{heading}\n")
            for r in (r for r in rows if r.task == task):
                typer.echo(f"{terminal(r.model_type):<{width}}  {r.verdict:<8}  {terminal(r.reason)}")
            typer.echo("\n" + coverage_summary(rows, task).replace("**", "") + "\n")
