"""A pair's page (``/pair?a=A&b=B``): the evidence report `hubtrace report A B` writes, or, before a lineage
rebuild has judged the pair, its stored tests with their p-values."""

from __future__ import annotations

from flask import Blueprint, abort, current_app, render_template, request

from jobs.web.database import EXTENSION, store
from jobs.web.evidence import report_body
from scanner.store import queries

blueprint = Blueprint("pair", __name__)


@blueprint.get("/pair")
def page() -> str:
    first, second = sorted((request.args.get("a", ""), request.args.get("b", "")))
    body = report_body(current_app.extensions[EXTENSION].path, first, second)
    tests = [] if body is not None else queries.pair_tests_between(store(), first, second).rows(named=True)
    if body is None and not tests:
        abort(404, description=f"No test of the pair {first!r} and {second!r} in this database.")
    return render_template("pair.html", first=first, second=second, body=body, tests=tests)
