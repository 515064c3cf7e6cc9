"""Views as phi_MATCH reads them: the second view less what it shares with the first (`decoupled_up`), and a first
view read free of each unit's sign (`oriented_rows`).

Why: independently trained models learn some of the same features (on the canonical tokens, a unit that fires on
one token fires on it in both views), and a unit of A and a unit of B that share such a feature then agree in *both*
views, which is what phi_MATCH counts as evidence of shared weights. What a unit's two views share is removed from the
second, so the up matching reads only what the up row adds to the gate row. The projection is the unit's own: it
reads no other unit and not the other model (the null argument holds), a copy has the same residual whatever
output-preserving change it wears (a rescaled or sign-flipped up row rescales or flips its residual; a rescaled gate
row leaves it as it was), and, unlike a map shared by all the units of a block, one coefficient per unit cannot
explain the view away (docs/statistics.md, "On trained models").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scanner.stats.matching import unit_rows, unit_rows_tensor


def decoupled_up(gate: Any, up: Any) -> Any:
    """Rows of ``up`` (units, tokens) less their projection on the matching rows of ``gate``, as float32, numpy or
    torch as given. Both are first brought to unit length (`unit_rows`: any finite scale gives the same directions
    without overflow); a unit whose gate row is all zero keeps its up row."""
    if hasattr(up, "cpu"):  # a torch tensor, e.g. resident on a pair worker's GPU
        g, u = unit_rows_tensor(gate.float()), unit_rows_tensor(up.float())
        return u - (u * g).sum(dim=1, keepdim=True) * g
    g, u = unit_rows(gate), unit_rows(up)
    return u - np.einsum("ij,ij->i", u, g)[:, None] * g


def oriented_rows(rows: Any) -> Any:
    """Rows (units, tokens) each turned so that its mean over the tokens is positive (a zero mean stays), numpy or
    torch as given, in their dtype.

    Why: where act(z) - act(-z) = z (SiLU, GELU, ReLU), a plain unit (k, b; w) computes what (-k, -b; w) and a linear
    map do, and a copier may negate any unit's first view at no cost (scanner.reading.canonical_mlp cancels the units
    that write the linear remainder). The rule reads the unit's own row only, so a negated unit's turned row is the
    original's and the null argument holds; a unit whose mean is near zero may turn differently in a relative, so a
    plain MLP's first view is matched both as stored and turned (scanner.stats.independence)."""
    if hasattr(rows, "cpu"):
        import torch

        turn = torch.where(rows.float().mean(dim=1, keepdim=True) < 0, -1.0, 1.0)
        return rows * turn.to(rows.dtype)
    turn = np.where(np.asarray(rows, dtype=np.float32).mean(axis=1, keepdims=True) < 0, -1.0, 1.0)
    return (rows * turn).astype(rows.dtype, copy=False)
