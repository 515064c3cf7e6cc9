"""MATCH (Algorithm 2): align the hidden units of two layers on the cosine similarity of their rows.

The paper matches by the maximum-weight assignment (``exact``, certified optimal by scanner.stats.assignment). The
greedy matching (``greedy``, scanner.stats.assignment.greedy) keeps what the p-values need (a function of one
similarity matrix, the same whatever order the units come in) at about the cost of reading the matrix once, on the
matrix's own device, but pairs related units a little worse. hubtrace's default (``screened``) matches every block
greedily and, where that already finds the block related, matches it again exactly: unrelated blocks (the expensive
ones for the exact solver) cost a greedy matching, related ones (cheap for it) get the paper's matching, p-value and
closeness. Why each keeps the p-values valid: docs/statistics.md, "The matching rule".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
from scipy.stats import rankdata

from scanner.stats.assignment import max_weight_assignment
from scanner.stats.assignment.greedy import greedy_matching

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

    With ``device`` None: a float32 numpy array computed on the CPU (the product by torch, whose CPU kernels ran
    about 3x numpy's on the project's 2-core VMs, BENCHMARKS.md). With a torch device (``"cuda"``; a and b numpy
    arrays or torch tensors, e.g. already resident there): a float32 torch tensor on it, which ``match_similarity``
    matches there (only the matching, or for the exact rule the candidates, reach the CPU). Rows of any finite
    magnitude (1e-30 or 1e30) give the same cosines.
    """
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"MATCH needs two matrices with equal column counts, got {a.shape} and {b.shape}")
    import torch

    if device is None:
        similarity = (torch.from_numpy(unit_rows(a)) @ torch.from_numpy(unit_rows(b)).T).numpy()
        return np.abs(similarity, out=similarity) if sign_free else similarity

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


MatchingRule = Literal["screened", "greedy", "exact"]
"""How MATCH pairs units (module docstring): ``screened`` (default) greedily, then exactly where the statistic on the
greedy matchings reaches SCREEN_LOG10_P; ``greedy`` greedily only (the fastest, a GPU never waits on the host; a
little less power and closeness on related models); ``exact`` the paper's maximum-weight assignment, for disputes.
Every matching is complete on the smaller side and a function of its one matrix that permutes with its rows and
columns."""
MATCHING_RULES: tuple[str, ...] = get_args(MatchingRule)
SCREEN_LOG10_P = -1.0
"""``screened``: a statistic whose greedy matchings give log10 p at most this is computed again on exact ones (and
reports that p-value); above it, the greedy one stands. Unrelated blocks reach it one time in ten."""


def match(a: np.ndarray, b: np.ndarray, rule: MatchingRule = "screened") -> Matching:
    """MATCH on the rows' cosine similarity (rectangular: every smaller-side row is paired)."""
    return match_similarity(cosine_similarity_matrix(a, b), rule)


def match_similarity(similarity: Any, rule: MatchingRule = "screened") -> Matching:
    """MATCH on a precomputed (a_rows, b_rows) similarity matrix (numpy array, or torch tensor on any device). With no
    statistic to screen on, ``screened`` matches exactly (a unit map of blocks already found related)."""
    if rule not in MATCHING_RULES:
        raise ValueError(f"unknown matching rule {rule!r}; choose one of {', '.join(MATCHING_RULES)}")
    a_rows, b_rows = similarity.shape
    if a_rows <= b_rows:
        a_index, b_index = _matched(similarity, rule)
    else:
        b_index, a_index = _matched(similarity.T, rule)
    return Matching(a_index=np.asarray(a_index), b_index=np.asarray(b_index), a_rows=a_rows, b_rows=b_rows)


def _matched(similarity: Any, rule: MatchingRule) -> tuple[np.ndarray, np.ndarray]:
    """(rows, their columns) for a matrix with rows <= cols, every row matched."""
    if rule == "greedy":
        return np.arange(similarity.shape[0]), greedy_matching(similarity)
    return max_weight_assignment(similarity)


def match_for(similarities: Sequence[Any], log10_p: Callable[[list[Matching]], float],
              rule: MatchingRule = "screened") -> list[Matching]:
    """MATCH of each of one statistic's matrices (phi_MATCH: gate and up; phi_U, phi_H: one) under ``rule``;
    ``log10_p``: the statistic's log10 p from those matchings, which ``screened`` reads on the greedy ones to decide
    whether to match exactly (SCREEN_LOG10_P). The reported p-value is then the exact matchings' where the greedy
    one is at most SCREEN_LOG10_P, else the greedy one: valid whatever the two p-values' joint law
    (docs/statistics.md, "The matching rule")."""
    if rule == "screened":
        greedy = [match_similarity(s, "greedy") for s in similarities]
        if log10_p(greedy) > SCREEN_LOG10_P:
            return greedy
    return [match_similarity(s, "greedy" if rule == "greedy" else "exact") for s in similarities]


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
