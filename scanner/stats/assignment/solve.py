"""The certified solve: sparse rounds until a certificate holds, else scipy's dense solver (package docstring)."""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import maximum_bipartite_matching, min_weight_full_bipartite_matching

from scanner.stats.assignment.candidates import Matching, enlarge, hall_violator, validated
from scanner.stats.assignment.certificate import excluded_violations, potentials
from scanner.stats.assignment.sources import SimilaritySource, make_source

try:  # lap is a declared dependency; scipy's sparse solver covers its absence.
    import lap as _lap
except ImportError:  # pragma: no cover - exercised only without lap installed
    _lap = None



@dataclass
class AssignmentStats:
    """What one solve did: which path, how many sparse rounds, and why it enlarged or fell back."""

    shape: tuple[int, int]
    candidates: int
    method: str = ""  # "row-maxima" (each row its own largest entry), "sparse" (certified), "dense" (scipy), "empty"
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
    source = make_source(similarity, device)
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
    columns, maxima = source.row_maxima()
    stats._add_time("row maxima", clock)
    if np.isfinite(maxima).all() and np.unique(columns).size == n:
        # Every row takes its own largest entry and no two take one column: no assignment can total more than
        # the sum of the rows' maxima, and this one reaches it (a related block's matching, most of the time).
        stats.method, stats.gap_bound = "row-maxima", 0.0
        return AssignmentResult(np.arange(n, dtype=np.intp), columns.astype(np.intp), stats)

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
            rows = hall_violator(row_match, indptr, indices, m)
            counts = np.diff(indptr)[rows]
            new_thr = source.exact_thresholds(rows, np.maximum(2 * counts, candidates))
            thr, indptr, indices, values = enlarge(source, thr, indptr, indices, values, rows, new_thr)
            stats.enlarged_rows += int(rows.size)
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
                certificate = potentials(indptr, indices, values, solved, m, d0=-warm)
                clock = stats._add_time("duals", clock)
                stats.repaired_rounds += certificate is not None
        previous = None
        if certificate is None:
            solved = _solve_sparse(indptr, indices, values, n, m, stats)
            clock = stats._add_time("lap", clock)
            if solved is not None:
                certificate = potentials(indptr, indices, values, solved, m)
                clock = stats._add_time("duals", clock)
        if certificate is None and stats.solver == "lapmod":
            # lapmod's answer failed validation or sparse optimality: try scipy's sparse solver.
            solved = _solve_sparse(indptr, indices, values, n, m, stats, use_lapmod=False)
            clock = stats._add_time("lap", clock)
            if solved is not None:
                certificate = potentials(indptr, indices, values, solved, m)
                clock = stats._add_time("duals", clock)
        if certificate is None:
            return _dense(source, stats, "sparse solver returned no certifiable optimum")

        x, u, D, tol = certificate
        violators = excluded_violations(source, thr, u, D, tol, candidates)
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
        thr, indptr, indices, values = enlarge(source, thr, indptr, indices, values, rows, new_thr, extra=extra)
        stats.enlarged_rows += int(rows.size)
        previous = (x, D, rows)
        clock = stats._add_time("candidates", clock)

    return _dense(source, stats, f"no certificate after {max_rounds} sparse rounds")


# --------------------------------------------------------------------------------------------------
# Sparse solvers, repair, dense fallback


def _solve_sparse(
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    n: int,
    m: int,
    stats: AssignmentStats,
    use_lapmod: bool = True,
) -> Matching | None:
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
    return validated(np.asarray(x, dtype=np.int64), indptr, indices, n, m)




def _repair(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, x_old: np.ndarray, D_old: np.ndarray, rows: np.ndarray
) -> tuple[Matching, np.ndarray] | None:
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
    solved = validated(x, indptr, indices, n, m)
    return None if solved is None else (solved, D)




def _dense(source: SimilaritySource, stats: AssignmentStats, reason: str) -> AssignmentResult:
    """scipy's dense solver on the whole matrix: the answer whenever no sparse one could be certified."""
    clock = time.perf_counter()
    rows, cols = linear_sum_assignment(source.dense(), maximize=True)
    stats._add_time("dense", clock)
    stats.method, stats.solver, stats.fallback_reason = "dense", "scipy-dense", reason
    return AssignmentResult(np.asarray(rows, dtype=np.intp), np.asarray(cols, dtype=np.intp), stats)
