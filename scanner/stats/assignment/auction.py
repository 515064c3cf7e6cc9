"""A batched auction solver on torch: many square assignments at once on a GPU, each certified by duality.

Why: the certified sparse solve (``solve``) runs on one host core; a 7B pair compared on every block needs 64
assignments of 11008 x 11008, about a second each there, while a GPU holds all 64 matrices at once. Bertsekas'
forward auction is the assignment method that maps onto a GPU: every unassigned row bids in parallel.

How (all problems of the batch advance together, one tensor operation per step):

* Prices p_j (float64) start at 0. A phase has a step eps; a row i is content when its column x(i) is within eps
  of its best offer, s_{i,x(i)} - p_{x(i)} >= max_j (s_ij - p_j) - eps (eps-complementary slackness). Every other
  row bids for its best column j1 at p_{j1} + (v1 - v2) + eps (v1, v2: its best and second-best offers); each
  column goes to its highest bidder (ties: the highest row index), whose previous holder becomes a bidder.
* eps-scaling: eps starts at scale / 16 and shrinks 16-fold per phase down to TOL_REL * scale; a phase keeps the
  prices and the content rows of the last, so late phases move few rows.
* Certificate (weak duality, as in ``certificate``): with u_i = max_j (s_ij - p_j), (u, p) is feasible for the
  dual of the dense LP (u_i + p_j >= s_ij, p >= 0), so every assignment totals at most sum u + sum p, while ours
  totals sum u + sum p - sum slack_i (slack_i = u_i - s_{i,x(i)} + p_{x(i)} >= 0). The assignment is returned as
  certified when sum slack <= n * tol (tol = TOL_REL * scale, the sparse solve's tolerance), so gap_bound =
  sum slack + n * tol covers rounding in the float64 arithmetic as well; it is the sparse certificate's bound.
  A problem the auction does not settle within its iteration budget, or whose certificate fails, comes back
  uncertified and the caller solves it on the host (``solve_assignment``): no uncertified answer is returned.

Scope: square problems with finite entries (MATCH's equal-width blocks; pruned widths go to the host solver).
Ties: as for the host solver, where several assignments are optimal within gap_bound any one may be returned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from scanner.stats.assignment.certificate import TOL_REL

SCALING = 16.0
"""eps shrinks by this factor per phase (bench/bench_auction.py --scaling compares others)."""
_CHUNK_ELEMENTS = 1 << 27
"""float64 offers computed at once (1 GiB): bounds the solver's working memory whatever the batch."""


@dataclass(frozen=True)
class AuctionOutcome:
    """Per problem: each row's column, whether it is certified, and the certified bound on its loss."""

    columns: np.ndarray        # (batch, n) int64
    certified: np.ndarray      # (batch,) bool
    gap_bound: np.ndarray      # (batch,) float64: total >= dense optimum - gap_bound (certified problems)
    iterations: int            # bidding rounds, all phases (the batch moves together)
    phases: int
    seconds: float


def auction_assignments(similarity: Any, *, max_iterations: int = 20000, scaling: float = SCALING) -> AuctionOutcome:
    """Maximum-weight assignments of a (batch, n, n) torch tensor on any device, each certified or flagged.

    ``similarity`` holds finite float32 or float64 entries, n >= 2; row i of problem b goes to columns[b, i].
    """
    import torch

    started = time.perf_counter()
    if similarity.ndim != 3 or similarity.shape[1] != similarity.shape[2] or similarity.shape[1] < 2:
        raise ValueError(f"the auction solves square problems of n >= 2 in a (batch, n, n) tensor, "
                         f"got {tuple(similarity.shape)}")
    s = similarity
    if not bool(torch.isfinite(s).all()):
        raise ValueError("similarity contains NaN or infinite entries")
    batch, n, _ = s.shape
    scale = s.abs().amax(dim=(1, 2)).double().clamp_min(torch.finfo(torch.float64).tiny)
    final_eps = TOL_REL * scale
    eps = scale / scaling
    state = _Auction(s, torch.zeros(batch, n, dtype=torch.float64, device=s.device))
    phases = 0
    while state.iterations <= max_iterations:
        phases += 1
        offers = state.start_phase(eps)
        while offers is not None and state.iterations <= max_iterations:
            state.bid(offers, eps)
            offers = state.offers_of_free_rows()
        if bool((eps <= final_eps).all()):
            break
        eps = torch.maximum(eps / scaling, final_eps)
    columns, certified, gap_bound = state.certify(scale)
    return AuctionOutcome(columns.cpu().numpy(), certified.cpu().numpy(), gap_bound.cpu().numpy(),
                          state.iterations, phases, time.perf_counter() - started)


