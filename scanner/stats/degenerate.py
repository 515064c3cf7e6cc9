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
`DUPLICATE_COSINE`: exact copies, and copies made with jitter) form a group that counts as ONE unit, at its lowest
index, whose views are the mean of its members' directions (`merge_groups`): a copier who splits every unit into
copies, each with a share of the output column, leaves the outputs as they were, and with jitters that cancel in
the sum the mean of the copies is the unit they were made from. Nothing here depends on a unit's scale: rescaling a
unit (another output-preserving change) changes neither its zeros, nor its spread relative to its own peak, nor its
direction. Views whose sign an output-preserving change can flip unit by unit (a gated MLP's up output) compare
directions up to sign.

The screen is a function of one model's own units and is the same set for any relabelling of them, so it keeps the
null argument of phi_MATCH (units of one model exchangeable, independent of the other) intact: it selects units, it
never looks at the other model. A block left with fewer than `MIN_INFORMATIVE_UNITS` informative units on either
side gets no p-value (p = 1) and says why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

#: Fewest informative units on each side for a block to get a p-value: below this a matching says little and a
#: block of mostly dead units is better reported as such.
MIN_INFORMATIVE_UNITS = 8
#: A unit whose values span less than this fraction of their largest magnitude is constant: float16, which
#: fingerprints are stored in, resolves about 1e-3 of a value, so as stored it is one direction.
CONSTANT_SPREAD = 1e-3
#: Two units are copies of one unit when their directions agree to this cosine in every view: exact copies (1), and
#: copies made with jitter whose jitters cancel in their sum (which keeps the outputs to second order) up to a jitter
#: of a third of each row's size (measured on the zoo: 1% of the logits). Distinct units rarely come this close: none
#: in the zoo's trained models, 1.9% of SmolLM2-135M's units (each then joins a group whose mean it shares).
DUPLICATE_COSINE = 0.8
#: Candidate pairs come from a sketch of each unit's directions in `_SKETCH` dimensions (fixed seed), checked against
#: `DUPLICATE_COSINE` less `_SKETCH_MARGIN` (four standard errors of the sketch at the bar), `_CHUNK` units at a time.
_SKETCH, _SKETCH_MARGIN, _CHUNK, _SEED = 32, 0.25, 2048, 20261126


@dataclass(frozen=True)
class UnitScreen:
    """Which units of one side are informative, and how many were set aside for each reason."""

    informative: np.ndarray  # bool, one per unit: live, and the lowest index of its duplicate group
    zero: int
    duplicated: int  # units folded into another unit's duplicate group (the group's representative is informative)
    constant: int
    group: np.ndarray  # int, one per unit: the representative of its duplicate group (itself alone), -1 set aside

    @property
    def kept(self) -> int:
        return int(self.informative.sum())

    @property
    def set_aside(self) -> int:
        return self.informative.size - self.kept


def screen_units(*views: np.ndarray, sign_free: Sequence[bool] | None = None) -> UnitScreen:
    """The units (rows) that are non-zero and not constant in every view, one per group of units that repeat one
    direction in every view. ``sign_free[k]``: view k's directions are compared up to sign."""
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
        values = np.asarray(view.cpu() if hasattr(view, "cpu") else view, dtype=np.float32)  # a GPU tensor too
        peak = np.abs(values).max(axis=1) if values.shape[1] else np.zeros(rows, dtype=np.float32)
        zero |= peak == 0
        if values.shape[1]:
            spread = values.max(axis=1) - values.min(axis=1)
            constant |= (peak > 0) & (spread <= CONSTANT_SPREAD * peak)
        directions.append(_directions(values, peak))
    constant &= ~zero
    live = np.flatnonzero(~(zero | constant))
    representative = duplicate_representatives([d[live] for d in directions], flips)
    duplicated = np.zeros(rows, dtype=bool)
    duplicated[live[representative != np.arange(live.size)]] = True
    group = np.full(rows, -1, dtype=np.int64)
    group[live] = live[representative]
    return UnitScreen(informative=~(zero | constant | duplicated), zero=int(zero.sum()),
                      duplicated=int(duplicated.sum()), constant=int(constant.sum()), group=group)


def duplicate_representatives(directions: Sequence[np.ndarray], sign_free: Sequence[bool] | None = None
                               ) -> np.ndarray:
    """For each unit (row of every unit-length view), the lowest-indexed unit of its duplicate group: the units
    whose directions agree with it to `DUPLICATE_COSINE` in every view (up to sign in a sign-free view), joined
    transitively."""
    units = directions[0].shape[0]
    flips = tuple(sign_free) if sign_free is not None else (False,) * len(directions)
    first, second = _candidate_pairs(directions, flips)
    close = np.ones(first.size, dtype=bool)
    for view, flip in zip(directions, flips, strict=True):
        cosine = np.einsum("ij,ij->i", view[first], view[second])
        close &= (np.abs(cosine) if flip else cosine) >= DUPLICATE_COSINE
    representative = np.arange(units)
    if close.any():
        graph = coo_matrix((np.ones(int(close.sum())), (first[close], second[close])), shape=(units, units))
        _, labels = connected_components(graph, directed=False)
        lowest = np.full(labels.max() + 1, units, dtype=np.int64)
        np.minimum.at(lowest, labels, np.arange(units))
        representative = lowest[labels]
    return representative


def merge_groups(view: np.ndarray, screen: UnitScreen, sign_free: bool = False) -> np.ndarray:
    """The informative rows of a view, each duplicate group's row being the sum of its members' unit-length rows
    (turned to the representative's sign in a sign-free view), so its direction is their mean's: copies made with
    jitter whose jitters cancel (the copier's way to keep the outputs) average back to the unit they were made from."""
    values = np.asarray(view, dtype=np.float32)
    rows = _directions(values, np.abs(values).max(axis=1))
    members = np.flatnonzero(screen.group >= 0)
    leader = screen.group[members]
    turned = rows[members]
    if sign_free:
        turned = turned * np.where(np.einsum("ij,ij->i", turned, rows[leader]) < 0, -1.0, 1.0)[:, None]
    sums = np.zeros_like(rows)
    np.add.at(sums, leader, turned)
    return sums[screen.informative]


def _directions(values: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """Unit-length rows (zero rows stay zero), divided by their peak first so that no finite scale overflows."""
    scaled = values / np.where(peak > 0, peak, 1.0)[:, None]
    norms = np.linalg.norm(scaled, axis=1)
    return scaled / np.where(norms > 0, norms, 1.0)[:, None]


def _candidate_pairs(directions: Sequence[np.ndarray], sign_free: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    """(first, second) index arrays of unit pairs whose directions, projected to `_SKETCH` dimensions by a fixed
    Gaussian matrix, agree to within `_SKETCH_MARGIN` of `DUPLICATE_COSINE` in every view: every pair that agrees
    to the bar in full but for a chance below 1e-4 (the sketch's cosine errs by about (1 - c^2) / sqrt(_SKETCH)),
    and few others; the caller checks them in full. A block's units are sketched in chunks, so memory stays at a
    chunk of rows times the units."""
    units = directions[0].shape[0]
    if units < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    rng = np.random.default_rng(_SEED)
    sketches = []
    for view in directions:
        projected = view @ rng.standard_normal((view.shape[1], _SKETCH)).astype(np.float32)
        norms = np.linalg.norm(projected, axis=1, keepdims=True)
        sketches.append(projected / np.where(norms > 0, norms, 1.0))
    bar = DUPLICATE_COSINE - _SKETCH_MARGIN
    firsts, seconds = [], []
    import torch

    first = torch.from_numpy(sketches[0])
    for start in range(0, units, _CHUNK):  # torch: its threaded products and comparisons are several times numpy's
        cosine = first[start:start + _CHUNK] @ first.T
        found = torch.nonzero((cosine.abs_() if sign_free[0] else cosine) >= bar).numpy()
        rows, cols = found[:, 0] + start, found[:, 1]
        later = cols > rows
        rows, cols = rows[later], cols[later]
        for sketch, flip in zip(sketches[1:], sign_free[1:], strict=True):
            other = np.einsum("ij,ij->i", sketch[rows], sketch[cols])
            close = (np.abs(other) if flip else other) >= bar
            rows, cols = rows[close], cols[close]
        firsts.append(rows)
        seconds.append(cols)
    return np.concatenate(firsts), np.concatenate(seconds)


def too_few(a: UnitScreen, b: UnitScreen) -> bool:
    """Whether either side is left with too few informative units for a p-value."""
    return min(a.kept, b.kept) < MIN_INFORMATIVE_UNITS


def describe(a: UnitScreen, b: UnitScreen) -> str:
    """One line on what was set aside, for a pair's notes (empty when nothing was)."""
    if not (a.set_aside or b.set_aside):
        return ""
    parts = [f"{side}: {s.zero} all-zero, {s.constant} constant and {s.duplicated} duplicated of "
             f"{s.informative.size} units"
             for side, s in (("A", a), ("B", b)) if s.set_aside]
    tail = f"; fewer than {MIN_INFORMATIVE_UNITS} informative units left, so no p-value (p = 1)" if too_few(a, b) \
        else ""
    return ", ".join(parts) + tail
