"""The SQL box (``/sql?q=STATEMENT``, and ``/sql.csv`` / ``/sql.json`` for the whole answer): one statement through
`queries.read_only_query`, the sealed path `hubtrace query` takes: DuckDB's parser admits only a statement that
reads, on a connection that reaches no file but the database."""

from __future__ import annotations

import duckdb
import polars as pl
from flask import Blueprint, Response, abort, render_template, request

from jobs.exports import csv_chunks, json_chunks
from jobs.web.database import store
from scanner.errors import without_sql_excerpt
from scanner.store import StoreError, queries

blueprint = Blueprint("sql", __name__)
ROWS_SHOWN = 500
"""Rows of an answer shown on the page (it reads one more, to say whether there are more); the downloads carry all
of them."""
EXPORT_ROWS = 10_000
EXAMPLES = (
    ("Models whose card claims training from scratch",
     "SELECT model_id, license, declared_base_models FROM current_models WHERE claims_from_scratch"),
    ("The strongest dependences", "SELECT model_a, model_b, log10_p, parent, child FROM lineage_edges "
                                  "WHERE dependent ORDER BY log10_p LIMIT 50"),
    ("Discrepancies by kind", "SELECT kind, count(*) AS n FROM discrepancies GROUP BY kind ORDER BY n DESC"),
    ("Licences in the database", "SELECT license, count(*) AS n FROM current_models GROUP BY license ORDER BY n DESC"),
)


@blueprint.get("/sql")
def page() -> tuple[str, int]:
    sql = request.args.get("q", "")
    frame, error = None, None
    if sql.strip():
        try:
            frame = answer(sql, limit=ROWS_SHOWN + 1)
        except (StoreError, duckdb.Error) as exc:
            error = message(exc)
    return render_template("sql.html", sql=sql, frame=frame, rows=frame.head(ROWS_SHOWN).rows() if frame is not None
                           else [], error=error, examples=EXAMPLES, rows_shown=ROWS_SHOWN), 400 if error else 200


@blueprint.get("/sql.<any(csv, json):fmt>")
def download(fmt: str) -> Response:
    sql = request.args.get("q", "")
    try:
        frame = answer(sql)
    except (StoreError, duckdb.Error) as exc:
        abort(400, description=message(exc))
    chunks = csv_chunks if fmt == "csv" else json_chunks
    slices = frame.iter_slices(EXPORT_ROWS) if frame.height else [frame]  # an empty answer still has its header
    return Response(chunks(slices), mimetype="text/csv" if fmt == "csv" else
                    "application/json", headers={"Content-Disposition": f'attachment; filename="query.{fmt}"'})


def answer(sql: str, limit: int | None = None) -> pl.DataFrame:
    """The statement's answer (its first ``limit`` rows), as `hubtrace query` gets it: values polars cannot hold
    come as text."""
    try:
        return queries.read_only_query(store(), sql, limit=limit)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
        return queries.read_only_query(store(), sql, as_text=True, limit=limit)


def message(error: Exception) -> str:
    """The refusal on one line, without DuckDB's ``LINE 1: ... ^`` excerpt."""
    text = without_sql_excerpt(error)
    return text if isinstance(error, StoreError) else f"SQL: {text}"
