"""Tail probabilities computed in log space.

Dependent checkpoints give p-values like 1e-5000: far below the 1e-308 where a float underflows to 0.
Every function here returns log10 p, computed without ever forming p itself when p is tiny, so the
numbers investigators read stay exact instead of collapsing to 0 or -inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special

LN10 = math.log(10.0)

_CF_MAX_ITER = 10_000
_CF_EPS = 1e-16
_CF_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz); converges for x < (a+1)/(a+b+2)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
    h = d
    for m in range(1, _CF_MAX_ITER + 1):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _CF_TINY else _CF_TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _CF_TINY else _CF_TINY
            h *= d * c
        if abs(d * c - 1.0) < _CF_EPS:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def log_betainc(a: float, b: float, log_x: float, log_1mx: float) -> float:
    """Natural log of the regularized incomplete beta I_x(a, b), from ln x and ln(1-x) given separately.

    Taking both logarithms lets callers pass x and 1-x without the cancellation of forming 1-x.
    """
    if log_x == -math.inf:
        return -math.inf
    if log_1mx == -math.inf:
        return 0.0
    x = math.exp(log_x)
    log_front = a * log_x + b * log_1mx - float(special.betaln(a, b))
    if x < (a + 1.0) / (a + b + 2.0):
        return log_front + math.log(_betacf(a, b, x)) - math.log(a)
    complement = math.exp(log_front + math.log(_betacf(b, a, 1.0 - x)) - math.log(b))
    return math.log1p(-complement) if complement < 1.0 else -math.inf


def log10_student_t_sf(t: float, df: float) -> float:
    """log10 P(T > t) for Student's t with df degrees of freedom, exact far below float underflow."""
    if math.isnan(t):
        raise ValueError("t statistic is NaN")
    if t == math.inf:
        return -math.inf
    if t == -math.inf:
        return 0.0
    # P(T > |t|) = I_{df/(df+t^2)}(df/2, 1/2) / 2; both ln x and ln(1-x) formed without cancellation.
    log_denominator = math.log(df + t * t) if t * t < 1e300 else 2.0 * math.log(abs(t)) + math.log1p(df / (t * t))
    log_x = math.log(df) - log_denominator
    log_1mx = (2.0 * math.log(abs(t)) - log_denominator) if t != 0.0 else -math.inf
    log_tail = log_betainc(df / 2.0, 0.5, log_x, log_1mx) - math.log(2.0)
    if t >= 0:
        return log_tail / LN10
    return math.log1p(-math.exp(log_tail)) / LN10


def log10_spearman_sf(rho: float, n: int) -> float:
    """One-sided log10 p of a Spearman correlation rho over n pairs (alternative: rho > 0).

    Uses the t approximation with n-2 degrees of freedom (as scipy does). One-sided because only a
    positive correlation is evidence of shared ancestry; callers floor it at the exact bound 1/n!.
    """
    if n < 3:
        return 0.0
    if rho >= 1.0:
        return -math.inf
    if rho <= -1.0:
        return 0.0
    t = rho * math.sqrt((n - 2) / ((1.0 - rho) * (1.0 + rho)))
    return log10_student_t_sf(t, n - 2)


def log10_inverse_factorial(h: int) -> float:
    """log10(1/h!): the smallest p-value any statistic of a single matching of h units can have."""
    return -float(special.gammaln(h + 1)) / LN10


def log10_matching_p(rho: float, n: int) -> float:
    """log10 p of a Spearman correlation between matchings of n units, floored at the permutation bound.

    Under independence a matching is a uniformly random permutation, so no outcome is rarer than one
    permutation in n!; the t approximation alone would claim more than the data can show.
    """
    return max(log10_spearman_sf(rho, n), log10_inverse_factorial(n))


def log10_fisher(log10_ps: np.ndarray | list[float]) -> float:
    """FISHER: log10 of P(chi2 with 2L dof > -2 sum ln p_i), exact in log space.

    For even degrees of freedom the chi-square tail is the finite sum exp(-y) sum_{j<L} y^j/j!, with
    y = -sum ln p_i, so its logarithm is a log-sum-exp with no special function and no underflow.
    """
    values = np.asarray(log10_ps, dtype=float)
    if values.size == 0:
        raise ValueError("FISHER needs at least one p-value")
    if np.isnan(values).any() or (values > 1e-12).any():
        raise ValueError(f"log10 p-values must be <= 0 and not NaN, got {values.tolist()}")
    if np.isneginf(values).any():
        return -math.inf
    y = -LN10 * float(np.minimum(values, 0.0).sum())
    if y == 0.0:
        return 0.0
    dof_half = values.size
    if y < dof_half:
        # The tail is near 1 here: 1 - (lower tail) keeps its tiny distance from 1 exact.
        return math.log1p(-float(special.gammainc(dof_half, y))) / LN10
    j = np.arange(dof_half, dtype=float)
    log_sf = -y + float(special.logsumexp(j * math.log(y) - special.gammaln(j + 1)))
    return min(log_sf, 0.0) / LN10


def log10_bonferroni(log10_ps: Sequence[float]) -> float:
    """Bonferroni: log10 of the smallest p-value times their number, at most 0; valid whatever the p-values' joint law
    (tests that share data, or one statistic read two ways)."""
    if not log10_ps:
        raise ValueError("Bonferroni needs at least one p-value")
    return float(min(0.0, min(log10_ps) + math.log10(len(log10_ps))))


def log10_permutation_p(observed: float, null_values: np.ndarray | list[float]) -> float:
    """PERMTEST p-value (1 + #{null >= observed}) / (T + 1), in log10; valid for any statistic.

    Counting ties as exceedances keeps the test valid when the statistic is discrete.
    """
    null = np.asarray(null_values, dtype=float)
    exceed = int(np.count_nonzero(null >= observed))
    return math.log10((1 + exceed) / (null.size + 1))
