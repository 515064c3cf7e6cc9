"""`hubtrace lineage | graph | discrepancies | report`: the lineage graph from a scan database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from jobs.cli.refusals import CommandError
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE
from scanner.errors import HubtraceError
from scanner.text_safety import json_visible, terminal

if TYPE_CHECKING:
    from lineage_graph.lineage import Lineage
    from scanner.store import Store

Db = Annotated[Path, typer.Option("--db", help="The scan's DuckDB file.")]


def _open(db: Path, read_only: bool) -> Store:
    from scanner.store import Store

    if not db.is_file():
        raise CommandError(f"no database at {db}")
    try:
        return Store(db, read_only=read_only)
    except HubtraceError:
        raise
    except Exception as exc:  # a locked or foreign file: say so in one line
        raise CommandError(f"cannot open {db}: {exc}") from exc


def lineage_command(
    db: Db,
    q: Annotated[float, typer.Option("--q", help="False-discovery rate for calling pairs dependent.")] = 0.05,
    method: Annotated[str, typer.Option("--method", help="bh (Benjamini-Hochberg) | by (Benjamini-Yekutieli)")] = "bh",
    min_direction_confidence: Annotated[float, typer.Option(
        "--min-direction-confidence",
        help="Directions below this confidence are drawn without an arrow, as 'direction undecided' "
             "(docs/lineage.md).")] = DEFAULT_MIN_DIRECTION_CONFIDENCE,
) -> None:
    """Rebuild lineage_edges, families, family_members and discrepancies from the current pair tests."""
    from lineage_graph.multiple_testing import METHODS
    from lineage_graph.persist import rebuild_lineage

    if method not in METHODS or not 0 < q < 1 or not 0.5 <= min_direction_confidence <= 1:
        raise CommandError(f"--method must be one of {', '.join(METHODS)}, --q in (0, 1) and "
                           "--min-direction-confidence in [0.5, 1]")
    with _open(db, read_only=False) as store:
        lineage = rebuild_lineage(store, q=q, method=method, min_direction_confidence=min_direction_confidence)
    dependent = [e for e in lineage.edges if e.dependent]
    undecided = sum(e.direction.parent is not None and not e.direction.claimed for e in dependent)
    typer.echo(f"{len(lineage.models)} models, {len(lineage.edges)} tested pairs, {len(dependent)} dependent "
               f"(FDR q={q}, {method}), {sum(len(f.members) > 1 for f in lineage.families)} families with "
               f"relatives, {undecided} directions undecided (confidence < {min_direction_confidence:g}), "
               f"{len(lineage.discrepancies)} discrepancies")


def graph_command(
    db: Db,
    fmt: Annotated[str, typer.Option("--format", help="graphml | gexf | json | dot | html | png")],
    out: Annotated[Path, typer.Option("--out", help="File to write.")],
    family: Annotated[str | None, typer.Option("--family", help="Only this family id.")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Only this model and the models it depends on.")] = None,
) -> None:
    """Export the lineage graph (families, directions, evidence) for Gephi, Graphviz, a browser or a slide."""
    from lineage_graph.export import FORMATS, lineage_graph, write_graph

    if fmt not in FORMATS:
        raise CommandError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if family is not None and model is not None:
        raise CommandError("--family and --model are alternatives; give one of them")
    with _open(db, read_only=True) as store:
        lineage = _stored(store, family)
    try:
        graph = lineage_graph(lineage, family=family, model=model)
    except KeyError as exc:  # an unknown family or model id
        raise CommandError(str(exc.args[0])) from exc
    try:
        written = write_graph(graph, fmt, out)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc}") from exc
    typer.echo(f"wrote {written} ({graph.number_of_nodes()} models, {graph.number_of_edges()} edges)")


def _stored(store: Store, family: str | None) -> Lineage:
    """The lineage the last rebuild stored (one family of it when asked), read back, not recomputed; recomputed in
    memory only for a database whose lineage was never built."""
    from lineage_graph.persist import read_lineage
    from lineage_graph.stored import family_lineage, hub_lineage

    if family is not None and (one := family_lineage(store, family)) is not None:
        return one
    return hub_lineage(store) or read_lineage(store)


def discrepancies_command(
    db: Db, as_json: Annotated[bool, typer.Option("--json", help="One JSON array instead of text.")] = False
) -> None:
    """Models whose card disagrees with their weights, most confident first; then the relations whose order is
    undecided, where no card is accused ("cannot tell")."""
    from lineage_graph.discrepancies import CANNOT_TELL

    with _open(db, read_only=True) as store:
        found = sorted(_stored(store, None).discrepancies,
                       key=lambda d: (d.kind == CANNOT_TELL, -d.confidence, d.model_id))
    if as_json:
        typer.echo(json_visible(json.dumps([{"model_id": d.model_id, "kind": d.kind, "related_model": d.related_model,
                                "confidence": d.confidence, "detail": d.detail, "evidence": d.evidence}
                               for d in found], indent=2, default=str)))
        return
    accused = [d for d in found if d.kind != CANNOT_TELL]
    for d in accused:
        typer.echo(terminal(f"{d.model_id:40s} {d.kind:31s} conf {d.confidence:.2f}  {d.detail}"))
    if not accused:
        typer.echo("no discrepancies")
    undecided = [d for d in found if d.kind == CANNOT_TELL]
    if undecided:
        typer.echo(f"\ncannot tell ({len(undecided)}): related, neither card declares the other, and which came "
                   "first is undecided, so no card is accused:")
        for d in undecided:
            typer.echo(terminal(f"{d.model_id:40s} {d.related_model or '':40s}  {d.detail}"))


def report_command(
    model_a: Annotated[str, typer.Argument(help="First model id.")],
    model_b: Annotated[str, typer.Argument(help="Second model id.")],
    db: Db,
    out: Annotated[Path, typer.Option("--out", help="Directory for report.md, report.html and the images.")],
) -> None:
    """An evidence report for one pair: verdict, per-block chart, block and unit maps, metadata, how to reproduce."""
    from lineage_graph.persist import read_lineage
    from lineage_graph.report import write_report
    from lineage_graph.stored import pair_lineage

    with _open(db, read_only=True) as store:
        try:  # the verdict the last rebuild stored; recomputed only for a pair it did not judge
            lineage = pair_lineage(store, *sorted((model_a, model_b))) or read_lineage(store)
            files = write_report(store, lineage, model_a, model_b, out, db)
        except KeyError as exc:  # an unknown model, or a pair with no current test
            raise CommandError(str(exc.args[0]) if exc.args else str(exc)) from exc
        except OSError as exc:
            raise CommandError(f"cannot write the report into {out}: {exc}") from exc
    typer.echo(f"wrote {files.markdown} and {files.html}")
