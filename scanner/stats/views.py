"""The second view as phi_MATCH reads it: each unit's up (second) activations less their projection on the same
unit's gate (first) activations.

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


def decoupled_up(gate: Any, up: Any) -> Any:
    """Rows of ``up`` (units, tokens) less their projection on the matching rows of ``gate``, as float32, numpy or
    torch as given. Rows are first brought to a peak of 1 (any finite scale gives the same directions without
    overflow); a unit whose gate row is all zero keeps its up row."""
    if hasattr(up, "cpu"):  # a torch tensor, e.g. resident on a pair worker's GPU
        g, u = (_peak_rows_tensor(x.float()) for x in (gate, up))
        beta = (u * g).sum(1, keepdim=True) / (g * g).sum(1, keepdim=True).clamp_min(1e-30)
        return u - beta * g
    g, u = (_peak_rows(np.asarray(x)).astype(np.float32, copy=False) for x in (gate, up))
    beta = np.einsum("ij,ij->i", u, g)[:, None] / np.maximum(np.einsum("ij,ij->i", g, g)[:, None], 1e-30)
    return u - beta * g


def _peak_rows(rows: np.ndarray) -> np.ndarray:
    """Rows over their largest magnitude, in the rows' own precision (float16 rows as float32)."""
    rows = rows.astype(np.promote_types(rows.dtype, np.float32), copy=False)
    peak = np.abs(rows).max(axis=1, keepdims=True)
    return rows / np.where(peak > 0, peak, 1.0)


def _peak_rows_tensor(rows: Any) -> Any:
    peak = rows.abs().amax(dim=1, keepdim=True)
    return rows / peak.masked_fill(peak == 0, 1.0)
