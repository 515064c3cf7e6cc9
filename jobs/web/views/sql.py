"""The SQL box (``/sql?q=STATEMENT``, and ``/sql.csv`` / ``/sql.json`` for the answer): one statement through
`queries.read_only_query`, the sealed path `hubtrace query` takes: DuckDB's parser admits only a statement that
reads and calls no function that acts, on a connection that reaches no file but the database, and every statement
runs within the bounds of jobs.web.bounds (a slot, a time limit, its client still there, a row cap on downloads)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack

import duckdb
import polars as pl
from flask import Blueprint, Response, abort, render_template, request, stream_with_context

from jobs.exports import csv_chunks, json_chunks
from jobs.web.bounds import Lane, QueryStopped, SqlGate, gate
from scanner.errors import without_sql_excerpt
from scanner.store import Store, StoreError, queries

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
    frame, error, stopped = None, None, False
    if sql.strip():
        sql_gate = gate()
        try:
            with sql_gate.lane() as lane:
                frame = sql_gate.run(lane, lambda: answer(lane.store, sql, limit=ROWS_SHOWN + 1),
                                     lane.store.connection.interrupt)
        except REFUSALS as exc:
            error, stopped = message(exc), isinstance(exc, QueryStopped)
    return render_template("sql.html", sql=sql, frame=frame, rows=frame.head(ROWS_SHOWN).rows() if frame is not None
                           else [], error=error, stopped=stopped, examples=EXAMPLES, rows_shown=ROWS_SHOWN,
                           limits=gate().limits), 400 if error else 200


@blueprint.get("/sql.<any(csv, json):fmt>")
def download(fmt: str) -> Response:
    """The answer, up to the row cap, streamed: one slot held and the time limit counted while DuckDB works on a
    batch (not while the client reads it), and the statement interrupted if the client goes away."""
    sql = request.args.get("q", "")
    sql_gate = gate()
    held = ExitStack()
    lane = held.enter_context(sql_gate.lane())
    try:
        frames = _Frames(sql, sql_gate, lane)
    except REFUSALS as exc:
        held.close()
        abort(400, description=message(exc))
    except BaseException:
        held.close()
        raise
    chunks = csv_chunks if fmt == "csv" else json_chunks
    return Response(stream_with_context(chunks(frames.streamed(held))),
                    mimetype="text/csv" if fmt == "csv" else "application/json",
                    headers={"Content-Disposition": f'attachment; filename="query.{fmt}"',
                             "X-Hubtrace-Row-Cap": str(sql_gate.limits.download_rows)})


class _Frames:
    """A download's frames, each read on the request's lane: the first before the response starts (so a refusal
    is still a 400, and values polars cannot hold make the whole answer text, as the page does), the rest as the
    client takes them, DuckDB's time on each counted against the statement's limit."""

    def __init__(self, sql: str, sql_gate: SqlGate, lane: Lane) -> None:
        self.gate, self.lane, self.seconds_left = sql_gate, lane, sql_gate.limits.query_seconds
        try:
            self._open(sql, as_text=False)
        except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
            self._open(sql, as_text=True)

    def _open(self, sql: str, *, as_text: bool) -> None:
        self.stream = queries.read_only_stream(self.lane.store, sql, as_text=as_text,
                                               limit=self.gate.limits.download_rows, batch_rows=EXPORT_ROWS)
        self._frames = iter(self.stream)
        try:
            self.first = self._next()
        except BaseException:
            self.stream.close()
            raise

    def _next(self) -> pl.DataFrame | None:
        """The next frame (None after the last)."""
        started = time.monotonic()
        try:
            return self.gate.run(self.lane, lambda: next(self._frames, None), self.stream.interrupt,
                                 max(self.seconds_left, 0.0))
        finally:
            self.seconds_left -= time.monotonic() - started

    def streamed(self, held: ExitStack) -> Iterator[pl.DataFrame]:
        """Every frame; the lane (``held``) and the cursor released however the response ends. A statement stopped
        midway ends the response early: the file is then visibly cut, as a failed download."""
        try:
            frame = self.first
            while frame is not None:
                yield frame
                frame = self._next()
        finally:
            self.stream.close()
            held.close()


def answer(reader: Store, sql: str, limit: int | None = None) -> pl.DataFrame:
    """The statement's answer (its first ``limit`` rows), as `hubtrace query` gets it: values polars cannot hold
    come as text."""
    try:
        return queries.read_only_query(reader, sql, limit=limit)
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException):
        return queries.read_only_query(reader, sql, as_text=True, limit=limit)


def message(error: Exception) -> str:
    """The refusal on one line, without DuckDB's ``LINE 1: ... ^`` excerpt."""
    text = without_sql_excerpt(error)
    return text if isinstance(error, StoreError | QueryStopped) else f"SQL: {text}"
