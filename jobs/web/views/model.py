"""A model's page (``/model?id=ID``): what its card says, its fingerprints, its relatives with p-values, closeness
and direction evidence, the discrepancies about it, its revisions and scan errors."""

from __future__ import annotations

from flask import Blueprint, abort, render_template, request

from jobs.web.database import store
from jobs.web.paging import Page, asked_page
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


PARENT_WORDS = {"tree": "its parent", "merge": "its second parent (merge)",
                "alternative": "perhaps its parent: the weights cannot tell it from the parent the tree shows"}
CHILD_WORDS = {"tree": "its child: derived from this model", "merge": "a merge of this model and another",
               "alternative": "perhaps its child: the weights cannot tell this model from the parent the tree shows"}
"""The other model of a dependent pair in words, by the kind of tree link the pair is (lineage_edges.tree_link)."""


def relation(row: dict) -> str:
    """How the other model of a dependent pair stands to this one, in words: the tree link where the pair is one,
    else the direction evidence."""
    other, link = row["model_id"], row["tree_link"]
    if link == "copy":
        return "copy: the same function (which is the original, the weights cannot say)"
    if row["parent"] is not None and not row["direction_decided"]:
        older = "it" if row["parent"] == other else "this model"
        return (f"related; which came first is undecided (the evidence leans towards {older} being the older, "
                "not enough to claim it)")
    if row["parent"] == other:
        return PARENT_WORDS.get(link, "a relative this model likely derives from (not its direct parent in the tree)")
    if row["child"] == other:
        return CHILD_WORDS.get(link, "a relative likely derived from this model (not its direct child in the tree)")
    return "related; which came first is undetermined"
