"""The SQL box (``/sql?q=STATEMENT``, and ``/sql.csv`` / ``/sql.json`` for the answer): one statement through
`queries.read_only_query`, the sealed path `hubtrace query` takes: DuckDB's parser admits only a statement that
reads and calls no function that acts, on a connection that reaches no file but the database, and every statement
runs within the bounds of jobs.web.bounds (a slot, a time limit, its client still there, a row cap on downloads)."""

from __future__ import annotations

from contextlib import ExitStack

import duckdb
from flask import Blueprint, Response, abort, render_template, request

from jobs.web.bounds import QueryStopped, gate
from jobs.web.downloads import RENDERING_ERRORS, Download
from scanner.errors import without_sql_excerpt
from scanner.store import Store, StoreError, queries
from scanner.store.store import AnswerStream, private_folders_hidden

blueprint = Blueprint("sql", __name__)
ROWS_SHOWN = 500
"""Rows of an answer shown on the page (it reads one more, to say whether there are more); the downloads carry up
to the app's row cap."""
EXPORT_ROWS = 10_000
"""Rows a download reads and sends at a time."""
EXAMPLES = (
    ("Models whose card claims training from scratch",
     "SELECT model_id, license, declared_base_models FROM current_models WHERE claims_from_scratch"),
    ("The strongest dependences", "SELECT model_a, model_b, log10_p, parent, child FROM lineage_edges "
                                  "WHERE dependent ORDER BY log10_p LIMIT 50"),
    ("Discrepancies by kind", "SELECT kind, count(*) AS n FROM discrepancies GROUP BY kind ORDER BY n DESC"),
    ("Licences in the database", "SELECT license, count(*) AS n FROM current_models GROUP BY license ORDER BY n DESC"),
)
REFUSALS = (StoreError, duckdb.Error, QueryStopped)
"""What a statement may end in that the page states as its answer: refused, failed in DuckDB, or stopped."""


@blueprint.get("/sql")
def page() -> tuple[str, int]:
    sql = request.args.get("q", "")
    columns, rows, error, stopped = None, [], None, False
    if sql.strip():
        sql_gate = gate()
        try:
            with sql_gate.lane() as lane:
                columns, rows = sql_gate.run(lane, lambda: answer(lane.store, sql, limit=ROWS_SHOWN + 1),
                                             lane.store.connection.interrupt)
        except REFUSALS as exc:
            error, stopped = message(exc), isinstance(exc, QueryStopped)
    return render_template("sql.html", sql=sql, columns=columns, rows=rows[:ROWS_SHOWN], more=len(rows) > ROWS_SHOWN,
                           error=error, stopped=stopped, examples=EXAMPLES, rows_shown=ROWS_SHOWN,
                           limits=gate().limits), 400 if error else 200


@blueprint.get("/sql.<any(csv, json):fmt>")
def download(fmt: str) -> Response:
    """The answer, up to the row and byte caps, streamed: one slot held and the time limit counted while DuckDB works
    on a batch (not while the client reads it), and the statement interrupted if the client goes away."""
    sql = request.args.get("q", "")
    sql_gate = gate()
    limits = sql_gate.limits
    held = ExitStack()
    lane = held.enter_context(sql_gate.lane())
    def answer_stream(as_text: bool) -> AnswerStream:
        return queries.read_only_stream(lane.store, sql, as_text=as_text, limit=limits.download_rows,
                                        batch_rows=EXPORT_ROWS)

    try:
        body = Download(sql_gate, lane, held, answer_stream, fmt, max_bytes=limits.download_bytes)
    except REFUSALS as exc:
        abort(400, description=message(exc))
    return body.response(f"query.{fmt}", {"X-Hubtrace-Row-Cap": str(limits.download_rows),
                                          "X-Hubtrace-Byte-Cap": str(limits.download_bytes)})


def answer(reader: Store, sql: str, limit: int | None = None) -> tuple[list[str], list[tuple]]:
    """The statement's columns and rows (its first ``limit``), as `hubtrace query` gets them: when some values
    polars cannot hold or turn into Python values (a date past year 9999), every column as DuckDB's text."""
    try:
        frame = queries.read_only_query(reader, sql, limit=limit)
        return frame.columns, frame.rows()
    except RENDERING_ERRORS:
        frame = queries.read_only_query(reader, sql, as_text=True, limit=limit)
        return frame.columns, frame.rows()


def message(error: Exception) -> str:
    """The refusal on one line, without DuckDB's ``LINE 1: ... ^`` excerpt, and without the server's own folders (its
    home directory, DuckDB's temporary folder), which DuckDB names in some errors (``duckdb_extensions()``)."""
    text = without_sql_excerpt(error)
    return private_folders_hidden(text if isinstance(error, StoreError | QueryStopped) else f"SQL: {text}")
