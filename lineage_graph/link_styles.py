"""How each kind of tree link is drawn: one table for every export that draws (DOT, the HTML page, the PNG,
GEXF's viz, GraphML's style attributes), so the formats agree."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkStyle:
    """How one kind of tree link is drawn, the same in every format that draws (DOT, HTML, PNG, GEXF's viz)."""

    color: str
    dashed: bool
    arrow: bool
    legend: str


LINK_STYLES: dict[str, LinkStyle] = {
    "tree": LinkStyle("#24527a", dashed=False, arrow=True, legend="derived from (arrow: parent → child)"),
    "merge": LinkStyle("#a05a00", dashed=True, arrow=True, legend="second parent (merge)"),
    "copy": LinkStyle("#6a3d9a", dashed=True, arrow=False, legend="copy: same function, no direction"),
    "alternative": LinkStyle("#24527a", dashed=True, arrow=True,
                             legend="or derived from this one: the data cannot tell which of the two"),
    "undecided": LinkStyle("#5f8f6f", dashed=False, arrow=False,
                           legend="related, direction undecided (below the confidence level set)"),
}
"""How edges are drawn, by ``link_kind``. A copy joins two models with the same function: the weights cannot say
which is the original, so it is drawn without an arrow, whatever orientation the tree stored; an undecided tree or
merge link keeps its place in the tree, without an arrow."""
OTHER_COLOR = "#999999"
"""Dependences that are no tree link (drawn only on request: DOT dotted, the page's "show every pair")."""


def link_kind(attrs: dict) -> str | None:
    """The LINK_STYLES key an edge is drawn with: its tree link kind, "undecided" for a tree, merge or alternative
    link whose direction is not claimed, None for a dependence that is no tree link."""
    kind = attrs.get("tree_link") or None
    return "undecided" if kind in ("tree", "merge", "alternative") and not attrs.get("directed") else kind


def arrow_drawn(attrs: dict) -> bool:
    """Whether an edge is drawn as an arrow: a direction is claimed and the link is no copy."""
    kind = link_kind(attrs)
    return bool(attrs.get("directed")) and (kind is None or LINK_STYLES[kind].arrow)
