"""The one place where a refusal becomes what a person sees: any `HubtraceError` a command raises is printed as
one ``hubtrace: error: ...`` line on stderr (one per problem, for a config with several) and the command exits with
status 2, never a traceback.

Commands raise; they do not print errors themselves. A foreign error whose message a person can act on (an
unwritable output file, an unknown family id) is raised again as a `CommandError` with that message.
"""

from __future__ import annotations

from typing import Any

import click
import typer
from typer.core import TyperCommand

from scanner.errors import HubtraceError
from scanner.text_safety import terminal

EXIT_REFUSED = 2
"""Exit status of every refusal (bad input, unreadable model, unusable config)."""


class CommandError(HubtraceError):
    """The command line's own refusals: options that do not go together, an output that cannot be written."""


class RefusingCommand(TyperCommand):
    """A typer command that turns a `HubtraceError` into the one-line refusal; every hubtrace command is one."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except HubtraceError as error:
            for line in error.lines():  # one line a problem; paths and ids in them are data
                typer.echo(f"hubtrace: error: {terminal(line)}", err=True)
            raise typer.Exit(EXIT_REFUSED) from error
