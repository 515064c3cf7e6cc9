"""Certified fast maximum-weight assignment for MATCH's dense similarity matrices.

``max_weight_assignment(similarity)`` returns what ``linear_sum_assignment(similarity, maximize=True)``
returns (row_ind = arange(rows), col_ind), but solves a sparse problem and proves, before returning,
that the answer is optimal for the dense problem.

How
---
1. Candidates. Row i gets a threshold t_i and keeps every entry s_ij > t_i (about ``candidates`` of
   them: t_i is estimated from a sample of the row's columns, and taken exactly, as the
   (candidates+1)-th largest entry, where the estimate gives fewer than candidates/2 or more than
   4*candidates). Later rounds may add entries below t_i; every entry left out of row i is <= t_i,
   and that is all the certificate needs, whatever t_i is.
2. Feasibility. Hopcroft-Karp on the candidate graph. Without a matching covering every row, the rows
   of a Hall violator (reached from an unmatched row by alternating paths) get twice the candidates.
3. Sparse solve. ``lap.lapmod`` (sparse Jonker-Volgenant) for square problems, scipy's
   ``min_weight_full_bipartite_matching`` (LAPJVsp) for rectangular ones and as lapmod's fallback.
4. Certificate. With x(i) row i's column, the residual graph has one node per column and, for every
   candidate (i, j), an edge x(i) -> j of weight s_{i,x(i)} - s_ij (what the total loses when row i
   moves to j and frees x(i)). Shortest distances d from a virtual source joined to every column by
   weight-0 edges (a vectorised Bellman-Ford over the columns changed in the last round) give
   D_j = -d_j >= 0 and u_i = s_{i,x(i)} - D_{x(i)}. Checked in float64 with an absolute tolerance tol:
     (a) u_i + D_j >= s_ij - tol for every candidate (i, j);
     (b) D_j >= 0 for every column, D_j <= tol for every unmatched column (rectangular case);
     (c) u_i + D_j >= s_ij - tol for every EXCLUDED entry: first the O(1)-per-row sufficient test
         u_i + min_j D_j >= t_i - tol (excluded entries of row i are <= t_i), then, for rows it does
         not settle, entry by entry over the whole row.
   Soundness: (a)-(c) say (u, D) is feasible (to tol) for the dual of the dense LP relaxation
   max sum s_ij z_ij s.t. rows sum to 1, columns to <= 1, z >= 0 (dual: min sum u + sum D s.t.
   u_i + D_j >= s_ij, D >= 0), and the LP's optimum bounds every assignment. For any assignment
   sigma, sum_i s_{i,sigma(i)} <= sum u + sum_{j in sigma} D_j + n tol <= sum u + sum_all D + n tol,
   while our total is sum_i (u_i + D_{x(i)}) = sum u + sum_all D - sum_unmatched D. So our total is
   within gap_bound = n tol + sum_unmatched D (<= cols * tol) of the dense optimum: weak duality, no
   trust in any solver. The Bellman-Ford only proposes the potentials; they are checked directly,
   so a wrong sparse optimum or wrong potentials make the check fail, never pass. A row failing (c)
   has a real violation: its most violated entries (up to ``candidates``) become candidates, its
   threshold drops to twice its count, and the sparse problem is solved again; when at most
   ``repair_limit`` rows changed (square case), by freeing those rows and re-inserting each with one
   JV shortest augmenting path from the last optimum and its potentials, which costs a few Dijkstra
   scans instead of a new lapmod (the result is certified all the same). After ``max_rounds``
   sparse solves, or once the candidates would exceed ``dense_fraction`` of all entries, the answer
   is scipy's dense ``linear_sum_assignment`` (stats.method == "dense"). No uncertified sparse answer
   is ever returned.

Tolerance: tol = 2**-43 * scale (scale: the largest |s| among candidates, or of D), ~450 float64
ulps. The final distances satisfy every relaxation inequality as computed, so (a) carries rounding
errors of a few ulps, whatever the path lengths. For cosines (scale <= 1) and 11008 units,
gap_bound ~ 1e-9: far below float32's resolution of the similarities themselves.

Ties: where several assignments are optimal (or within gap_bound), any of them may be returned, and
it can differ from scipy's while having the same total weight (e.g. all-zero rows from dead units).
On continuous data the optimum is unique and the matching is scipy's, as the tests assert.

Shape: rows <= cols (every row is assigned; callers transpose otherwise, as MATCH does). NaN and +inf
entries raise ValueError; -inf entries are never chosen (scipy's maximize=True forbids them too).

Devices: a numpy array is handled on the CPU. A torch tensor (or ``device="cuda"``) has its
candidates selected on its device; only candidate entries (and the few rows step 4(c) needs) come to
the CPU, where the LAP and the certificate run. ``matching.cosine_similarity_matrix(a, b, device=...)`` builds the similarity
matrix on the GPU in the first place.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching, min_weight_full_bipartite_matching

try:  # lap is a declared dependency; scipy's sparse solver covers its absence.
    import lap as _lap
except ImportError:  # pragma: no cover - exercised only without lap installed
    _lap = None

_TOL_REL = 2.0**-43
_BLOCK_ELEMENTS = 1 << 19  # entries per candidate-extraction block (2 MB of float32): stays in cache
_NORM_FLOOR = 1e-12


@dataclass
class AssignmentStats:
    """What one solve did: which path, how many sparse rounds, and why it enlarged or fell back."""

    shape: tuple[int, int]
    candidates: int
    method: str = ""  # "sparse" (certified), "dense" (scipy), "empty"
    solver: str = ""  # "lapmod", "scipy-sparse", "scipy-dense"
    rounds: int = 0  # sparse problems solved
    repaired_rounds: int = 0  # of those, re-optimised by JV augmentations from the last optimum
    edges: list[int] = field(default_factory=list)  # candidate entries at each feasibility test
    infeasible_rounds: int = 0  # candidate graphs with no matching covering every row
    certificate_failures: int = 0  # sparse optima that violated an excluded entry's dual constraint
    enlarged_rows: int = 0  # rows whose candidate sets were enlarged (summed over rounds)
    fallback_reason: str | None = None
    gap_bound: float = 0.0  # certified: total >= dense optimum - gap_bound
    seconds: dict[str, float] = field(default_factory=dict)

    def _add_time(self, key: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[key] = self.seconds.get(key, 0.0) + now - since
        return now


@dataclass(frozen=True)
class AssignmentResult:
    row_ind: np.ndarray
    col_ind: np.ndarray
    stats: AssignmentStats


def max_weight_assignment(
    similarity: Any, *, candidates: int = 64, device: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """(row_ind, col_ind) of a maximum-weight assignment, as ``linear_sum_assignment(s, maximize=True)``.

    ``similarity`` is a (rows, cols) numpy array or torch tensor with rows <= cols; row_ind is
    ``arange(rows)``. The answer is certified optimal (see the module docstring for the argument
    and for ties); ``solve_assignment`` returns the same with an ``AssignmentStats``.
    """
    result = solve_assignment(similarity, candidates=candidates, device=device)
    return result.row_ind, result.col_ind


def solve_assignment(
    similarity: Any,
    *,
    candidates: int = 64,
    device: Any = None,
    max_rounds: int = 6,
    dense_fraction: float = 0.25,
    repair_limit: int = 32,
) -> AssignmentResult:
    """``max_weight_assignment`` with statistics; see the module docstring for the method."""
    if candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    source = _make_source(similarity, device)
    n, m = source.shape
    stats = AssignmentStats(shape=(n, m), candidates=candidates)
    if n > m:
        raise ValueError(f"max_weight_assignment needs rows <= cols, got {n}x{m}; pass the transpose")
    if n == 0:
        stats.method = "empty"
        return AssignmentResult(np.arange(0, dtype=np.intp), np.arange(0, dtype=np.intp), stats)
    if n < 32 or m <= 2 * candidates:
        return _dense(source, stats, "small problem")

    clock = time.perf_counter()
    kmin, kmax = max(1, candidates // 2), 4 * candidates
    thr, indptr, indices, values = source.initial_candidates(candidates, kmin, kmax)
    clock = stats._add_time("candidates", clock)

    previous = None  # (x, D, enlarged rows) after a certificate failure: warm start for the next round
    for _ in range(4 * max_rounds + 32):  # infeasible rounds double counts: bounded by log2(cols) per row
        stats.edges.append(int(indices.size))
        if indices.size > dense_fraction * n * m:
            return _dense(source, stats, "candidate graph too dense")
        if stats.rounds >= max_rounds:
            break
        graph = csr_matrix((np.ones(indices.size), indices, indptr), shape=(n, m))
        row_match = maximum_bipartite_matching(graph, perm_type="column")
        clock = stats._add_time("feasibility", clock)
        if (row_match < 0).any():
            stats.infeasible_rounds += 1
            rows = _hall_violator(row_match, indptr, indices, m)
            counts = np.diff(indptr)[rows]
            new_thr = source.exact_thresholds(rows, np.maximum(2 * counts, candidates))
            thr, indptr, indices, values = _enlarge(source, thr, indptr, indices, values, rows, new_thr, stats)
            clock = stats._add_time("candidates", clock)
            previous = None
            continue

        stats.rounds += 1
        certificate = None
        if previous is not None and n == m and previous[2].size <= repair_limit:
            # A few rows gained candidates: re-optimise them by JV shortest augmenting paths from the
            # last optimum and its potentials, instead of solving from scratch. Checked like any other.
            repaired = _repair(indptr, indices, values, *previous)
            clock = stats._add_time("lap", clock)
            if repaired is not None:
                solved, warm = repaired
                certificate = _potentials(indptr, indices, values, solved, m, d0=-warm)
                clock = stats._add_time("duals", clock)
                stats.repaired_rounds += certificate is not None
        previous = None
        if certificate is None:
            solved = _solve_sparse(indptr, indices, values, n, m, stats)
            clock = stats._add_time("lap", clock)
            if solved is not None:
                certificate = _potentials(indptr, indices, values, solved, m)
                clock = stats._add_time("duals", clock)
        if certificate is None and stats.solver == "lapmod":
            # lapmod's answer failed validation or sparse optimality: try scipy's sparse solver.
            solved = _solve_sparse(indptr, indices, values, n, m, stats, use_lapmod=False)
            clock = stats._add_time("lap", clock)
            if solved is not None:
                certificate = _potentials(indptr, indices, values, solved, m)
                clock = stats._add_time("duals", clock)
        if certificate is None:
            return _dense(source, stats, "sparse solver returned no certifiable optimum")

        x, u, D, tol = certificate
        violators = _excluded_violations(source, thr, u, D, tol, candidates)
        clock = stats._add_time("certificate", clock)
        if violators is None:
            unmatched = np.ones(m, dtype=bool)
            unmatched[x] = False
            stats.method = "sparse"
            stats.gap_bound = n * tol + float(D[unmatched].sum())
            return AssignmentResult(np.arange(n, dtype=np.intp), x.astype(np.intp), stats)

        stats.certificate_failures += 1
        rows, extra = violators
        counts = np.diff(indptr)[rows]
        new_thr = source.exact_thresholds(rows, np.maximum(2 * counts, candidates))
        thr, indptr, indices, values = _enlarge(
            source, thr, indptr, indices, values, rows, new_thr, stats, extra=extra
        )
        previous = (x, D, rows)
        clock = stats._add_time("candidates", clock)

    return _dense(source, stats, f"no certificate after {max_rounds} sparse rounds")


# --------------------------------------------------------------------------------------------------
# Sparse solve, potentials, certificate


def _solve_sparse(indptr, indices, values, n, m, stats, use_lapmod: bool = True):
    """Columns x (one per row) of an optimum of the sparse problem, or None when the solver fails."""
    top = float(values.max())
    costs = top - values  # >= 0, exact for float32 inputs
    x = None
    if use_lapmod and n == m and _lap is not None:
        stats.solver = "lapmod"
        try:
            x, _ = _lap.lapmod(n, costs, indptr, indices, return_cost=False)
        except Exception:  # noqa: BLE001 - any lapmod failure sends us to scipy
            x = None
    else:
        stats.solver = "scipy-sparse"
        span = max(1.0, top - float(values.min()))
        weights = csr_matrix((costs + span, indices, indptr), shape=(n, m))  # > 0: scipy drops zeros
        try:
            rows, cols = min_weight_full_bipartite_matching(weights)
        except ValueError:
            return None
        if rows.size == n:
            x = np.empty(n, dtype=np.int64)
            x[rows] = cols
    if x is None:
        return None
    return _validated(np.asarray(x, dtype=np.int64), indptr, indices, n, m)


def _validated(x, indptr, indices, n, m):
    """(x, positions of the matched entries) when x is a matching of all rows along candidates."""
    if x.shape != (n,) or x.min() < 0 or x.max() >= m or np.bincount(x, minlength=m).max() > 1:
        return None
    counts = np.diff(indptr)
    hit = np.flatnonzero(indices == np.repeat(x, counts))
    if hit.size != n or not np.array_equal(np.searchsorted(indptr, hit, side="right") - 1, np.arange(n)):
        return None  # some row was given a column outside its candidates
    return x, hit


def _repair(indptr, indices, values, x_old, D_old, rows):
    """Re-optimise after the given rows gained candidates: free them, then one JV augmentation each.

    Invariant (JV, max form with column prices D): every matched row's column maximises s_ij - D_j
    over its candidates, which the certified previous optimum satisfies for every row whose candidates
    did not change. Each free row runs Dijkstra on the reduced costs (>= 0) to the nearest free
    column, raises the prices of the columns it finalised by (delta* - delta_j), and augments. Returns
    ((x, hit), D) or None; the result is certified afterwards like any solver's.
    """
    n, m = x_old.size, D_old.size
    x, D = x_old.copy(), D_old.copy()
    y = np.full(m, -1, dtype=np.int64)
    y[x] = np.arange(n)
    y[x[rows]] = -1
    x[rows] = -1
    for i0 in rows.tolist():
        dist = np.full(m, np.inf)
        pred = np.full(m, -1, dtype=np.int64)
        done = np.zeros(m, dtype=bool)
        lo, hi = indptr[i0], indptr[i0 + 1]
        js = indices[lo:hi]
        dist[js] = D[js] - values[lo:hi]
        pred[js] = i0
        heap = list(zip(dist[js].tolist(), js.tolist()))
        heapq.heapify(heap)
        ready, final = [], -1
        while heap:
            dj, j = heapq.heappop(heap)
            if done[j] or dj > dist[j]:
                continue
            done[j] = True
            if y[j] < 0:
                final = j
                break
            ready.append(j)
            i = y[j]
            lo, hi = indptr[i], indptr[i + 1]
            js = indices[lo:hi]
            profit = values[lo:hi] - D[js]
            reduced = np.maximum(profit[np.searchsorted(js, j)] - profit, 0.0)
            nd = dj + reduced
            better = (nd < dist[js]) & ~done[js]
            if better.any():
                js, nd = js[better], nd[better]
                dist[js] = nd
                pred[js] = i
                for item in zip(nd.tolist(), js.tolist()):
                    heapq.heappush(heap, item)
        if final < 0:
            return None
        if ready:
            ready_cols = np.asarray(ready, dtype=np.int64)
            D[ready_cols] += dist[final] - dist[ready_cols]
        j = final
        while True:
            i = pred[j]
            y[j] = i
            x[i], j = j, x[i]
            if i == i0:
                break
    solved = _validated(x, indptr, indices, n, m)
    return None if solved is None else (solved, D)


def _potentials(indptr, indices, values, solved, m, d0=None):
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
        pos, lens = _segments(indptr, rows)
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
    tol = _TOL_REL * scale
    row_of_edge = np.repeat(np.arange(n), counts)
    if (u[row_of_edge] + D[indices] - values).min() < -tol:  # (a)
        return None
    if D.min() < -tol or (row_of_col < 0).any() and D[row_of_col < 0].max() > tol:  # (b)
        return None
    return x, u, D, tol


def _excluded_violations(source, thr, u, D, tol, per_row):
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


def _hall_violator(row_match, indptr, indices, m):
    """Rows reachable from an unmatched row by alternating paths: a set with too few candidate columns."""
    col_match = np.full(m, -1, dtype=np.int64)
    matched = row_match >= 0
    col_match[row_match[matched]] = np.flatnonzero(matched)
    seen = ~matched
    frontier = np.flatnonzero(seen)
    while frontier.size:
        pos, _ = _segments(indptr, frontier)
        owners = col_match[np.unique(indices[pos])]
        owners = owners[owners >= 0]
        frontier = owners[~seen[owners]]
        seen[frontier] = True
    return np.flatnonzero(seen)


def _segments(indptr, rows):
    """Positions of the CSR entries of the given rows, concatenated, and each row's length."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    offsets = np.cumsum(lens) - lens
    pos = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - offsets, lens)
    return pos, lens


