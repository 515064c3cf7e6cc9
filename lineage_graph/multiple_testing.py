"""Multiple-testing control over pair tests whose p-values live in log10 space.

A hub scan tests thousands of pairs, so a fixed p cut-off would let false "derived" verdicts grow with
the hub. Benjamini–Hochberg (BH) bounds the expected share of false discoveries at q for independent or
positively dependent tests; Benjamini–Yekutieli (BY) holds under any dependence at the price of a
factor c(m) = 1 + 1/2 + ... + 1/m. FDR is the right error rate for a list of dependent pairs, but not for
families: one false edge joins two unrelated families whole, so the edges that form families also pass
Holm's step-down, which bounds the probability of even one false edge at q (any dependence).
Pair p-values of related models reach 1e-5000, far below where a float underflows, so every comparison
here is between logarithms: log10 p(k) <= log10(q k / (m c)).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np
from scipy import special

Method = Literal["bh", "by"]
METHODS: tuple[str, ...] = get_args(Method)


def _log10_harmonic(m: int) -> float:
    """log10 of the BY constant c(m) = sum_{i<=m} 1/i (digamma form, exact for large m too)."""
    return math.log10(float(special.digamma(m + 1)) + float(np.euler_gamma))


def _checked(log10_p: Sequence[float], q: float, method: str) -> tuple[np.ndarray, float]:
    if method not in METHODS:
        raise ValueError(f"unknown FDR method {method!r}; choose one of {', '.join(METHODS)}")
    if not 0.0 < q < 1.0:
        raise ValueError(f"the FDR level q must lie in (0, 1), got {q}")
    x = np.asarray(log10_p, dtype=float)
    if x.ndim != 1:
        raise ValueError("log10 p-values must be a flat sequence")
    if np.isnan(x).any() or (x > 0).any():
        raise ValueError("log10 p-values must be <= 0 and not NaN")
    correction = _log10_harmonic(len(x)) if method == "by" and len(x) else 0.0
    return x, correction


def fdr_reject(log10_p: Sequence[float], *, q: float = 0.05, method: Method = "bh") -> np.ndarray:
    """Which hypotheses the step-up procedure rejects, as a boolean array in the input order.

    Finds the largest rank k with log10 p(k) <= log10(q) + log10(k) - log10(m) [- log10 c(m) for BY]
    and rejects the k smallest p-values; -inf (p = 0) is always rejected when m > 0.
    """
    x, correction = _checked(log10_p, q, method)
    m = len(x)
    reject = np.zeros(m, dtype=bool)
    if m == 0:
        return reject
    order = np.argsort(x, kind="stable")
    ranks = np.arange(1, m + 1)
    thresholds = math.log10(q) + np.log10(ranks) - math.log10(m) - correction
    passing = np.flatnonzero(x[order] <= thresholds)
    if passing.size:
        reject[order[: passing[-1] + 1]] = True
    return reject


def fdr_adjust(log10_p: Sequence[float], *, method: Method = "bh") -> np.ndarray:
    """log10 of the adjusted p-values (BH/BY "q-values"), capped at 0, in the input order.

    adjusted(i) = min over j >= rank(i) of p(j) m c / j: a hypothesis is rejected at level q exactly
    when its adjusted value is <= q, so storing it lets investigators re-cut at any q without a rescan.
    """
    x, correction = _checked(log10_p, 0.5, method)
    m = len(x)
    if m == 0:
        return x.copy()
    order = np.argsort(x, kind="stable")
    scaled = x[order] + math.log10(m) - np.log10(np.arange(1, m + 1)) + correction
    adjusted = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 0.0)
    out = np.empty(m)
    out[order] = adjusted
    return out


def holm_reject(log10_p: Sequence[float], *, alpha: float = 0.05) -> np.ndarray:
    """Holm's step-down at family-wise error rate alpha, as a boolean array in the input order.

    Rejects the k smallest p-values while log10 p(k) <= log10(alpha) - log10(m - k + 1), stopping at the first
    that fails; valid under any dependence between the tests.
    """
    x, _ = _checked(log10_p, alpha, "bh")
    m = len(x)
    reject = np.zeros(m, dtype=bool)
    if m == 0:
        return reject
    order = np.argsort(x, kind="stable")
    thresholds = math.log10(alpha) - np.log10(np.arange(m, 0, -1))
    failing = np.flatnonzero(x[order] > thresholds)
    reject[order[: failing[0] if failing.size else m]] = True
    return reject
