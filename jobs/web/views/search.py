"""Finding a model by any part of its id (``/search?q=TEXT``); no text lists every model."""

from __future__ import annotations

from flask import Blueprint, render_template, request

from jobs.web.database import store
from jobs.web.paging import Page, asked_page
from scanner.store import queries

blueprint = Blueprint("search", __name__)
PER_PAGE = 50


@blueprint.get("/search")
def page() -> str:
    text = request.args.get("q", "").strip()
    number = asked_page()
    rows = queries.search_models(store(), text, limit=PER_PAGE, offset=(number - 1) * PER_PAGE).rows(named=True)
    total = rows[0]["total"] if rows else 0
    return render_template("search.html", search_text=text, rows=rows, page=Page(number, PER_PAGE, total))