def _enlarge(source, thr, indptr, indices, values, rows, new_thr, stats, extra=None):
    """Lower the thresholds of the given rows, add the extra (row, col, value) entries, splice the CSR.

    A row's candidates stay a superset of its entries above its threshold, so every excluded entry is
    still <= the threshold; extra entries below it are simply candidates too.
    """
    n, m = source.shape
    thr = thr.copy()
    old_thr = thr[rows]
    new_thr = np.minimum(old_thr, new_thr.astype(thr.dtype))
    stuck = np.flatnonzero(new_thr >= old_thr)  # ties at the threshold: step to the next lower value
    if stuck.size:
        block = source.rows(rows[stuck])
        lower = np.where(block < old_thr[stuck, None].astype(np.float64), block, -np.inf).max(axis=1)
        new_thr[stuck] = lower.astype(thr.dtype)
    thr[rows] = new_thr
    stats.enlarged_rows += int(rows.size)

    pos, old_counts = _segments(indptr, rows)
    fresh_counts, fresh_cols, fresh_vals = source.extract(rows, new_thr)
    parts_rows = [np.repeat(rows, old_counts), np.repeat(rows, fresh_counts)]
    parts_cols = [indices[pos].astype(np.int64), fresh_cols.astype(np.int64)]
    parts_vals = [values[pos], fresh_vals]
    if extra is not None:
        parts_rows.append(extra[0])
        parts_cols.append(extra[1].astype(np.int64))
        parts_vals.append(extra[2])
    keys = np.concatenate(parts_rows) * m + np.concatenate(parts_cols)
    keys, first = np.unique(keys, return_index=True)  # sorted: row-major, columns ascending
    row_entries = keys // m
    row_indices = (keys % m).astype(indices.dtype)
    row_values = np.concatenate(parts_vals)[first]

    counts = np.diff(indptr)
    new_counts = counts.copy()
    new_counts[rows] = np.bincount(row_entries, minlength=n)[rows]
    new_indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(new_counts, out=new_indptr[1:])
    replaced = np.zeros(n, dtype=bool)
    replaced[rows] = True
    old_keep = ~np.repeat(replaced, counts)
    new_spliced = np.repeat(replaced, new_counts)
    out_indices = np.empty(int(new_indptr[-1]), dtype=indices.dtype)
    out_values = np.empty(int(new_indptr[-1]), dtype=values.dtype)
    out_indices[~new_spliced] = indices[old_keep]
    out_values[~new_spliced] = values[old_keep]
    out_indices[new_spliced] = row_indices
    out_values[new_spliced] = row_values
    return thr, new_indptr, out_indices, out_values


