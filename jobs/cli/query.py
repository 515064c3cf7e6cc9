"""`hubtrace query`: the investigators' questions of a scan database (scanner.store.queries), or one read-only SQL
statement (scanner.store.queries.read_only_query), answered as a table, CSV or JSON, with no `duckdb` CLI needed
(the Python package does not install one).

The file is opened read-only, so queries run beside other readers but not while a scan holds it. DuckDB's
read-only mode still lets a statement write files (``COPY ... TO``, ``EXPORT DATABASE``, ``EXPLAIN ANALYZE``) or
read them, so only queries run (scanner.store.read_only_sql) on a connection that reaches no other file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from jobs.cli.refusals import CommandError
from scanner.errors import without_sql_excerpt
from scanner.text_safety import terminal, terminal_lines

if TYPE_CHECKING:
    import polars as pl

    from scanner.store import Store

FORMATS = ("table", "csv", "json")
DEFAULT_LIMIT = 100_000
"""Rows an answer carries unless --limit says otherwise: a statement of millions of rows would take gigabytes."""
TABLE_STR_CHARS = 200
"""Longer text cells end in an ellipsis in a table (whole error reasons and details fit); csv and json are never cut."""


def query_command(
    db: Annotated[Path, typer.Option("--db", help="The scan's DuckDB file.")],
    sql: Annotated[str | None, typer.Argument(
        help="One read-only SQL statement, e.g. \"SELECT * FROM current_pair_tests ORDER BY log10_p\".")] = None,
    derives_from: Annotated[str | None, typer.Option(
        "--derives-from", metavar="ID", help="Every model below ID in its family tree (lineage tables).")] = None,
    depends_on: Annotated[str | None, typer.Option(
        "--depends-on", metavar="ID",
        help="Models whose current pair test with ID is at or below --log10-p-below (either direction).")] = None,
    claims_no_parent: Annotated[bool, typer.Option(
        "--claims-no-parent", help="Models that declare no base (or claim from-scratch) yet depend on another.")
    ] = False,
    changes: Annotated[bool, typer.Option(
        "--changes", help="What a run (--run, default the latest) changed: models, revisions, dependences, errors.")
    ] = False,
    errors: Annotated[bool, typer.Option(
        "--errors", help="The errors of a run (--run, default the latest), each marked new or seen before.")] = False,
    runs: Annotated[bool, typer.Option("--runs", help="Every scan run, newest first, with its counts.")] = False,
    similar: Annotated[str | None, typer.Option(
        "--similar", metavar="ID",
        help="ID's nearest models by candidate-retrieval score (the index beside the database); tests nothing.")
    ] = None,
    run: Annotated[str | None, typer.Option(
        "--run", metavar="RUN_ID", help="The run for --changes or --errors (ids: --runs).")] = None,
    log10_p_below: Annotated[float | None, typer.Option(
        "--log10-p-below", help="log10 p at or below which a pair test counts as dependence, for --depends-on, "
                                "--claims-no-parent and --changes (default: DEFAULT_LOG10_P of scanner.store.queries).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | csv | json (an array of row objects)")] = "table",
    out: Annotated[Path | None, typer.Option("--out", help="Write the answer to this file instead.")] = None,
    limit: Annotated[int, typer.Option(
        "--limit", min=0, help="Rows of the answer at most (0: all of them); a cut answer says so on stderr.")
    ] = DEFAULT_LIMIT,
    allow_local_files: Annotated[bool, typer.Option(
        "--allow-local-files", help="Let SQL read local files (read_csv, read_parquet, ...); off by default, so a "
                                    "query reaches nothing but the database.")] = False,
) -> None:
    """Answer one question from a scan database: one read-only SQL statement, or exactly one preset."""
    import duckdb
    import polars as pl

    from scanner.store import Store, StoreError, queries

    threshold = queries.DEFAULT_LOG10_P if log10_p_below is None else log10_p_below
    asked_rows = limit + 1 if limit else None  # one more than shown: whether there are more
    presets = {  # the question: (asked, how the store answers it)
        "SQL": (sql is not None, lambda store: queries.read_only_query(store, sql, limit=asked_rows)),
        "--derives-from": (derives_from is not None, lambda store: queries.derives_from(store, derives_from)),
        "--depends-on": (depends_on is not None,
                         lambda store: queries.dependent_on(store, depends_on, log10_p_below=threshold)),
        "--claims-no-parent": (claims_no_parent,
                               lambda store: queries.claims_no_parent_but_depends(store, log10_p_below=threshold)),
        "--changes": (changes, lambda store: queries.run_changes(store, run, log10_p_below=threshold)),
        "--errors": (errors, lambda store: queries.run_errors(store, run)),
        "--runs": (runs, queries.runs),
        "--similar": (similar is not None, lambda store: _similar(store, db, similar)),
    }
    asked = [name for name, (given, _) in presets.items() if given]
    if len(asked) != 1:
        raise CommandError(f"give exactly one of SQL or a preset ({', '.join(list(presets)[1:])}); got "
              f"{' and '.join(asked) or 'none'}")
    if run is not None and asked[0] not in ("--changes", "--errors"):
        raise CommandError("--run goes with --changes or --errors")
    if fmt not in FORMATS:
        raise CommandError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    try:
        with Store(db, read_only=True, allow_local_files=allow_local_files) as store:
            if run is not None and run not in queries.runs(store)["run_id"]:
                raise StoreError(f"no scan run {run!r} in {db} (--runs lists them)")
            try:
                frame = _cut(presets[asked[0]][1](store), limit)
                text = _render(frame, fmt)
            except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
                if asked[0] != "SQL":
                    raise
                # values polars cannot hold or show (a date past year 262143, VARINT, VARIANT): every column as text
                frame = _cut(queries.read_only_query(store, sql, as_text=True, limit=asked_rows), limit)
                text = _render(frame, fmt)
                typer.echo("hubtrace: note: some values have no table type here (out-of-range dates, VARINT, "
                           "VARIANT, ...), so every column is shown as text", err=True)
    except StoreError as exc:
        raise CommandError(without_sql_excerpt(exc)) from exc
    except duckdb.Error as exc:
        raise CommandError(f"SQL: {without_sql_excerpt(exc)}") from exc
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as exc:
        raise CommandError("cannot turn the answer into a table (cast the column, e.g. ::VARCHAR): "
                           f"{without_sql_excerpt(exc)}") from exc
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text, encoding="utf-8", newline="")
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from exc
    typer.echo(f"wrote {out} ({frame.height} rows)")


def _cut(frame: pl.DataFrame, limit: int) -> pl.DataFrame:
    """The first ``limit`` rows (0: all), saying on stderr when there were more."""
    if not limit or frame.height <= limit:
        return frame
    typer.echo(f"hubtrace: note: the answer has more than {limit:,} rows; these are the first {limit:,} "
               "(--limit N for more, --limit 0 for all)", err=True)
    return frame.head(limit)


def _similar(store: Store, db: Path, model_id: str) -> pl.DataFrame:
    from scanner.retrieval.scan import similar as similar_models

    return similar_models(store, db, model_id)


def _render(frame: pl.DataFrame, fmt: str) -> str:
    """The frame as text ending in a line break: a table with every row and column, CSV (nested values as JSON
    text; CRLF line ends, RFC 4180) or a JSON array."""
    import polars as pl

    if fmt in ("csv", "json"):  # the writers `hubtrace serve` downloads with: the same cells either way
        from jobs.exports import csv_chunks, json_chunks

        return "".join((csv_chunks if fmt == "csv" else json_chunks)([frame]))
    frame = _text_cells(frame, terminal)  # hub text cannot move the cursor, recolour or reorder the table
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=-1, fmt_str_lengths=TABLE_STR_CHARS,
                   fmt_table_cell_list_len=-1):
        return terminal_lines(str(frame)) + "\n"  # and nothing in a type not handled above reaches the terminal raw


def _text_cells(frame: pl.DataFrame, escape: Callable[[str], str]) -> pl.DataFrame:
    """The frame with escape applied to every text cell and every text inside a nested cell (lists, arrays,
    structs, maps, at any depth; a map's keys too); other values as they are."""
    import polars as pl

    return frame.with_columns(
        [pl.col(n).map_elements(escape, return_dtype=pl.String) for n, t in frame.schema.items() if t == pl.String]
        + [pl.Series(n, [_escaped(v, t, escape) for v in frame[n].to_list()], dtype=t)
           for n, t in frame.schema.items() if t.is_nested() and _holds_text(t)])


def _holds_text(dtype: pl.DataType) -> bool:
    import polars as pl

    if dtype == pl.String:
        return True
    if isinstance(dtype, pl.Struct):
        return any(_holds_text(f.dtype) for f in dtype.fields)
    if isinstance(dtype, pl.Map):
        return _holds_text(dtype.key) or _holds_text(dtype.value)
    return isinstance(dtype, pl.List | pl.Array) and _holds_text(dtype.inner)


def _escaped(value: Any, dtype: pl.DataType, escape: Callable[[str], str]) -> Any:
    """One cell's Python value with escape applied to each text in it, led by its type (a struct's field names
    come from the query, a map's keys from the data)."""
    import polars as pl

    if value is None:
        return None
    if dtype == pl.String:
        return escape(value)
    if isinstance(dtype, pl.Struct):
        return {f.name: _escaped(value[f.name], f.dtype, escape) for f in dtype.fields}
    if isinstance(dtype, pl.Map):
        return {_escaped(k, dtype.key, escape): _escaped(v, dtype.value, escape) for k, v in value.items()}
    if isinstance(dtype, pl.List | pl.Array):
        return [_escaped(v, dtype.inner, escape) for v in value]
    return value
