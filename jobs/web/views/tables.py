"""Every table and view of the database (``/tables``) and each one whole as CSV or JSON
(``/tables/NAME.csv``, ``/tables/NAME.json``), made on a download lane a few megabytes at a time and sent from a spool
file (jobs.web.downloads): a download holds a lane only while it is written, never while its client reads it, and a
third one written at once is asked to come back; a table once written is kept for its later downloads."""

from __future__ import annotations

import math
from contextlib import ExitStack

from flask import Blueprint, Response, abort, render_template

from jobs.web.bounds import download_gate, spool
from jobs.web.database import store
from jobs.web.downloads import Download, spooled
from scanner.store import queries
from scanner.store.store import AnswerStream

blueprint = Blueprint("tables", __name__)


@blueprint.get("/tables")
def page() -> str:
    return render_template("tables.html", tables=queries.tables(store()).rows(named=True))


@blueprint.get("/tables/<name>.<any(csv, json):fmt>")
def download(name: str, fmt: str) -> Response:
    """The table as a file, written on a download lane the first time it is asked for, and then kept (jobs.web.spool:
    the database cannot change while the server holds it)."""
    written = spool()
    kept = written.kept(("table", name, fmt))
    if kept is not None:
        return spooled(kept, fmt, f"{name}.{fmt}")
    downloads = download_gate()
    held = ExitStack()
    lane = held.enter_context(downloads.lane())
    def table_stream(as_text: bool) -> AnswerStream:
        return queries.table_batches(lane.store, name, as_text=as_text)

    try:  # a whole table: no time limit on reading it, and no byte cap but the table's own size
        body = Download(downloads, lane, held, table_stream, fmt, seconds=math.inf)
    except KeyError:
        abort(404, description=f"No table {name!r} in this database (the tables page lists them).")
    return body.response(f"{name}.{fmt}", written, keep=("table", name, fmt))
