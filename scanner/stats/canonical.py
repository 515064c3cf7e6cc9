"""Units that together compute one function, found without thresholds a copier can chain and combined by algebra.

A hidden unit of an MLP reads its input through one or two rows (a gated MLP's gate row k and up row r, a plain
one's input row k) and writes through its output column w; a gated unit adds act(k x) (r x) w to the output. Units
that share their gate row k therefore compute one function together, act(k x) M x with M = sum_j w_j r_j^T, whatever
the parts look like: a copy split into parts that are not copies of one another (r/2 + v and r/2 - v with one output
column), with different output columns, into any number of parts, or padded with a twin that writes -w, gives back
the same M. The unit it was made from is M's rank-one factor; M = 0 is a unit that writes nothing. A plain unit
(act(k x) w) combines the same way with M = sum_j w_j.

Two rules keep a copier from steering this:

* **Groups are bounded.** A group is a leader and the units within a fixed angle of it (`leader_groups`), never the
  transitive closure of a similarity: a chain of units whose rows step from one unit to another cannot join units that
  are far apart. Leaders are taken in an order that is a function of each unit's own values (its size, then a fixed
  projection of its rows to break ties), so a permutation of the units permutes the groups and changes nothing else.
* **Nothing depends on a sign or a sum the copier picks.** M is the function's own sum; its factors are the singular
  vectors of M (unique up to one joint sign, which neither the function nor the views read), computed from the
  members' small Gram matrices (`rank_one_factors`).

Everything here is a function of one model's units alone, so the null argument of phi_MATCH holds for any rule built
on it: it selects and combines units, and never looks at the other model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Candidate pairs come from a sketch of each row in `_SKETCH` dimensions (a fixed Gaussian projection), checked in
#: full; `_SKETCH_MARGIN` below the bar keeps every pair at the bar but for a chance below 1e-4 (the sketch's cosine
#: errs by about (1 - c^2) / sqrt(_SKETCH)); `_CHUNK` rows at a time, fewer where a chunk's similarities would pass
#: `_CHUNK_ENTRIES` (a DeepSeek-V3 block's 526,336 units: 2,048 rows took 4.3 GB), bound the memory.
_SKETCH, _SKETCH_MARGIN, _CHUNK, _CHUNK_ENTRIES, _SEED = 32, 0.25, 2048, 1 << 28, 20261126
#: Candidate pairs checked in full at a time: their rows gathered take _CHECK x dims x 8 bytes (134 MB at 256 tokens),
#: however many candidates there are (a real model's gates on the canonical tokens: up to a third of all pairs).
_CHECK = 65536


@dataclass(frozen=True)
class RowView:
    """Unit-length rows of one view of a model's units (zero rows stay zero), and whether a view's sign carries no
    identity (a gated unit's up row: negating it and the output column keeps the function)."""

    rows: np.ndarray  # (units, dims)
    sign_free: bool = False


def close_pairs(views: Sequence[RowView], cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """(first, second) with first < second: every pair of units whose rows agree to ``cosine`` in every view (up to
    sign in a sign-free view). Candidates from a sketch of the first view, each checked in full in every view, so
    memory stays at `_CHUNK` rows times the units."""
    units = views[0].rows.shape[0]
    if units < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    import torch

    sketches = [_sketch(view.rows) for view in views]
    bar = cosine - _SKETCH_MARGIN
    firsts, seconds = [], []
    first = torch.from_numpy(sketches[0])
    chunk = max(1, min(_CHUNK, _CHUNK_ENTRIES // units))
    for start in range(0, units, chunk):  # torch: its threaded products and comparisons are several times numpy's
        similarity = first[start:start + chunk] @ first.T
        found = torch.nonzero((similarity.abs_() if views[0].sign_free else similarity) >= bar).numpy()
        rows, cols = found[:, 0] + start, found[:, 1]
        later = cols > rows
        rows, cols = rows[later], cols[later]
        for view in views:
            keep = np.empty(rows.size, dtype=bool)
            for first_pair in range(0, rows.size, _CHECK):  # the candidates' rows gathered a batch at a time
                pick = slice(first_pair, first_pair + _CHECK)
                exact = np.einsum("ij,ij->i", view.rows[rows[pick]], view.rows[cols[pick]])
                keep[pick] = (np.abs(exact) if view.sign_free else exact) >= cosine
            rows, cols = rows[keep], cols[keep]
        firsts.append(rows)
        seconds.append(cols)
    return np.concatenate(firsts), np.concatenate(seconds)


def leader_order(mass: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Units by decreasing ``mass`` (how much each contributes), exact ties broken by a fixed projection of their
    ``rows``: an order that depends on each unit's own values only, never on its index."""
    tie = _sketch(rows, dims=1)[:, 0].astype(np.float64) if rows.shape[1] else np.zeros(rows.shape[0])
    return np.lexsort((tie, -np.asarray(mass, dtype=np.float64)))


def leader_groups(units: int, first: np.ndarray, second: np.ndarray, order: np.ndarray,
                  eligible: np.ndarray | None = None) -> np.ndarray:
    """For each unit, the leader of its group (-1 for units not ``eligible``): in ``order``, each unit not yet in a
    group leads a new one, joined by every unit not yet in a group that is a close pair with it (``first``,
    ``second``). Every member is close to its leader itself, so no chain of close pairs joins units further apart."""
    leader = np.full(units, -1, dtype=np.int64)
    allowed = np.ones(units, dtype=bool) if eligible is None else np.asarray(eligible, dtype=bool)
    keep = allowed[first] & allowed[second]
    first, second = first[keep], second[keep]
    ends = np.concatenate([first, second])
    others = np.concatenate([second, first])
    by_unit = np.argsort(ends, kind="stable")
    ends, others = ends[by_unit], others[by_unit]
    starts = np.searchsorted(ends, np.arange(units + 1))
    for unit in order:
        if not allowed[unit] or leader[unit] >= 0:
            continue
        leader[unit] = unit
        neighbours = others[starts[unit]:starts[unit + 1]]
        free = neighbours[leader[neighbours] < 0]
        leader[free] = unit
    return leader


#: Units whose writes agree to this cosine, up to sign, write along one direction: their outputs add as one
#: (`output_sizes`). Two units kept below it write directions more than about 1.4% apart, so a pair that cancels
#: leaves that much of each unit's output in the model's.
SAME_OUTPUT_COSINE = 0.9999


def output_sizes(hidden: np.ndarray, writes: np.ndarray, weighed_hidden: np.ndarray | None = None) -> np.ndarray:
    """`output_groups`' sizes."""
    return output_groups(hidden, writes, weighed_hidden).sizes


@dataclass(frozen=True)
class OutputGroups:
    """What each unit adds to its block's output (``sizes``) and the leader of the group it is counted with
    (``leader``, itself where alone)."""

    sizes: np.ndarray
    leader: np.ndarray


def output_groups(hidden: np.ndarray, writes: np.ndarray, weighed_hidden: np.ndarray | None = None) -> OutputGroups:
    """How much each unit adds to its block's output, counted with the units that write along one direction with it:
    units whose write rows agree to `SAME_OUTPUT_COSINE` (up to sign; bounded groups, the largest unit leading) add
    as one, and every member counts for the size of their summed output, the Frobenius norm of sum_u h_u w_u^T
    computed exactly (not along the leader's direction: parts within the bar of one another that sum to a real
    unit's output count for that output). Whatever their hidden rows: units that write along one direction cancel
    only where their hidden rows, as the block weighs them, sum to nothing, and such a sum is what the group counts.
    ``weighed_hidden``: the hidden rows as the block weighs them (a routed expert's by its routing weight on each
    token), which the sums and sizes read. So a pair whose outputs cancel (a unit beside one that reads alike and
    writes the opposite) counts for nothing, however much each adds alone (bench/redteam/canonical60: such pairs 30
    times a real unit's size each once filled a MoE block's pooled units), and so do a unit in every routed expert
    whose weights always sum to what a shared expert's copy takes back (bench/redteam/canonical61) and four units
    whose hidden rows differ but sum to nothing by act(z) - act(-z) = z, spread over the routed and shared experts
    (bench/redteam/canonical62). Cancellation among units whose writes span more than one direction is not seen."""
    h = np.asarray(hidden, dtype=np.float64)
    w = np.asarray(writes, dtype=np.float64)
    out = h if weighed_hidden is None else np.asarray(weighed_hidden, dtype=np.float64)
    h_size, w_size = np.linalg.norm(h, axis=1), np.linalg.norm(w, axis=1)
    sizes = np.linalg.norm(out, axis=1) * w_size
    w_dirs = w / np.where(w_size > 0, w_size, 1.0)[:, None]
    first, second = close_pairs([RowView(w_dirs, sign_free=True)], SAME_OUTPUT_COSINE)
    del w_dirs  # a whole MoE block's units: each such copy is a gigabyte at DeepSeek-V3's shape
    if not first.size:
        return OutputGroups(sizes, np.arange(sizes.size))
    h_dirs = h / np.where(h_size > 0, h_size, 1.0)[:, None]
    leader = leader_groups(sizes.size, first, second, leader_order(h_size * w_size, h_dirs))
    grouped = np.flatnonzero(np.bincount(leader, minlength=leader.size)[leader] > 1)
    order = grouped[np.argsort(leader[grouped], kind="stable")]
    for members in np.split(order, np.flatnonzero(np.diff(leader[order])) + 1):
        sizes[members] = np.linalg.norm(out[members].T @ w[members])
    return OutputGroups(sizes, leader)


@dataclass(frozen=True)
class Factors:
    """The rank-one factors of a group's M = sum_j c_j w_j r_j^T: M = sum_k writes[k] reads[k]^T, each write of unit
    length, strongest first. ``members[k, j]`` is member j's share of factor k's read (reads[k] = sum_j members[k, j]
    r_j), so a caller applies the same combination to anything linear in the reads, such as their activations."""

    writes: np.ndarray  # (factors, write dims)
    reads: np.ndarray  # (factors, read dims)
    members: np.ndarray  # (factors, members)


#: A factor of M whose singular value is below this fraction of sum_j |c_j| |w_j| |r_j| (a bound on the sum of all of
#: M's singular values, with each |w_j| the output column as stored) is the rounding left by parts that cancel, not a
#: function: about 8 steps of float32, which the fingerprint computes in. Parts stored in float32 leave about 0.3
#: steps of their size where they cancel; a copier who hides a unit under parts a million times larger computes it
#: with several percent of noise in float32 himself (3.4% per unit, logits moved by 8e-3: bench/redteam/canonical47),
#: and parts that cancel exactly (twins (k, v, w) and (k, -v, w), exact in any format) must be that large too. The
#: bar is not the storage format's step: a half-precision checkpoint's exact twins cost nothing at 8 of bfloat16's
#: steps (twelve times the unit), and every real unit of a copy was dropped that way (CANNOT TEST). Where parts stored
#: in half precision cancel, the factors their rounding leaves beside the unit's are not kept (canonical_mlp: one gate,
#: one function).
CANCELLED = 1e-6


def rank_one_factors(writes: np.ndarray, reads: np.ndarray, coefficients: np.ndarray, *,
                     tolerance: float = CANCELLED, write_lengths: np.ndarray | None = None) -> Factors:
    """M's factors for a group's members (one row of ``writes`` and of ``reads`` per member), in float64: with the
    thin QR w^T = Q T of the writes, M M^T = Q (T C R R^T C T^T) Q^T, whose small eigenproblem gives the write
    directions a_k = Q p_k; factor k's read is M^T a_k = sum_j c_j (w_j . a_k) r_j. Factors below ``tolerance``
    times the bound on M's singular values are dropped; ``write_lengths``: the members' output columns' lengths as
    stored, where ``writes`` are only what the block sees of them (the bound is measured at the scale the values
    were rounded at)."""
    w = np.asarray(writes, dtype=np.float64)
    r = np.asarray(reads, dtype=np.float64)
    c = np.asarray(coefficients, dtype=np.float64)
    lengths = np.linalg.norm(w, axis=1) if write_lengths is None else np.asarray(write_lengths, dtype=np.float64)
    bound = float(np.sum(np.abs(c) * lengths * np.linalg.norm(r, axis=1)))
    directions = _write_directions(w, r, c, tolerance * bound)
    members = (directions @ w.T) * c[None, :]
    return Factors(directions, members @ r, members)


def _write_directions(w: np.ndarray, r: np.ndarray, c: np.ndarray, floor: float) -> np.ndarray:
    """M's left singular vectors (rows, unit length, strongest first) whose singular values are above ``floor``."""
    q, t = np.linalg.qr(w.T)  # w.T = q t: (dims, m) and (m, m)
    core = t @ (c[:, None] * (r @ r.T) * c[None, :]) @ t.T
    energy, vectors = np.linalg.eigh((core + core.T) / 2.0)
    singular = np.sqrt(np.clip(energy, 0.0, None))
    keep = singular > floor
    order = np.argsort(-singular[keep], kind="stable")
    return (q @ vectors[:, keep][:, order]).T


def _sketch(rows: np.ndarray, dims: int = _SKETCH) -> np.ndarray:
    """Rows projected to ``dims`` dimensions by a fixed Gaussian matrix and brought to unit length (float32)."""
    values = np.asarray(rows, dtype=np.float32)
    rng = np.random.default_rng(_SEED)
    projected = values @ rng.standard_normal((values.shape[1], dims)).astype(np.float32)
    if dims == 1:
        return projected
    norms = np.linalg.norm(projected, axis=1, keepdims=True)
    return projected / np.where(norms > 0, norms, 1.0)
