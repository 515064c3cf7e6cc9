"""The greedy matching: MATCH's default rule, at about the cost of reading the similarity matrix once.

Why: phi_MATCH needs each view's matching to be a function of that view alone, the same whatever order either
side's units come in (docs/statistics.md, "The matching rule"); it does not need the maximum-weight assignment. The
exact assignment of a near-flat 11008 x 11008 matrix (two independent models) costs seconds on one host core, while
the matrix itself is a GPU's fraction of a second; this rule costs one top-k pass over the matrix and a few passes
over its candidates, on whichever device holds the matrix.

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
        if rows.numel() == n:
            values, positions = torch.topk(s, min(candidates, m), dim=1)
            columns = positions
        else:
            free = torch.nonzero(free_column).flatten()
            values, positions = torch.topk(s[rows][:, free], min(candidates, free.numel()), dim=1)
            columns = free[positions]
        if not bool(torch.isfinite(values).all()):
            raise ValueError("similarity contains NaN or infinite entries")
        matched = _mutual_best_rounds(rows, values, columns, free_column)
        column[rows] = matched
        rows = rows[matched < 0]
    return column.cpu().numpy()


def _mutual_best_rounds(rows: Any, values: Any, columns: Any, free_column: Any) -> Any:
    """The greedy matching of the candidate graph (rows[i] may take columns[i, c] at values[i, c]): each row's
    column, -1 for a row whose candidates were all taken. Marks the taken columns in ``free_column``."""
    import torch

    out = torch.full((rows.numel(),), -1, dtype=torch.int64, device=rows.device)
    index = torch.arange(rows.numel(), device=rows.device)  # positions in ``out`` of the rows still in play
    width = free_column.numel()
    while index.numel():
        offered = torch.where(free_column[columns], values, torch.full_like(values, -torch.inf))
        best, at = offered.max(dim=1)
        live = best > -torch.inf
        if not bool(live.all()):  # rows whose candidates were all taken leave the rounds
            index, values, columns, offered, best, at = (x[live] for x in (index, values, columns, offered, best, at))
            if index.numel() == 0:
                break
        column_best = torch.full((width,), -torch.inf, dtype=offered.dtype, device=offered.device)
        column_best.scatter_reduce_(0, columns.flatten(), offered.flatten(), "amax")
        chosen = columns.gather(1, at[:, None])[:, 0]
        mutual = best == column_best[chosen]
        # an exact tie of two rows for one column: the lower row is matched, the other tries again next round
        first = torch.full((width,), out.numel(), dtype=torch.int64, device=index.device)
        first.scatter_reduce_(0, chosen[mutual], index[mutual], "amin")
        mutual &= first[chosen] == index
        if not bool(mutual.any()):  # impossible: the largest candidate entry left is always mutual-best
            raise RuntimeError("the greedy matching made no progress")
        out[index[mutual]] = chosen[mutual]
        free_column[chosen[mutual]] = False
        keep = ~mutual
        index, values, columns = index[keep], values[keep], columns[keep]
    return out
