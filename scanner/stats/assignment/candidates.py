"""The candidate graph: each row's candidate columns and values in CSR (indptr, indices, values).

Where the solve grows it (a Hall violator when no matching covers every row; violators of the certificate) and
checks that a solver's matching stays on it.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from scanner.stats.assignment.sources import Candidates, SimilaritySource


class Matching(NamedTuple):
    """Every row's column x, and the positions in the CSR arrays of the matched entries."""

    x: np.ndarray
    hit: np.ndarray


def validated(x: np.ndarray, indptr: np.ndarray, indices: np.ndarray, n: int, m: int) -> Matching | None:
    """(x, positions of the matched entries) when x is a matching of all rows along candidates."""
    if x.shape != (n,) or x.min() < 0 or x.max() >= m or np.bincount(x, minlength=m).max() > 1:
        return None
    counts = np.diff(indptr)
    hit = np.flatnonzero(indices == np.repeat(x, counts))
    if hit.size != n or not np.array_equal(np.searchsorted(indptr, hit, side="right") - 1, np.arange(n)):
        return None  # some row was given a column outside its candidates
    return Matching(x, hit)




def hall_violator(row_match: np.ndarray, indptr: np.ndarray, indices: np.ndarray, m: int) -> np.ndarray:
    """Rows reachable from an unmatched row by alternating paths: a set with too few candidate columns."""
    col_match = np.full(m, -1, dtype=np.int64)
    matched = row_match >= 0
    col_match[row_match[matched]] = np.flatnonzero(matched)
    seen = ~matched
    frontier = np.flatnonzero(seen)
    while frontier.size:
        pos, _ = segments(indptr, frontier)
        owners = col_match[np.unique(indices[pos])]
        owners = owners[owners >= 0]
        frontier = owners[~seen[owners]]
        seen[frontier] = True
    return np.flatnonzero(seen)


def segments(indptr: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the CSR entries of the given rows, concatenated, and each row's length."""
    starts = indptr[rows]
    lens = indptr[rows + 1] - starts
    offsets = np.cumsum(lens) - lens
    pos = np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - offsets, lens)
    return pos, lens


def enlarge(
    source: SimilaritySource,
    thr: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    new_thr: np.ndarray,
    extra: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> Candidates:
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

    pos, old_counts = segments(indptr, rows)
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
