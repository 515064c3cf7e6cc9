"""Every table and view of the database (``/tables``) and each one whole as CSV or JSON
(``/tables/NAME.csv``, ``/tables/NAME.json``), streamed a batch of rows at a time."""

from __future__ import annotations

from flask import Blueprint, Response, abort, render_template

from jobs.exports import csv_chunks, json_chunks
from jobs.web.database import store
from scanner.store import queries

blueprint = Blueprint("tables", __name__)


@blueprint.get("/tables")
def page() -> str:
    return render_template("tables.html", tables=queries.tables(store()).rows(named=True))


@blueprint.get("/tables/<name>.<any(csv, json):fmt>")
def download(name: str, fmt: str) -> Response:
    try:
        batches = queries.table_batches(store(), name)
    except KeyError:
        abort(404, description=f"No table {name!r} in this database (the tables page lists them).")
    chunks = csv_chunks if fmt == "csv" else json_chunks
    return Response(chunks(batches), mimetype="text/csv" if fmt == "csv" else "application/json",
                    headers={"Content-Disposition": f'attachment; filename="{name}.{fmt}"'})
