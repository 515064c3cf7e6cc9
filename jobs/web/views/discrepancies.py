"""Every discrepancy (a card that disagrees with the weights), most confident first, paged."""

from __future__ import annotations

from flask import Blueprint, render_template

from jobs.web.database import store
from jobs.web.paging import Page, asked_page
from scanner.store import queries

blueprint = Blueprint("discrepancies", __name__)
PER_PAGE = 100


@blueprint.get("/discrepancies")
def page() -> str:
    number = asked_page()
    rows = queries.discrepancies_page(store(), limit=PER_PAGE, offset=(number - 1) * PER_PAGE).rows(named=True)
    total = rows[0]["total"] if rows else queries.overview(store())["discrepancies"]
    return render_template("discrepancies.html", rows=rows, page=Page(number, PER_PAGE, total))
