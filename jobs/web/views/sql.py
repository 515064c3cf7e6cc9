"""The SQL box (``/sql?q=STATEMENT``, and ``/sql.csv`` / ``/sql.json`` for the answer): one statement through
`queries.read_only_stream`, the sealed path `hubtrace query` takes: DuckDB's parser admits only a statement that
reads and calls no function that acts, on a connection that reaches no file but the database, and every statement
runs within the bounds of jobs.web.bounds (a lane's process of bounded memory, a time limit, its client still there,
row and byte caps)."""

from __future__ import annotations

from contextlib import ExitStack, closing

import polars as pl
from flask import Blueprint, Response, abort, render_template, request

from jobs.web.bounds import Gate, QueryStopped, StatementLane, gate, spool
from jobs.web.downloads import RENDERING_ERRORS, Download
from jobs.web.statement_process import MESSAGE_BYTES, ProcessAnswer, Refused

blueprint = Blueprint("sql", __name__)
ROWS_SHOWN = 500
"""Rows of an answer shown on the page (it reads one more, to say whether there are more); the downloads carry up
to the app's row cap."""
PAGE_BYTES = MESSAGE_BYTES
"""The most bytes of an answer (as Arrow holds them) the page reads: its rows end before the one that passes them."""
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
DOWNLOADS_BUSY = ("The SQL box's downloads are using every lane left to them (one is kept for the statements of "
                  "this page); try again in a moment.")
REFUSALS = (Refused, QueryStopped)
"""What a statement may end in that the page states as its answer: refused, failed in DuckDB, too large, or
stopped."""


@blueprint.get("/sql")
def page() -> tuple[str, int]:
    sql = request.args.get("q", "")
    columns, rows, cut, error, stopped = None, [], False, None, False
    if sql.strip():
        sql_gate = gate()
        try:
            with sql_gate.lane() as lane:
                columns, rows, cut = answer(sql_gate, lane, sql)
        except REFUSALS as exc:
            error, stopped = str(exc), isinstance(exc, QueryStopped)
    return render_template("sql.html", sql=sql, columns=columns, rows=rows[:ROWS_SHOWN], more=len(rows) > ROWS_SHOWN,
                           cut=cut, error=error, stopped=stopped, examples=EXAMPLES, rows_shown=ROWS_SHOWN,
                           page_mb=PAGE_BYTES >> 20, limits=gate().limits), 400 if error else 200


@blueprint.get("/sql.<any(csv, json):fmt>")
def download(fmt: str) -> Response:
    """The answer, up to the row and byte caps, written to a spool file and sent from there: a lane held and the time
    limit counted while DuckDB works on a batch, the lane free before the client reads a byte, and the statement
    stopped if the client goes away meanwhile."""
    sql = request.args.get("q", "")
    sql_gate = gate()
    limits = sql_gate.limits
    held = ExitStack()  # the last lane is kept for the statements of the page, however many downloads are asked for
    lane = held.enter_context(sql_gate.lane(download=True, busy=DOWNLOADS_BUSY))
    def answer_stream(as_text: bool) -> ProcessAnswer:
        return lane.process.answer(sql, as_text=as_text, limit=limits.download_rows, batch_rows=EXPORT_ROWS)

    try:
        body = Download(sql_gate, lane, held, answer_stream, fmt, max_bytes=limits.download_bytes)
        return body.response(f"query.{fmt}", spool(), {"X-Hubtrace-Row-Cap": str(limits.download_rows),
                                                       "X-Hubtrace-Byte-Cap": str(limits.download_bytes)})
    except REFUSALS as exc:
        abort(400, description=str(exc))


def answer(sql_gate: Gate, lane: StatementLane, sql: str) -> tuple[list[str], list[tuple], bool]:
    """The statement's columns and rows (the first `ROWS_SHOWN` and one more, within `PAGE_BYTES`), and whether the
    bytes cut them, as `hubtrace query` gets them: when some values polars cannot hold or turn into Python values (a
    date past year 9999), every column as DuckDB's text."""
    try:
        return _answer(sql_gate, lane, sql, as_text=False)
    except RENDERING_ERRORS:
        return _answer(sql_gate, lane, sql, as_text=True)


def _answer(sql_gate: Gate, lane: StatementLane, sql: str, *, as_text: bool) -> tuple[list[str], list[tuple], bool]:
    """One try, read under the watchdog (the lane's process made ready before, outside its time)."""
    stream = lane.run(lambda: lane.process.answer(sql, as_text=as_text, limit=ROWS_SHOWN + 1,
                                                  batch_rows=ROWS_SHOWN + 1, max_bytes=PAGE_BYTES))
    with closing(stream):
        frame = pl.concat(sql_gate.run(lane, lambda: list(stream), stream.interrupt))
        return frame.columns, frame.rows(), stream.cut
