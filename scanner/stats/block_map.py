"""Which block of model B derives from which block of model A, from the matrix of per-pair p-values.

Pure functions of a (L_A, L_B) matrix of log10 p-values. Testing every block pair is L_A * L_B tests,
so each p-value is Bonferroni-corrected (multiplied by L_A * L_B, capped at 1) before it is compared
with the threshold: the chance that an independent pair of models maps any block at all is at most
10**threshold. Among the significant pairs, the map is either

* monotone (default): the order-preserving one-to-one map (i and j both strictly increasing) with
  the largest total evidence sum(-corrected log10 p), found by dynamic programming in O(L_A * L_B).
  Pruning, fine-tuning and merging keep the order of the blocks that survive, so a depth-pruned
  model maps to exactly its kept blocks even when a removed block looks faintly like a kept one; or
* any order: every block of B to its most significant block of A, independently (several B blocks
  may share an A block), for models that repeat or reorder blocks (e.g. depth up-scaling).
"""

from __future__ import annotations

import math

import numpy as np


def bonferroni_log10(log10_p: np.ndarray) -> np.ndarray:
    """log10 of min(1, p * number of tests), where every entry of the matrix is one test."""
    log10_p = np.asarray(log10_p, dtype=np.float64)
    return np.minimum(0.0, log10_p + math.log10(max(1, log10_p.size)))


def block_map(log10_p: np.ndarray, threshold_log10: float = -2.0, *, monotone: bool = True) -> list[tuple[int, int]]:
    """(layer_a, layer_b) pairs whose Bonferroni-corrected log10 p is <= threshold_log10, sorted by layer_b."""
    corrected = bonferroni_log10(log10_p)
    if corrected.ndim != 2:
        raise ValueError(f"block_map needs a (L_A, L_B) matrix, got shape {corrected.shape}")
    if not math.isfinite(threshold_log10) or threshold_log10 >= 0:
        raise ValueError(f"threshold_log10 must be a finite log10 probability below 0, got {threshold_log10}")
    significant = corrected <= threshold_log10
    if not monotone:
        pairs = []
        for j in np.flatnonzero(significant.any(axis=0)):
            column = np.where(significant[:, j], corrected[:, j], np.inf)
            pairs.append((int(np.argmin(column)), int(j)))
        return pairs
    return _monotone_map(np.where(significant, -corrected, -np.inf))


def _monotone_map(weight: np.ndarray) -> list[tuple[int, int]]:
    """Maximum-weight strictly order-preserving partial matching (a weighted longest common subsequence).

    best[i, j] is the best total using A blocks < i and B blocks < j; -inf weights are never taken.
    Ties prefer skipping, so a pair is taken only when it adds evidence.
    """
    rows, cols = weight.shape
    best = np.zeros((rows + 1, cols + 1))
    for i in range(rows):
        for j in range(cols):
            take = best[i, j] + weight[i, j]
            best[i + 1, j + 1] = max(best[i, j + 1], best[i + 1, j], take)
    pairs = []
    i, j = rows, cols
    while i > 0 and j > 0:
        if best[i, j] == best[i - 1, j]:
            i -= 1
        elif best[i, j] == best[i, j - 1]:
            j -= 1
        else:
            pairs.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return pairs[::-1]
