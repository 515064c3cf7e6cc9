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