class _Auction:
    """The auction's state over a batch: prices, each row's column and each column's row (flattened b * n + j)."""

    def __init__(self, s: Any, prices: Any) -> None:
        import torch

        self.torch, self.s, self.prices = torch, s, prices
        batch, n, _ = s.shape
        self.n = n
        self.column = torch.full((batch, n), -1, dtype=torch.int64, device=s.device)
        self.owner = torch.full((batch * n,), -1, dtype=torch.int64, device=s.device)
        self.iterations = 0

    def offers(self, b: Any, i: Any) -> tuple[Any, Any, Any]:
        """Best offer v1 = max_j (s_ij - p_j), its column j1 and the second-best offer v2 of rows (b, i)."""
        torch = self.torch
        chunk = max(1, _CHUNK_ELEMENTS // self.n)
        best, col, second = [], [], []
        for start in range(0, b.numel(), chunk):
            bb, ii = b[start:start + chunk], i[start:start + chunk]
            values = self.s[bb, ii].double() - self.prices[bb]
            top = torch.topk(values, 2, dim=1)
            best.append(top.values[:, 0])
            second.append(top.values[:, 1])
            col.append(top.indices[:, 0])
        return torch.cat(best), torch.cat(col), torch.cat(second)

    def matched_offers(self) -> Any:
        """s_{i,x(i)} - p_{x(i)} of every row (-inf for rows without a column)."""
        torch = self.torch
        x = self.column.clamp_min(0)
        values = torch.gather(self.s, 2, x[:, :, None])[:, :, 0].double() - torch.gather(self.prices, 1, x)
        return torch.where(self.column >= 0, values, torch.full_like(values, -float("inf")))

    def all_rows(self) -> tuple[Any, Any]:
        batch, n = self.column.shape
        b = self.torch.arange(batch, device=self.s.device).repeat_interleave(n)
        return b, self.torch.arange(n, device=self.s.device).repeat(batch)

    def all_offers(self) -> tuple[Any, Any, Any]:
        """``offers`` of every row, in row order, read through views of each problem (no gathered copies)."""
        torch = self.torch
        chunk = max(1, _CHUNK_ELEMENTS // self.n)
        best, col, second = [], [], []
        for b in range(self.s.shape[0]):
            for start in range(0, self.n, chunk):
                top = torch.topk(self.s[b, start:start + chunk].double() - self.prices[b], 2, dim=1)
                best.append(top.values[:, 0])
                second.append(top.values[:, 1])
                col.append(top.indices[:, 0])
        return torch.cat(best), torch.cat(col), torch.cat(second)

    def start_phase(self, eps: Any) -> tuple | None:
        """Free every row not eps-content at the new eps; return the free rows and their offers (None if none)."""
        b, i = self.all_rows()
        best, col, second = self.all_offers()
        discontent = best - self.matched_offers().flatten() > eps[b]
        flat = b * self.n + self.column.flatten()
        self.owner[flat[discontent & (self.column.flatten() >= 0)]] = -1
        self.column.view(-1)[discontent] = -1
        if not bool(discontent.any()):
            return None
        return b[discontent], i[discontent], best[discontent], col[discontent], second[discontent]

    def offers_of_free_rows(self) -> tuple | None:
        b, i = self.torch.nonzero(self.column < 0, as_tuple=True)
        if b.numel() == 0:
            return None
        return (b, i, *self.offers(b, i))

    def bid(self, offers: tuple, eps: Any) -> None:
        """One round: each free row bids for its best column; each column goes to its highest bidder."""
        torch = self.torch
        self.iterations += 1
        b, i, best, col, second = offers
        obj = b * self.n + col
        price = self.prices.view(-1)
        amount = price[obj] + (best - second) + eps[b]
        highest = torch.full_like(price, -float("inf")).scatter_reduce_(0, obj, amount, "amax")
        top = amount == highest[obj]
        winner = torch.full_like(self.owner, -1).scatter_reduce_(0, obj[top], i[top], "amax")
        won = top & (i == winner[obj])
        b, i, obj = b[won], i[won], obj[won]
        previous = self.owner[obj]
        had = previous >= 0
        self.column[b[had], previous[had]] = -1
        self.owner[obj] = i
        self.column[b, i] = obj - b * self.n
        price[obj] = amount[won]

    def certify(self, scale: Any) -> tuple[Any, Any, Any]:
        """(columns, certified, gap_bound) from the duality argument in the module docstring."""
        torch = self.torch
        best, _, _ = self.all_offers()
        slack = (best - self.matched_offers().flatten()).view(self.column.shape)
        assigned = (self.column >= 0).all(dim=1)
        gap = torch.where(self.column >= 0, slack, torch.zeros_like(slack)).sum(dim=1)
        tol = TOL_REL * torch.maximum(scale, self.prices.amax(dim=1))
        certified = assigned & (gap <= self.n * tol)
        return self.column, certified, gap + self.n * tol
