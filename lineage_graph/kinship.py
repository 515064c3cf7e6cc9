"""How two models of one family tree stand to each other, in words: a link of the tree, an ancestor along decided
links, siblings and cousins (neither derives from the other), or relatives whose order an undecided link leaves
open. One table, so the model page, the evidence report and the presets say the same thing."""

from __future__ import annotations

LINK_KINSHIP = {"tree": "parent", "merge": "merge_parent", "alternative": "alternative_parent", "copy": "copy"}
"""The kinship (``Edge.kinship``, ``lineage_edges.kinship``) of a pair that is itself a link of the tree."""
KINSHIPS = (*LINK_KINSHIP.values(), "ancestor", "sibling", "cousin", "relative")
"""Every kinship: a link of the tree (above), an ancestor along decided links, siblings (one parent, both links
decided), cousins (a nearer common ancestor, every link between them decided), or relatives (an undecided link
between them leaves their order unknown)."""
ON_ONE_LINE = frozenset({"parent", "merge_parent", "alternative_parent", "ancestor"})
"""Kinships where one model derives from the other (when the direction is claimed)."""

_UP = {"parent": "its parent", "merge_parent": "its second parent (merge)",
       "alternative_parent": "perhaps its parent: the weights cannot tell it from the parent the tree shows",
       "ancestor": "an ancestor: this model derives from it, through the models between them in the tree"}
_DOWN = {"parent": "its child: derived from this model", "merge_parent": "a merge of this model and another",
         "alternative_parent": "perhaps its child: the weights cannot tell this model from the parent the tree shows",
         "ancestor": "a descendant: derived from this model, through the models between them in the tree"}
_ACROSS = {"sibling": "a sibling: both derive from one parent; neither derives from the other",
           "cousin": "a cousin: both derive from a common ancestor; neither derives from the other",
           "copy": "copy: the same function (which is the original, the weights cannot say)"}


def describe(kinship: str | None, other: str, parent: str | None, child: str | None, decided: bool) -> str:
    """How ``other`` stands to this model, given the pair's kinship and its stored direction (parent, child, whether
    it is claimed); None kinship: a dependent pair outside one family tree, worded from its direction alone."""
    if kinship in _ACROSS:
        return _ACROSS[kinship]
    if kinship == "relative" or (kinship in ON_ONE_LINE and parent is not None and not decided):
        older = "it" if parent == other else "this model"
        return ("related through the family tree, but which came first is undecided"
                + (f" (the evidence leans towards {older} being the older, not enough to claim it)" if parent else ""))
    if kinship in ON_ONE_LINE and parent is not None:
        return _UP[kinship] if parent == other else _DOWN[kinship]
    if parent is not None and decided:
        older = "it likely came first" if parent == other else "this model likely came first"
        return f"dependent, outside one family tree (the pair does not join families); {older}"
    if parent is not None:
        return "dependent, outside one family tree; which came first is undecided"
    return "dependent; which came first is undetermined"
