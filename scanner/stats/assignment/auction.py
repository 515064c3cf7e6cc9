"""The candidate auction: MATCH's default rule, near the maximum-weight assignment at about the cost of the matrix.

Why: phi_MATCH needs each view's matching to be a function of that view alone, the same whatever order either
side's units come in (docs/statistics.md, "The matching rule"); it does not need the maximum-weight assignment,
whose certified solve (``solve``) costs a near-flat 11008 x 11008 matrix (two unrelated models) about twice the
matrix product on a CPU, on one host core while a GPU waits. The greedy matching (``greedy``) is cheaper still but
pairs distant relatives' units worse (a unit's mean cosine 0.006 below the optimum on the zoos' 128-unit blocks),
which lowers their closeness and their power. An auction with a bounded number of bidding rounds comes within
about 3e-4 of the optimum per unit, on whichever device holds the matrix.

The rule, for a (rows, cols) matrix with rows <= cols:

1. Candidates: each row's ``candidates`` largest entries (one top-k pass over the matrix).
2. Bertsekas' forward auction over the candidates, every unassigned row bidding at once: a row bids for its best
   candidate j (value minus price) at price_j + (best - second best) + eps, each column goes to its highest
   bidder, whose predecessor bids again. eps shrinks ``scaling``-fold per phase from the candidates' spread over
   ``scaling`` down to ``final_eps`` times their largest magnitude; a phase starts by freeing the rows no longer
   within eps of their best offer and ends when every row holds a column or after ``rounds`` rounds.
3. The rows left without a column (a phase's round budget spent, or candidates all held by others) are matched
   among the free columns by the greedy matching (``greedy``), so the matching is complete.

The result is a deterministic function of the matrix's entries: bids, comparisons and the greedy completion read
values only, so permuting the rows or the columns permutes the matching the same way (exact ties, which the unit
screen removes, are broken by index). The budget makes the cost predictable: at most ``rounds`` rounds per phase,
each a few gathers and scatters over the free rows' candidates (numpy on a CPU, torch elsewhere).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scanner.stats.assignment.arrays import Ops
from scanner.stats.assignment.greedy import greedy_matching

CANDIDATES = 16
"""Each row's candidates (bench/bench_matching_rule.py --cost compares others)."""
FINAL_EPS = 1e-3
"""The last phase's bid increment, relative to the largest candidate value (a cosine: 1)."""
SCALING = 4.0
"""eps shrinks this many times per phase."""
ROUNDS = 100
"""Bidding rounds per phase at most (the rows still bidding then wait for the next phase, or the completion)."""


def auction_matching(similarity: Any, *, candidates: int = CANDIDATES, final_eps: float = FINAL_EPS,
                     scaling: float = SCALING, rounds: int = ROUNDS) -> np.ndarray:
    """Each row's column under the candidate auction (module docstring), for a (rows, cols) matrix with rows <= cols:
    a numpy array or a torch tensor on any device (computed there; only the matching comes back)."""
    import torch

    s = similarity if torch.is_tensor(similarity) else torch.from_numpy(np.ascontiguousarray(similarity))
    if s.ndim != 2:
        raise ValueError(f"similarity must be 2-D, got shape {tuple(s.shape)}")
    n, m = s.shape
    if n > m:
        raise ValueError(f"the auction needs rows <= cols, got {n}x{m}; pass the transpose")
    if candidates < 1 or rounds < 1 or scaling <= 1.0 or final_eps <= 0.0:
        raise ValueError("the auction needs candidates >= 1, rounds >= 1, scaling > 1 and final_eps > 0")
    if m <= 1:
        return np.zeros(n, dtype=np.int64)
    values, columns = torch.topk(s, min(max(candidates, 2), m), dim=1)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("similarity contains NaN or infinite entries")
    ops = Ops(s.device)
    column_of, owner = _bid(ops, ops.here(values.double()), ops.here(columns), m, final_eps, scaling, rounds)
    left = ops.nonzero(column_of < 0)
    if left.shape[0]:
        rows, free = (torch.as_tensor(x, device=s.device) for x in (left, ops.nonzero(owner < 0)))
        completed = torch.as_tensor(greedy_matching(s[rows][:, free]), device=s.device)
        column_of[left] = ops.here(free[completed])
    return column_of.cpu().numpy() if torch.is_tensor(column_of) else column_of


def _bid(ops: Ops, values: Any, columns: Any, m: int, final_eps: float, scaling: float,
         rounds: int) -> tuple[Any, Any]:
    """The auction's phases (module docstring, step 2): each row's column and each column's row, -1 where none."""
    n = values.shape[0]
    price = ops.full(m, 0.0, dtype=values.dtype)
    owner, column_of = ops.full(m, -1), ops.full(n, -1)
    scale = float(abs(values).max())
    eps_final = final_eps * max(scale, np.finfo(np.float64).tiny)
    eps = max(eps_final, float(values.max() - values.min()) / scaling)
    while True:
        offers = values - price[columns]
        held = column_of >= 0
        own = ops.row_max(ops.where(columns == column_of[:, None], offers, -np.inf))  # -inf for a row holding none
        unhappy = ops.nonzero(held & (own < ops.row_max(offers) - eps))
        owner[column_of[unhappy]] = -1
        column_of[unhappy] = -1
        for _ in range(rounds):
            free = ops.nonzero(column_of < 0)
            if free.shape[0] == 0:
                break
            first, best, second = ops.top_two(values[free] - price[columns[free]])
            wanted, worth = columns[free, first], values[free, first]
            bid = price[wanted] + (best - second) + eps
            # Equal bids are no accident in an auction (a bid sets a price from other offers, and ties of two offers
            # give the same increment, eps): they go to the row that values the column more, and only an exact tie
            # of the values themselves (the unit screen removes those) to the lower row.
            winner = bid == ops.reduce(m, wanted, bid, "max")[wanted]
            winner &= worth == ops.reduce(m, wanted[winner], worth[winner], "max")[wanted]
            winner &= free == ops.reduce(m, wanted[winner], free[winner], "min")[wanted]
            taken, takers = wanted[winner], free[winner]
            outbid = owner[taken]
            column_of[outbid[outbid >= 0]] = -1
            owner[taken], column_of[takers], price[taken] = takers, taken, bid[winner]
        if eps <= eps_final:
            return column_of, owner
        eps = max(eps / scaling, eps_final)
