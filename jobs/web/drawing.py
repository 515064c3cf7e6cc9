"""A family drawn as a static SVG the page can hold: boxes placed by `lineage_graph.export.tree_layout` (the PNG's
and the offline page's layout), tree links in their `LINK_STYLES`, each box a link to its model's page. Static,
so it needs no script and reads the same everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from lineage_graph.export import tree_layout
from lineage_graph.link_styles import LINK_STYLES, arrow_drawn, link_kind
from scanner.pairs.results import format_p
from scanner.text_safety import visible

SLOT_PX, LEVEL_PX = 182, 104
"""Distance between neighbouring leaves and between generations."""
BOX_W, BOX_H, MARGIN = 170, 46, 12
LABEL_PX = 13
"""The labels' font size (the stylesheet's ``svg.family .box text``)."""
_NARROW, _WIDE = set("fijlrtI.,:;'|!()[]{}\\ "), set("mwMW%@")


@dataclass(frozen=True)
class Box:
    model_id: str
    x: float
    y: float
    lines: tuple[str, ...]
    root: bool
    flagged: bool


@dataclass(frozen=True)
class Link:
    x1: float
    y1: float
    x2: float
    y2: float
    kind: str
    color: str
    dashed: bool
    arrow: bool
    title: str


@dataclass(frozen=True)
class Drawing:
    width: float
    height: float
    boxes: tuple[Box, ...]
    links: tuple[Link, ...]

    @property
    def kinds(self) -> set[str]:
        """The kinds of link drawn (the legend lists these)."""
        return {link.kind for link in self.links}


def family_drawing(graph: nx.DiGraph) -> Drawing:
    """Box centres in pixels from the tree layout (top-left at the margin), links from the bottom of the parent's
    box to the top of the child's."""
    pos = tree_layout(graph)
    left = min((x for x, _ in pos.values()), default=0.0)
    top = max((y for _, y in pos.values()), default=0.0)
    centre = {n: (MARGIN + BOX_W / 2 + (x - left) * SLOT_PX, MARGIN + BOX_H / 2 + (top - y) * LEVEL_PX)
              for n, (x, y) in pos.items()}
    boxes = tuple(Box(n, *centre[n], _label(n, bold=bool(a.get("is_root"))), bool(a.get("is_root")),
                      bool(a.get("discrepancies")))
                  for n, a in sorted(graph.nodes(data=True)))
    links = []
    for u, v, a in sorted(graph.edges(data=True)):
        kind = link_kind(a)
        if kind is None:
            continue  # only the tree's links: every dependence is on the model pages
        style = LINK_STYLES[kind]
        (x1, y1), (x2, y2) = centre[u], centre[v]
        if y1 == y2:  # side by side (an undecided or copy link): from one box's side to the other's
            side = 1 if x2 >= x1 else -1
            x1, x2 = x1 + side * BOX_W / 2, x2 - side * BOX_W / 2
            y_from = y_to = y1
        else:
            down = 1 if y2 > y1 else -1
            y_from, y_to = y1 + down * BOX_H / 2, y2 - down * BOX_H / 2
        links.append(Link(x1, y_from, x2, y_to, kind, style.color,
                          style.dashed, arrow_drawn(a), f"{style.legend}: {u} → {v}, "
                          f"p = {format_p(a['log10_p'])}, direction confidence {a['confidence']:.0%}"))
    width = max((x for x, _ in centre.values()), default=0.0) + BOX_W / 2 + MARGIN
    height = max((y for _, y in centre.values()), default=0.0) + BOX_H / 2 + MARGIN
    return Drawing(width, height, boxes, tuple(links))


def _label(model_id: str, *, bold: bool) -> tuple[str, ...]:
    """Organisation and name on two lines, invisible characters spelled out, each cut with an ellipsis where it
    would not fit inside the box."""
    shown = visible(model_id)
    cut = shown.find("/") + 1
    return tuple(_fitted(line, BOX_W - 12, bold) for line in ((shown[:cut], shown[cut:]) if cut else (shown,)))


def _fitted(line: str, width: float, bold: bool) -> str:
    """The line, or its longest start plus an ellipsis, whose width is at most ``width`` pixels, estimated on the
    generous side from DejaVu Sans's advance widths (narrow glyphs about 0.4 em, most 0.64, capitals 0.78, the
    widest 1; bold a tenth wider). One pass that stops where the box ends: no glyph narrower than 0.42 em, so a
    label looks at a few dozen characters however long the id (once, a 100,000-character id was re-measured from
    its start for every character cut, and held a server thread for minutes)."""
    scale = LABEL_PX * (1.1 if bold else 1.0)
    ellipsis = _em("…") * scale
    used, cut = 0.0, None
    for index, character in enumerate(line):
        used += _em(character) * scale
        if cut is None and used + ellipsis > width:
            cut = index  # the start that still fits beside an ellipsis, should the whole line not fit
        if used > width:
            return line[:cut] + "…"
    return line


def _em(character: str) -> float:
    """A glyph's advance width in em, on the generous side."""
    if character in _NARROW:
        return 0.42
    if character in _WIDE:
        return 1.0
    return 0.78 if character.isupper() else 0.64
