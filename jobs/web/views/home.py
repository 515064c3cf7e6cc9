"""The front page: what the database holds, its families largest first (paged), the most confident discrepancies."""

from __future__ import annotations

from flask import Blueprint, render_template

from jobs.web.database import store
from jobs.web.paging import Page, asked_page
from scanner.store import queries

blueprint = Blueprint("home", __name__)
FAMILIES_PER_PAGE = 50
DISCREPANCIES_SHOWN = 10


@blueprint.get("/")
def page() -> str:
    reader = store()
    overview = queries.overview(reader)
    families = Page(asked_page(), FAMILIES_PER_PAGE, overview["families"])
    return render_template(
        "home.html", overview=overview, page=families,
        families=queries.families_page(reader, limit=families.size, offset=families.offset).rows(named=True),
        discrepancies=queries.discrepancies_page(reader, limit=DISCREPANCIES_SHOWN).rows(named=True))
