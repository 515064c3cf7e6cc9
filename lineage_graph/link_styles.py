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
}
"""Tree link kinds (lineage_edges.tree_link). A copy joins two models with the same function: the weights cannot
say which is the original, so it is drawn without an arrow, whatever orientation the tree stored."""
OTHER_COLOR = "#999999"
"""Dependences that are no tree link (drawn only on request: DOT dotted, the page's "show every pair")."""


def arrow_drawn(attrs: dict) -> bool:
    """Whether an edge is drawn as an arrow: a direction is known and the link is no copy."""
    style = LINK_STYLES.get(attrs.get("tree_link") or "")
    return bool(attrs.get("directed")) and (style is None or style.arrow)
