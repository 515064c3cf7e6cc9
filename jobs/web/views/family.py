"""A family (``/family?id=ID``): its tree drawn when it is small enough to read, and always as an outline (each
member under its parent, with the link's p-value and direction confidence), searchable and paged, so a family of
thousands stays usable. ``/family/graph?id=ID`` is `hubtrace graph --format html`'s interactive page for it."""

from __future__ import annotations

from collections.abc import Iterator

from flask import Blueprint, Response, abort, render_template, request

from jobs.web.database import store
from jobs.web.drawing import BOX_H, BOX_W, family_drawing
from jobs.web.paging import Page, asked_page
from lineage_graph.export import lineage_graph, tree_layout
from lineage_graph.html_page import render_html
from lineage_graph.link_styles import LINK_STYLES
from lineage_graph.stored import family_lineage
from scanner.store import queries

blueprint = Blueprint("family", __name__)
DRAWN_MEMBERS = 60
"""Families up to this size are drawn on their page; larger ones are read in the outline (and the offline page)."""
ROWS_PER_PAGE = 200
GRAPH_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; base-uri 'none'; "
             "form-action 'none'; frame-ancestors 'none'")
"""The offline page's own script and style are inline; its data sits in a JSON script element, escaped."""


@blueprint.get("/family")
def page() -> str:
    family_id = request.args.get("id", "")
    reader = store()
    family = queries.family(reader, family_id)
    if family is None:
        abort(404, description=f"No family {family_id!r} in this database (run `hubtrace lineage` to build them).")
    members = queries.family_members(reader, family_id).rows(named=True)
    rows = list(outline(members, family["root"]))
    text = request.args.get("q", "").strip()
    if text:
        rows = [r for r in rows if text.lower() in r["model_id"].lower()]
    shown = Page(asked_page(), ROWS_PER_PAGE, len(rows))
    drawing = None
    if len(members) <= DRAWN_MEMBERS:
        drawing = family_drawing(lineage_graph(family_lineage(reader, family_id), family=family_id))
    return render_template("family.html", family=family, rows=rows[shown.offset:shown.offset + shown.size],
                           page=shown, member_text=text, drawing=drawing, drawn_members=DRAWN_MEMBERS,
                           link_styles=LINK_STYLES, box_w=BOX_W, box_h=BOX_H)


@blueprint.get("/family/graph")
def graph() -> Response:
    family_id = request.args.get("id", "")
    lineage = family_lineage(store(), family_id)
    if lineage is None:
        abort(404, description=f"No family {family_id!r} in this database.")
    drawn = lineage_graph(lineage, family=family_id)
    page = render_html(drawn, tree_layout(drawn), title=f"hubtrace family {family_id}")
    return Response(page, mimetype="text/html", headers={"Content-Security-Policy": GRAPH_CSP})


def outline(members: list[dict], root: str) -> Iterator[dict]:
    """The members depth first from the root, children by id, each with its ``depth``; a member the tree does not
    reach (none, in a rebuilt lineage) follows at depth 0."""
    children: dict[str, list[dict]] = {}
    for member in members:
        parents = member["parents"] or []
        children.setdefault(parents[0] if parents else "", []).append(member)
    seen: set[str] = set()
    tops = sorted(children.get("", []), key=lambda m: (m["model_id"] != root, m["model_id"]))
    stack = [(m, 0) for m in reversed(tops)]
    while stack:
        member, depth = stack.pop()
        if member["model_id"] in seen:
            continue
        seen.add(member["model_id"])
        yield dict(member, depth=depth)
        stack += [(c, depth + 1) for c in reversed(children.get(member["model_id"], []))]
    yield from (dict(m, depth=0) for m in members if m["model_id"] not in seen)