def _dense(source, stats, reason):
    clock = time.perf_counter()
    rows, cols = linear_sum_assignment(source.dense(), maximize=True)
    stats._add_time("dense", clock)
    stats.method, stats.solver, stats.fallback_reason = "dense", "scipy-dense", reason
    return AssignmentResult(np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp), stats)


# --------------------------------------------------------------------------------------------------
# Similarity sources: where the matrix lives (numpy on the CPU, or a torch tensor on any device)


def _sample_plan(k, m):
    """Columns sampled for the initial thresholds, and the rank in the sample that targets k entries."""
    sample = m if m <= 2048 else max(1024, m // 8)
    rank = k + 1 if sample == m else max(1, round((k + 1) * sample / m))
    return sample, rank


class _NumpySource:
    def __init__(self, s: np.ndarray):
        if s.ndim != 2:
            raise ValueError(f"similarity must be 2-D, got shape {s.shape}")
        if s.dtype not in (np.float32, np.float64):
            s = s.astype(np.float64)
        self.s = np.ascontiguousarray(s)
        self.shape = self.s.shape

    def initial_candidates(self, k, kmin, kmax):
        s = self.s
        n, m = s.shape
        sample, rank = _sample_plan(k, m)
        block_rows = max(1, _BLOCK_ELEMENTS // m)
        mask_buffer = np.empty((block_rows, m), dtype=bool)
        thr = np.empty(n, dtype=s.dtype)
        rows_out, cols_out, vals_out = [], [], []
        for r0 in range(0, n, block_rows):
            block = s[r0 : r0 + block_rows]
            b = block.shape[0]
            t = np.partition(block[:, :sample], sample - rank, axis=1)[:, sample - rank]
            mask = mask_buffer[:b]
            # not (s <= t) rather than s > t: NaN entries become candidates, where they are caught below
            np.less_equal(block, t[:, None], out=mask)
            np.logical_not(mask, out=mask)
            flat = np.flatnonzero(mask)
            counts = np.bincount(flat // m, minlength=b)
            redo = np.flatnonzero((counts < kmin) | (counts > kmax))
            if redo.size:
                t[redo] = _kth_largest(block[redo], k + 1)
                for r in redo:
                    np.less_equal(block[r], t[r], out=mask[r])
                    np.logical_not(mask[r], out=mask[r])
                flat = np.flatnonzero(mask)
            if np.isnan(t).any() or np.isposinf(t).any():
                raise ValueError("similarity contains NaN or +inf entries")
            thr[r0 : r0 + b] = t
            rows_out.append(flat // m + r0)
            cols_out.append(flat % m)
            vals_out.append(block.ravel()[flat])
        rows = np.concatenate(rows_out)
        values = np.concatenate(vals_out).astype(np.float64)
        if np.isnan(values).any() or np.isposinf(values).any():  # every NaN is here, and every +inf
            raise ValueError("similarity contains NaN or +inf entries")  # unless its t_i is +inf
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        return thr, indptr, np.concatenate(cols_out).astype(np.int32), values

    def exact_thresholds(self, rows, ks):
        out = np.empty(rows.size, dtype=self.s.dtype)
        for k in np.unique(ks):
            sel = np.flatnonzero(ks == k)
            for start in range(0, sel.size, 256):
                part = sel[start : start + 256]
                out[part] = _kth_largest(self.s[rows[part]], int(k) + 1)
        return out

    def extract(self, rows, thr_rows):
        block = self.s[rows]
        mask = block > thr_rows[:, None]
        flat = np.flatnonzero(mask)
        m = self.shape[1]
        counts = np.bincount(flat // m, minlength=rows.size)
        return counts, (flat % m).astype(np.int32), block.ravel()[flat].astype(np.float64)

    def rows(self, rows):
        return self.s[rows].astype(np.float64)

    def dense(self):
        return self.s


def _kth_largest(block: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest entry of each row (-inf when the rows have fewer than k entries)."""
    m = block.shape[1]
    if k > m:
        return np.full(block.shape[0], -np.inf, dtype=block.dtype)
    return np.partition(block, m - k, axis=1)[:, m - k]


class _TorchSource:
    """A torch tensor on any device: candidate selection there, only sparse pieces come to the CPU."""

    def __init__(self, t, device):
        import torch

        self.torch = torch
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("device='cuda' was asked for, but CUDA is not available")
            t = t.to(device)
        if t.ndim != 2:
            raise ValueError(f"similarity must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float64):
            t = t.to(torch.float64)
        self.t = t.contiguous()
        self.shape = tuple(self.t.shape)
        self.np_dtype = np.float32 if t.dtype == torch.float32 else np.float64

    def initial_candidates(self, k, kmin, kmax):
        torch, t = self.torch, self.t
        n, m = self.shape
        if bool(torch.isnan(t).any()) or bool(torch.isposinf(t).any()):
            raise ValueError("similarity contains NaN or +inf entries")
        sample, rank = _sample_plan(k, m)
        thr = torch.topk(t[:, :sample], rank, dim=1).values[:, rank - 1].contiguous()
        counts = (t > thr[:, None]).sum(dim=1)
        redo = torch.nonzero((counts < kmin) | (counts > kmax)).flatten()
        if redo.numel():
            thr[redo] = self._kth_largest(t[redo], k + 1)
        rows = np.arange(n, dtype=np.int64)
        thr_np = thr.cpu().numpy()
        counts, indices, values = self.extract(rows, thr_np)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return thr_np, indptr, indices, values

    def _kth_largest(self, block, k):
        if k > block.shape[1]:
            return self.torch.full((block.shape[0],), -float("inf"), dtype=block.dtype, device=block.device)
        return self.torch.topk(block, k, dim=1).values[:, k - 1]

    def exact_thresholds(self, rows, ks):
        out = np.empty(rows.size, dtype=self.np_dtype)
        for k in np.unique(ks):
            sel = np.flatnonzero(ks == k)
            index = self.torch.as_tensor(rows[sel], device=self.t.device)
            out[sel] = self._kth_largest(self.t[index], int(k) + 1).cpu().numpy()
        return out

    def extract(self, rows, thr_rows):
        torch = self.torch
        m = self.shape[1]
        block_rows = max(1, (1 << 24) // m)
        counts, indices, values = [], [], []
        for start in range(0, rows.size, block_rows):
            index = torch.as_tensor(rows[start : start + block_rows], device=self.t.device)
            block = self.t[index]
            t = torch.as_tensor(thr_rows[start : start + block_rows], device=self.t.device, dtype=block.dtype)
            mask = block > t[:, None]
            counts.append(mask.sum(dim=1).cpu().numpy())
            indices.append(torch.nonzero(mask)[:, 1].to(torch.int32).cpu().numpy())
            values.append(block[mask].to(torch.float64).cpu().numpy())
        return np.concatenate(counts).astype(np.int64), np.concatenate(indices), np.concatenate(values)

    def rows(self, rows):
        index = self.torch.as_tensor(rows, device=self.t.device)
        return self.t[index].to(self.torch.float64).cpu().numpy()

    def dense(self):
        return self.t.cpu().numpy()


def _make_source(similarity, device):
    is_tensor = type(similarity).__module__.split(".")[0] == "torch"
    if not is_tensor and (device is None or str(device) == "cpu"):
        return _NumpySource(np.asarray(similarity))
    import torch

    if not is_tensor:
        similarity = torch.from_numpy(np.ascontiguousarray(similarity))
    return _TorchSource(similarity, device)
