"""MATCH (Algorithm 2): align the hidden units of two layers by maximum total cosine similarity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.stats import rankdata

from scanner.stats.assignment import max_weight_assignment
from scanner.stats.assignment.auction import auction_assignments

_NORM_FLOOR = 1e-12


@dataclass(frozen=True)
class Matching:
    """Matched row pairs: row a_index[k] of the first matrix goes with row b_index[k] of the second.

    Pairs are ordered by the smaller side's row index (the first side when both are equal), so two
    matchings of the same pair of layers line up element by element.
    """

    a_index: np.ndarray
    b_index: np.ndarray
    a_rows: int
    b_rows: int

    @property
    def size(self) -> int:
        return int(self.a_index.size)

    @property
    def smaller_side(self) -> np.ndarray:
        return self.a_index if self.a_rows <= self.b_rows else self.b_index

    @property
    def larger_side(self) -> np.ndarray:
        return self.b_index if self.a_rows <= self.b_rows else self.a_index


def cosine_similarity_matrix(a: Any, b: Any, *, device: str | None = None, sign_free: bool = False) -> Any:
    """Cosine similarity between every row of a and every row of b; all-zero rows score 0. ``sign_free``: its absolute
    value, for a view whose sign an output-preserving change can flip unit by unit (a gated MLP's up output: negating
    a unit's up row and its down column leaves the model's outputs as they were).

    With ``device`` None: a float32 numpy array computed on the CPU. With a torch device (``"cuda"``; a and b numpy
    arrays or torch tensors, e.g. already resident there): a float32 torch tensor on it, which the solvers accept
    as is (``match_similarities`` solves such matrices there; ``match_similarity`` selects candidates there, and
    only candidates reach the CPU). Rows of any finite magnitude (1e-30 or 1e30) give the same cosines.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"MATCH needs two matrices with equal column counts, got {a.shape} and {b.shape}")
    if device is None:
        similarity = unit_rows(a) @ unit_rows(b).T
        return np.abs(similarity, out=similarity) if sign_free else similarity
    import torch

    a_t, b_t = (unit_rows_tensor(torch.as_tensor(x if torch.is_tensor(x) else np.asarray(x), device=device).float())
                for x in (a, b))
    similarity = a_t @ b_t.T
    return similarity.abs_() if sign_free else similarity


def unit_rows(a: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length in float32 (all-zero rows stay zero): cosines are then dot products.

    Each row is divided by its largest magnitude before its norm is taken, so no finite row overflows (a row of
    1e30s would square to inf in float32) or underflows (1e-30s square to 0). Callers comparing one layer against
    many (localized testing) normalise once and reuse the result.
    """
    a = np.asarray(a, dtype=np.float32)
    peak = np.abs(a).max(axis=1, keepdims=True) if a.shape[1] else np.zeros((a.shape[0], 1), dtype=np.float32)
    a = a / np.where(peak > 0, peak, 1.0)
    return a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), _NORM_FLOOR)


def unit_rows_tensor(a: Any) -> Any:
    """`unit_rows` for a torch tensor, in its own dtype and on its own device."""
    import torch

    peak = a.abs().amax(dim=1, keepdim=True) if a.shape[1] else torch.zeros_like(a[:, :1])
    a = a / torch.where(peak > 0, peak, torch.ones_like(peak))
    return a / torch.linalg.vector_norm(a, dim=1, keepdim=True).clamp_min(_NORM_FLOOR)


def match(a: np.ndarray, b: np.ndarray) -> Matching:
    """MATCH: the assignment of rows maximising total cosine similarity (rectangular: every smaller-side row)."""
    return match_similarity(cosine_similarity_matrix(a, b))


def match_similarity(similarity: Any) -> Matching:
    """MATCH on a precomputed (a_rows, b_rows) similarity matrix (numpy array, or torch tensor on any device)."""
    a_rows, b_rows = similarity.shape
    if a_rows <= b_rows:
        a_index, b_index = max_weight_assignment(similarity)
    else:
        b_index, a_index = max_weight_assignment(similarity.T)
    return Matching(a_index=np.asarray(a_index), b_index=np.asarray(b_index), a_rows=a_rows, b_rows=b_rows)


AssignmentSolver = Literal["auto", "host", "auction"]
"""Who solves MATCH's assignments: ``host`` the certified sparse solver (one CPU core per matrix), ``auction`` the
batched auction on the matrices' own device (scanner.stats.assignment.auction), ``auto`` the host solver: measured
on an H200 it beat the auction on a GPU too (BENCHMARKS.md, "GPU auction"). Every answer is certified optimal; only
the time differs."""


def match_similarities(similarities: Sequence[Any], solver: AssignmentSolver = "auto") -> list[Matching]:
    """``[match_similarity(s) for s in similarities]``, with the square torch matrices of one shape solved together
    by the auction where ``solver`` asks for it; any the auction cannot certify are solved on the host."""
    out: list[Matching | None] = [None] * len(similarities)
    groups: dict[tuple, list[int]] = {}
    for k, s in enumerate(similarities):
        if _auction_solves(s, solver):
            groups.setdefault((tuple(s.shape), str(s.device), s.dtype), []).append(k)
    for members in groups.values():
        import torch

        outcome = auction_assignments(torch.stack([similarities[k] for k in members]))
        rows = np.arange(similarities[members[0]].shape[0])
        for k, columns, certified in zip(members, outcome.columns, outcome.certified, strict=True):
            if certified:
                out[k] = Matching(a_index=rows, b_index=columns, a_rows=rows.size, b_rows=rows.size)
    return [m if m is not None else match_similarity(s) for m, s in zip(out, similarities, strict=True)]


def _auction_solves(similarity: Any, solver: AssignmentSolver) -> bool:
    if solver != "auction" or type(similarity).__module__.split(".")[0] != "torch":
        return False
    rows, cols = similarity.shape
    return rows == cols and rows >= 2


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation; 0 when either side is constant (no evidence either way)."""
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"Spearman needs two equal-length vectors, got {x.shape} and {y.shape}")
    rx = rankdata(x) - (x.size + 1) / 2.0
    ry = rankdata(y) - (y.size + 1) / 2.0
    denominator = float(np.sqrt((rx @ rx) * (ry @ ry)))
    if denominator == 0.0:
        return 0.0
    return float(np.clip((rx @ ry) / denominator, -1.0, 1.0))
