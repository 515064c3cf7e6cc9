"""A model's page (``/model?id=ID``): what its card says, its fingerprints, its relatives with p-values, closeness
and direction evidence, the discrepancies about it, its revisions and scan errors."""

from __future__ import annotations

from flask import Blueprint, abort, render_template, request

from jobs.web.database import store
from jobs.web.paging import Page, asked_page
from lineage_graph.kinship import LINK_KINSHIP, describe
from scanner.store import queries

blueprint = Blueprint("model", __name__)
RELATIVES_PER_PAGE = 100
"""Relatives a page lists, strongest first (a base model of the hub can have thousands)."""
UNRELATED_SHOWN = 200
"""Pairs tested without dependence listed on the page (the SQL box answers for the rest)."""


@blueprint.get("/model")
def page() -> str:
    model_id = request.args.get("id", "")
    reader = store()
    card = queries.current_model_rows(reader, [model_id]).get(model_id)
    errors = queries.model_errors(reader, model_id).rows(named=True)
    if card is None and not errors:
        abort(404, description=f"No model {model_id!r} in this database. Search for part of its id instead.")
    relatives = queries.model_relatives(reader, model_id).rows(named=True)
    dependent = [r for r in relatives if r["dependent"]]
    shown = Page(asked_page(), RELATIVES_PER_PAGE, len(dependent))
    related = [dict(r, relation=relation(r)) for r in dependent[shown.offset:shown.offset + shown.size]]
    unrelated = [r for r in relatives if not r["dependent"]]
    return render_template(
        "model.html", model_id=model_id, card=card, errors=errors, related=related, page=shown,
        unrelated=unrelated[:UNRELATED_SHOWN], unrelated_total=len(unrelated),
        raw_tests=[] if relatives else queries.model_pair_tests(reader, model_id).rows(named=True),
        family=queries.model_family(reader, model_id),
        fingerprints=queries.model_fingerprints(reader, model_id).rows(named=True),
        discrepancies=queries.model_discrepancies(reader, model_id).rows(named=True),
        revisions=queries.revision_history(reader, [model_id]).rows(named=True))


def relation(row: dict) -> str:
    """How the other model of a dependent pair stands to this one, in words (lineage_graph.kinship): its kinship in
    the family tree and the direction stored for it; a lineage built before kinships were stored reads as the
    tree link the pair is, else the direction evidence."""
    kinship = row.get("kinship") or LINK_KINSHIP.get(row["tree_link"] or "")
    return describe(kinship, row["model_id"], row["parent"], row["child"], bool(row["direction_decided"]))
