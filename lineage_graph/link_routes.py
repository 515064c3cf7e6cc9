"""Where a drawn link runs: straight between its two models' boxes, or bent around the boxes between them, and where
its label goes. One geometry in layout units (``export.tree_layout``: x in leaf slots, y in rows), shared by the PNG
and the HTML page, which scale it linearly: a quadratic curve scales to the same curve, so a link clear of every box
here is clear in both drawings."""

from __future__ import annotations

import math

import networkx as nx

BOX_HALF = (0.47, 0.2)
"""Half the width (in leaf slots) and half the height (in rows) of a model's box, at least, in every drawing of
``tree_layout`` (the page's 150 x 42 px boxes at 162 px a slot and 120 px a row or more; the PNG's smaller): a link
kept out of these boxes crosses no model's box or label in either."""
BENDS = (0.0, 0.3, -0.3, 0.55, -0.55, 0.8, -0.8, 1.1, -1.1, 1.5, -1.5, 2.0, -2.0, 2.6, -2.6)
"""Offsets (in layout units, across the link) of a curved link's middle control point, tried in turn."""


def link_curve(a: tuple[float, float], b: tuple[float, float], bend: float, points: int = 33
               ) -> list[tuple[float, float]]:
    """Points along the link from ``a`` to ``b``: a straight line for bend 0, else the quadratic Bezier whose middle
    control point lies ``bend`` across the line from its middle (left of the direction a -> b for a positive bend,
    so a link drawn rightwards along a row bends upwards)."""
    (ax_, ay), (bx, by) = a, b
    length = math.hypot(bx - ax_, by - ay) or 1.0
    cx, cy = (ax_ + bx) / 2 - bend * (by - ay) / length, (ay + by) / 2 + bend * (bx - ax_) / length
    out = []
    for k in range(points):
        t = k / (points - 1)
        out.append(((1 - t) ** 2 * ax_ + 2 * t * (1 - t) * cx + t * t * bx,
                    (1 - t) ** 2 * ay + 2 * t * (1 - t) * cy + t * t * by))
    return out


def _inside(point: tuple[float, float], centre: tuple[float, float], half: tuple[float, float] = BOX_HALF) -> bool:
    return abs(point[0] - centre[0]) <= half[0] and abs(point[1] - centre[1]) <= half[1]


LABEL_HALF = (0.36, 0.08)
"""Half the width (slots) and height (rows) of a link's label in the PNG, at least (two lines at 7 pt)."""


def label_point(curve: list[tuple[float, float]], pos: dict[str, tuple[float, float]], prefer: float = 0.5
                ) -> tuple[float, float]:
    """Where a drawn link's label goes: the point along it nearest the ``prefer`` share of its length whose label
    covers no model's box, or just above or below such a point (between two boxes side by side there is no room on
    the link itself), else the place that covers the fewest."""
    reach = (BOX_HALF[0] + LABEL_HALF[0], BOX_HALF[1] + LABEL_HALF[1])
    lift = reach[1] + 0.02
    places = sorted(((abs(k / (len(curve) - 1) - prefer), abs(dy), (x, y + dy))
                     for k, (x, y) in enumerate(curve) for dy in (0.0, lift, -lift)), key=lambda p: (p[1], p[0]))
    return min(places, key=lambda p: (sum(_inside(p[2], c, reach) for c in pos.values()), p[1], p[0]))[2]


def _crossed(a: tuple[float, float], b: tuple[float, float], bend: float, others: list[tuple[float, float]]) -> int:
    """How many of the boxes centred at ``others`` the link from a to b, bent by ``bend``, crosses."""
    drawn = [q for q in link_curve(a, b, bend) if not _inside(q, a) and not _inside(q, b)]
    return sum(any(_inside(q, c) for q in drawn) for c in others)


def link_bends(graph: nx.DiGraph, pos: dict[str, tuple[float, float]]) -> dict[tuple[str, str], float]:
    """Each tree link with how far it bends (BENDS): straight where the line between its two boxes crosses no other
    model's box; else the first bend that clears every box (a link along a row to a model beside its parent, past
    the other models beside it; a merge's second parent on the row of its first), or, where none does, the one that
    crosses the fewest."""
    out = {}
    for u, v, a in graph.edges(data=True):
        if not a.get("tree_link") or u not in pos or v not in pos:
            continue
        others = [pos[n] for n in pos if n not in (u, v)]
        counts = {bend: _crossed(pos[u], pos[v], bend, others) for bend in BENDS}
        out[(u, v)] = next((b for b in BENDS if counts[b] == 0), min(BENDS, key=lambda b: (counts[b], abs(b))))
    return out
