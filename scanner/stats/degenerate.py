"""Units that carry no evidence of their own about a model's origin, set aside before MATCH pairs units.

MATCH pairs the units of two layers by maximum total cosine. An all-zero unit (a dead or pruned-to-zero neuron)
scores 0 against everything, and a unit whose direction another unit repeats (a duplicated neuron) scores the same
as its twin against everything: either way the assignment has ties, which a solver breaks by index order, and the
same order in the gate and the up matchings makes them agree for no reason at all. A model whose gate and up units
are all zero would test dependent on every model (rho = 1). A constant unit (the same value on every token, or the
same weight in every column) has one direction in every model, so a constant unit of each side pairs up in both
matchings whatever the models' origins.

So each side's units are screened on their own activations (or weights), view by view: a unit is set aside when it
is exactly zero or constant in some view. Units that repeat one another's direction in every view (to within
`DUPLICATE_COSINE`: copies made with jitter, which the fingerprint's canonical form, scanner.reading.canonical_mlp,
leaves apart when their gate rows are far enough apart) form a bounded group that counts as ONE unit, its leader
(scanner.stats.canonical: the units close to one leader, taken in an order set by each unit's own values, so no chain
of units that step from one unit to another can join units far apart). The group's up row is the read of the one
function its members compute together (`combined_reads`): the rank-one factor of the sum of their (write x up)
products, so parts that are not copies of one another (u/2 + v and u/2 - v) give back u, and no sign a copier picks
enters. Nothing here depends on a unit's scale: rescaling a unit (another output-preserving change) changes neither
its zeros, nor its spread relative to its own peak, nor its direction. Views whose sign an output-preserving change
can flip unit by unit (a gated MLP's up output) compare directions up to sign.

The screen is a function of one model's own units and is the same set for any relabelling of them, so it keeps the
null argument of phi_MATCH (units of one model exchangeable, independent of the other) intact: it selects units, it
never looks at the other model. A block left with fewer than `MIN_INFORMATIVE_UNITS` informative units on either
side cannot be tested, and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scanner.stats.canonical import RowView, close_pairs, leader_groups, leader_order, rank_one_factors

#: Fewest informative units on each side for a block to be tested: below this a matching says little and a
#: block of mostly dead units is better reported as such.
MIN_INFORMATIVE_UNITS = 8
#: A unit whose values span less than this fraction of their largest magnitude is constant: float16, which
#: fingerprints are stored in, resolves about 1e-3 of a value, so as stored it is one direction.
CONSTANT_SPREAD = 1e-3
#: Two units are copies of one unit when their directions agree to this cosine in every view: copies made with
#: jitter whose jitters cancel in their sum (which keeps the outputs to second order) up to a jitter of a third of
#: each row's size (measured on the zoo: 1% of the logits). Distinct units rarely come this close: none in the zoo's
#: trained models, 1.9% of SmolLM2-135M's units (each then joins a group it shares one function with).
DUPLICATE_COSINE = 0.8
#: A group's one function is read off views stored in float16 and int8: its second factor below this fraction of the
#: bound on its factors is storage rounding, not a second unit.
STORED_PRECISION = 1e-2


@dataclass(frozen=True)
class UnitScreen:
    """Which units of one side are informative, and how many were set aside for each reason."""

    informative: np.ndarray  # bool, one per unit: live, and the leader of its duplicate group
    zero: int
    duplicated: int  # units folded into another unit's duplicate group (the group's leader is informative)
    constant: int
    group: np.ndarray  # int, one per unit: the leader of its duplicate group (itself alone), -1 set aside
    gate: np.ndarray | None = None  # informative units' gate rows where groups were combined (`combined_rows`)
    up: np.ndarray | None = None  # and their up rows
    write: np.ndarray | None = None  # and their write rows, where the side has a write view

    @property
    def kept(self) -> int:
        return int(self.informative.sum())

    @property
    def set_aside(self) -> int:
        return self.informative.size - self.kept


def screen_units(*views: np.ndarray, sign_free: Sequence[bool] | None = None,
                 mass: np.ndarray | None = None) -> UnitScreen:
    """The units (rows) that are non-zero and not constant in every view, one per bounded group of units that repeat
    one direction in every view. ``sign_free[k]``: view k's directions are compared up to sign. ``mass``: how much
    each unit contributes (leaders are taken largest first; None: in an order of the rows' own values)."""
    rows = views[0].shape[0]
    flips = tuple(sign_free) if sign_free is not None else (False,) * len(views)
    if len(flips) != len(views):
        raise ValueError(f"one sign_free flag per view, got {len(flips)} for {len(views)} views")
    zero = np.zeros(rows, dtype=bool)
    constant = np.zeros(rows, dtype=bool)
    directions = []
    for view in views:
        if view.shape[0] != rows:
            raise ValueError(f"views of one side must have one row per unit, got {view.shape[0]} and {rows}")
        values = host_rows(view)
        peak = np.abs(values).max(axis=1) if values.shape[1] else np.zeros(rows, dtype=np.float32)
        zero |= peak == 0
        if values.shape[1]:
            spread = values.max(axis=1) - values.min(axis=1)
            constant |= (peak > 0) & (spread <= CONSTANT_SPREAD * peak)
        directions.append(_directions(values, peak))
    constant &= ~zero
    live = ~(zero | constant)
    first, second = close_pairs([RowView(d, f) for d, f in zip(directions, flips, strict=True)], DUPLICATE_COSINE)
    order = leader_order(np.ones(rows) if mass is None else mass, directions[0])
    group = leader_groups(rows, first, second, order, eligible=live)
    duplicated = live & (group != np.arange(rows))
    return UnitScreen(informative=live & ~duplicated, zero=int(zero.sum()), duplicated=int(duplicated.sum()),
                      constant=int(constant.sum()), group=group)


def combined_rows(screen: UnitScreen, gate: np.ndarray, reads: np.ndarray, *, sign_free: bool,
                  writes: np.ndarray | None = None, magnitude: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The informative units' gate, read and write rows (unit length), each duplicate group's those of the one
    function its members compute together: its gate the members' gate directions averaged with weights c_j, its read
    and write the strongest rank-one factor of sum_j c_j w_j r_j^T (scanner.stats.canonical), c_j the member's
    ``magnitude`` (the size of its write times its read; None: equal). Without ``writes`` (views made without a
    residual stream) every member is taken to write one direction, turned to its leader's sign where the read's sign
    is free, and no write rows are returned."""
    gates, rows = _unit_rows(gate), _unit_rows(reads)
    out_gate, out_read = gates[screen.informative].copy(), rows[screen.informative].copy()
    position = np.cumsum(screen.informative) - 1
    sizes = np.ones(rows.shape[0]) if magnitude is None else np.asarray(magnitude, dtype=np.float64)
    counts = np.bincount(screen.group[screen.group >= 0], minlength=rows.shape[0])
    written = None if writes is None else _unit_rows(writes)
    out_write = None if written is None else written[screen.informative].copy()
    for leader in np.flatnonzero(screen.informative & (counts > 1)):
        members = np.flatnonzero(screen.group == leader)
        c = sizes[members] / max(float(sizes[members].max()), 1e-300)
        out_gate[position[leader]] = c @ gates[members]
        if written is None:
            turn = np.where(rows[members] @ rows[leader] < 0, -1.0, 1.0) if sign_free else np.ones(members.size)
            out_read[position[leader]] = (c * turn) @ rows[members]
            continue
        factors = rank_one_factors(written[members], rows[members], c, tolerance=STORED_PRECISION)
        if factors.reads.shape[0]:
            out_read[position[leader]], out_write[position[leader]] = factors.reads[0], factors.writes[0]
    return out_gate, out_read, out_write


def _unit_rows(view: np.ndarray) -> np.ndarray:
    """A view's rows at unit length, float64 on the host (rows of any finite scale; zero rows stay zero)."""
    values = host_rows(view).astype(np.float64)
    return _directions(values, np.abs(values).max(axis=1) if values.shape[1] else np.zeros(values.shape[0]))


def host_rows(view: Any) -> np.ndarray:
    """A view's rows as float32 numpy (a GPU tensor's too: a pair worker on a GPU holds its fingerprints there)."""
    return np.asarray(view.cpu() if hasattr(view, "cpu") else view, dtype=np.float32)


def _directions(values: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """Unit-length rows (zero rows stay zero), divided by their peak first so that no finite scale overflows."""
    scaled = values / np.where(peak > 0, peak, 1.0)[:, None]
    norms = np.linalg.norm(scaled, axis=1)
    return scaled / np.where(norms > 0, norms, 1.0)[:, None]


def too_few(a: UnitScreen, b: UnitScreen) -> bool:
    """Whether either side is left with too few informative units for a test."""
    return min(a.kept, b.kept) < MIN_INFORMATIVE_UNITS


def describe(a: UnitScreen, b: UnitScreen) -> str:
    """One line on what was set aside, for a pair's notes (empty when nothing was)."""
    if not (a.set_aside or b.set_aside):
        return ""
    parts = [f"{side}: {s.zero} all-zero, {s.constant} constant and {s.duplicated} duplicated of "
             f"{s.informative.size} units"
             for side, s in (("A", a), ("B", b)) if s.set_aside]
    tail = f"; fewer than {MIN_INFORMATIVE_UNITS} informative units left, so the block cannot be tested" \
        if too_few(a, b) else ""
    return ", ".join(parts) + tail
