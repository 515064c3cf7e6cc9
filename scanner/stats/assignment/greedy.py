"""The greedy matching: MATCH's cheap rule, at about the cost of reading the similarity matrix once.

Why: phi_MATCH needs each view's matching to be a function of that view alone, the same whatever order either
side's units come in (docs/statistics.md, "The matching rule"); it does not need the maximum-weight assignment. The
exact assignment of a near-flat 11008 x 11008 matrix (two independent models) costs twice the cosine product on one
host core, while the matrix itself is a GPU's fraction of a second; this rule costs one top-k pass over the matrix
and a few passes over its candidates, on whichever device holds the matrix. It pairs related units a little worse
than the assignment, so MATCH's default (scanner.stats.matching, ``screened``) uses it to find which blocks are
related and matches those exactly.

The rule, for a (rows, cols) matrix with rows <= cols:

1. Candidates: each row's ``candidates`` largest entries.
2. Mutual-best rounds over the candidate entries whose row and column are both free: a row whose best entry is
   also the best entry of that entry's column is matched there; repeat until no candidate entry is left. Each
   round matches at least the largest remaining entry, so this is the greedy matching of the candidate graph
   (entries taken in decreasing order, each when its row and column are both free), computed in parallel.
3. The rows left (every candidate column was taken by a larger entry) start again at step 1 on the matrix of
   those rows and the free columns, whose candidates are all free; once a row's candidates are every free column,
   step 2 matches every row left. So every row is matched (a complete matching of the smaller side).

Every step reads entries by value only: permuting the rows or the columns of the matrix permutes the matching
the same way (equivariance), which is the property the p-values rest on. Exact ties are broken by index (the lower
row, the earlier candidate); on continuous data they do not occur, and the unit screen (scanner.stats.degenerate)
removes the all-zero and duplicated units that would make them.

Inputs: a numpy array (computed on the CPU through torch, sharing its memory) or a torch tensor on any device
(computed there; only the matching comes back). Entries must be finite (a NaN or an infinity raises ValueError).
"""

from __future__ import annotations

from typing import Any

import numpy as np

CANDIDATES = 16
"""Each row's candidates per stage (bench/bench_matching_rule.py compares others)."""


def greedy_matching(similarity: Any, *, candidates: int = CANDIDATES) -> np.ndarray:
    """Each row's column under the greedy rule (module docstring), for a (rows, cols) matrix with rows <= cols."""
    import torch

    s = similarity if torch.is_tensor(similarity) else torch.from_numpy(np.ascontiguousarray(similarity))
    if s.ndim != 2:
        raise ValueError(f"similarity must be 2-D, got shape {tuple(s.shape)}")
    n, m = s.shape
    if n > m:
        raise ValueError(f"the greedy matching needs rows <= cols, got {n}x{m}; pass the transpose")
    if candidates < 1:
        raise ValueError(f"candidates must be >= 1, got {candidates}")
    column = torch.full((n,), -1, dtype=torch.int64, device=s.device)
    free_column = torch.ones(m, dtype=torch.bool, device=s.device)
    rows = torch.arange(n, device=s.device)
    while rows.numel():
        if rows.numel() == n:  # the first stage: every row, every column
            values, columns = torch.topk(s, min(candidates, m), dim=1)
        else:
            free = torch.nonzero(free_column).flatten()
            values, positions = torch.topk(s[rows][:, free], min(candidates, free.numel()), dim=1)
            columns = free[positions]
        if not bool(torch.isfinite(values).all()):
            raise ValueError("similarity contains NaN or infinite entries")
        matched = _mutual_best_rounds(values, columns, free_column)
        column[rows] = torch.as_tensor(matched, device=s.device)
        rows = rows[column[rows] < 0]
    return column.cpu().numpy()


def _mutual_best_rounds(values: Any, columns: Any, free_column: Any) -> Any:
    """The greedy matching of the candidate graph (row i may take column columns[i, c] at values[i, c]): each row's
    column, -1 for a row whose candidates were all taken. Marks the taken columns in ``free_column``.

    The candidate entries are kept as flat arrays, and every step is a gather or a scatter over them (a reduction
    over each row's few candidates is many times slower); numpy on a CPU, torch elsewhere (``Ops``)."""
    ops = Ops(values.device)
    values, columns, free_column_here = ops.here(values), ops.here(columns), ops.here(free_column)
    (n, k), width = values.shape, free_column_here.shape[0]
    out = ops.full(n, -1)
    owner = ops.repeat(n, k)  # each entry's row
    columns, values = columns.reshape(-1), values.reshape(-1)
    unmatched = ops.full(n, True)
    while True:
        live = free_column_here[columns] & unmatched[owner]  # entries whose row and column are both free
        owner, columns, values = owner[live], columns[live], values[live]
        if owner.shape[0] == 0:
            return out
        row_best = ops.reduce(n, owner, values, "max")
        column_best = ops.reduce(width, columns, values, "max")
        mutual = (values == row_best[owner]) & (values == column_best[columns])
        # exact ties: one entry per column (the lower row), then one per row (the lower column)
        for key, other, size in ((columns, owner, width), (owner, columns, n)):
            mutual &= other == ops.reduce(size, key[mutual], other[mutual], "min")[key]
        if not bool(mutual.any()):  # impossible: the largest entry left is always mutual-best
            raise RuntimeError("the greedy matching made no progress")
        out[owner[mutual]] = columns[mutual]
        free_column_here[columns[mutual]] = False
        unmatched[owner[mutual]] = False


class Ops:
    """The rounds' array operations for the device the candidates live on: numpy for a CPU, torch for any other.

    Why two: torch's CPU kernels for arrays this small cost 5-25 times numpy's (its threads wait on each other on a
    busy 2-core machine: 14 ms against 0.1 ms for one gather of 176,000 entries, measured), while on a GPU torch is
    the only choice. Indexing and arithmetic read the same in both; what differs is here.
    """

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device, self.numpy = torch, device, device.type == "cpu"

    def here(self, tensor: Any) -> Any:
        """A torch tensor (on this device) as this backend's array (shared memory on a CPU)."""
        return tensor.numpy() if self.numpy else tensor

    def full(self, size: int, value: int | bool) -> Any:
        if self.numpy:
            return np.full(size, value)
        return self.torch.full((size,), value, device=self.device)

    def repeat(self, n: int, k: int) -> Any:
        """0, ..., 0, 1, ..., 1, ...: each of n rows k times."""
        if self.numpy:
            return np.repeat(np.arange(n), k)
        return self.torch.arange(n, device=self.device).repeat_interleave(k)

    def reduce(self, size: int, index: Any, values: Any, how: str) -> Any:
        """out[j] = max (or min) of values[index == j]; -inf (max) or a value above any index (min) where none."""
        start = -np.inf if how == "max" else np.iinfo(np.int64).max
        if self.numpy:
            out = np.full(size, start, dtype=values.dtype)
            (np.maximum if how == "max" else np.minimum).at(out, index, values)
            return out
        out = self.torch.full((size,), start, dtype=values.dtype, device=self.device)
        return out.scatter_reduce_(0, index, values, "amax" if how == "max" else "amin")
