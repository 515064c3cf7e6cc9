"""The certificate: dual potentials that prove a sparse optimum optimal for the dense problem (weak duality).

See the package docstring, step 4: (a) and (b) are checked on the candidate graph by ``potentials``, (c) over
the excluded entries by ``excluded_violations``, whose violators become candidates for the next round.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from scanner.stats.assignment.candidates import Matching, segments
from scanner.stats.assignment.sources import SimilaritySource

TOL_REL = 2.0**-43


class Certificate(NamedTuple):
    """Rows' columns x, potentials u (rows) and D (columns), and the tolerance they were checked to."""

    x: np.ndarray
    u: np.ndarray
    D: np.ndarray
    tol: float


def potentials(
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    solved: Matching | tuple[np.ndarray, np.ndarray],
    m: int,
    d0: np.ndarray | None = None,
) -> Certificate | None:
    """Dual potentials (u, D) certifying the sparse optimum, or None when they cannot exist.

    Shortest distances from a virtual source (weight-0 edges to every column) in the residual graph,
    by a vectorised Bellman-Ford that only relaxes edges out of columns changed in the last round.
    A warm start d0 <= 0 (square problems only) converges to some feasible potential, which is all
    the certificate needs.
    """
    x, hit = solved
    n = x.size
    counts = np.diff(indptr)
    matched_value = values[hit]
    weight = np.repeat(matched_value, counts) - values  # edge x(i) -> j, for each candidate (i, j)
    row_of_col = np.full(m, -1, dtype=np.int64)
    row_of_col[x] = np.arange(n)
    d = np.zeros(m) if d0 is None else np.minimum(d0, 0.0)
    changed = np.zeros(m, dtype=bool)
    has_edges = row_of_col >= 0  # unmatched columns (rectangular case) have no outgoing edges
    active = x
    budget = 256 * (indices.size + m)  # a sound give-up: typical runs relax each edge about 12 times
    for _ in range(m + 1):
        rows = row_of_col[active]
        pos, lens = segments(indptr, rows)
        budget -= pos.size
        if budget < 0:
            return None
        cand = np.repeat(d[active], lens) + weight[pos]
        target = indices[pos]
        better = cand < d[target]
        if not better.any():
            break
        target, cand = target[better], cand[better]
        np.minimum.at(d, target, cand)
        changed[target] = True
        changed &= has_edges
        active = np.flatnonzero(changed)
        changed[active] = False
        if active.size == 0:
            break
    else:
        return None  # still relaxing after m + 1 rounds: a negative cycle, not a sparse optimum
    D = -d
    u = matched_value - D[x]
    scale = max(float(np.abs(values).max()), float(D.max()), np.finfo(np.float64).tiny)
    tol = TOL_REL * scale
    row_of_edge = np.repeat(np.arange(n), counts)
    if (u[row_of_edge] + D[indices] - values).min() < -tol:  # (a)
        return None
    if D.min() < -tol or (row_of_col < 0).any() and D[row_of_col < 0].max() > tol:  # (b)
        return None
    return Certificate(x, u, D, tol)


def excluded_violations(
    source: SimilaritySource, thr: np.ndarray, u: np.ndarray, D: np.ndarray, tol: float, per_row: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """None when every entry meets its dual constraint (c); else (rows, (row, col, value) of violators).

    Rows passing the O(1) test u_i + min D >= t_i - tol are settled (their excluded entries are
    <= t_i); the others are checked entry by entry over the whole row, in the same arithmetic as (a),
    so candidate entries, which passed (a), never show up as violators. Of each row's violators the
    ``per_row`` most violated are returned (column generation's most negative reduced costs).
    """
    settled = u + D.min() >= thr.astype(np.float64) - tol  # -inf thresholds: the row is complete
    unsettled = np.flatnonzero(~settled)
    bad_rows, extra_rows, extra_cols, extra_vals = [], [], [], []
    chunk = max(1, (1 << 22) // source.shape[1])
    for start in range(0, unsettled.size, chunk):
        rows = unsettled[start : start + chunk]
        block = source.rows(rows)  # (len(rows), cols), float64, exact copies of the entries
        reduced = (u[rows, None] + D[None, :]) - block
        violated = reduced < -tol
        r, c = np.nonzero(violated)
        if r.size:
            order = np.lexsort((reduced[r, c], r))  # by row, most violated first
            r, c = r[order], c[order]
            starts = np.searchsorted(r, r, side="left")
            keep = np.arange(r.size) - starts < per_row
            r, c = r[keep], c[keep]
            bad_rows.append(np.unique(rows[r]))
            extra_rows.append(rows[r])
            extra_cols.append(c)
            extra_vals.append(block[r, c])
    if not bad_rows:
        return None
    extra = (np.concatenate(extra_rows), np.concatenate(extra_cols), np.concatenate(extra_vals))
    return np.concatenate(bad_rows), extra
