"""Log-space tails against mpmath, far below the float underflow at 1e-308."""

import math

import mpmath
import numpy as np
import pytest
from scipy import stats

from scanner.stats.logp import (
    log10_fisher,
    log10_inverse_factorial,
    log10_matching_p,
    log10_permutation_p,
    log10_spearman_sf,
    log10_student_t_sf,
)

mpmath.mp.dps = 50


def _mp_incomplete_beta(a, b, x):
    """Regularized I_x(a, b) = x^a (1-x)^b / (a B(a, b)) * sum_n (a+b)_n / (a+1)_n x^n, to mpmath's precision.

    The series' terms are positive and shrink at least as fast as x^n, so for x <= 0.95 it is summed directly (a
    few thousand terms at most); nearer 1, mpmath's hyp2f1 (which transforms the series there) sums it. hyp2f1
    alone is exact too, but for a huge a at moderate x (df 1e5, t = 100) it takes minutes, the direct sum 0.1 s.
    """
    if x <= 0.95:
        term = total = mpmath.mpf(1)
        n, eps = 0, mpmath.mpf(10) ** -(mpmath.mp.dps + 5)
        while term > total * eps:
            term *= (a + b + n) / (a + 1 + n) * x
            total += term
            n += 1
    else:
        total = mpmath.hyp2f1(a + b, 1, a + 1, x, maxterms=10**7, maxprec=100_000)
    return x**a * (1 - x) ** b * total / (a * mpmath.beta(a, b))


def _mp_log10_t_sf(t: float, df: float) -> float:
    t, df, half = mpmath.mpf(t), mpmath.mpf(df), mpmath.mpf(1) / 2
    a = df / 2
    x = df / (df + t * t)
    if x < (a + 1) / (a + half + 2):
        upper = _mp_incomplete_beta(a, half, x) / 2
    else:
        upper = (1 - _mp_incomplete_beta(half, a, t * t / (df + t * t))) / 2
    return float(mpmath.log10(upper if t >= 0 else 1 - upper))


T_GRID = [-50.0, -3.0, -0.5, 0.0, 0.1, 1.0, 2.0, 5.0, 10.0, 30.0, 100.0, 1e3, 1e5, 1e10]
DF_GRID = [1, 2, 3, 10, 126, 1000, 11006, 100_000]


@pytest.mark.parametrize("df", DF_GRID)
def test_student_t_tail_matches_mpmath(df):
    for t in T_GRID:
        ours, exact = log10_student_t_sf(t, df), _mp_log10_t_sf(t, df)
        assert math.isfinite(ours)
        assert abs(ours - exact) <= 1e-9 * max(1.0, abs(exact)), (t, df, ours, exact)


def test_grid_reaches_far_below_float_underflow():
    deepest = min(log10_student_t_sf(t, df) for t in T_GRID for df in DF_GRID)
    assert deepest < -10_000
    # scipy in linear space cannot represent these at all.
    assert stats.t.logsf(1e3, 11006) == -math.inf
    assert log10_student_t_sf(1e3, 11006) == pytest.approx(_mp_log10_t_sf(1e3, 11006), rel=1e-10)


def test_spearman_tail_agrees_with_scipy_where_scipy_is_exact():
    rng = np.random.default_rng(0)
    for n in (10, 50, 500):
        x = rng.normal(size=n)
        y = 0.3 * x + rng.normal(size=n)
        result = stats.spearmanr(x, y, alternative="greater")
        assert log10_spearman_sf(result.statistic, n) == pytest.approx(math.log10(result.pvalue), rel=1e-8)


def _mp_log10_fisher(log10_ps):
    y = -sum(mpmath.mpf(v) for v in log10_ps) * mpmath.log(10)
    return float(mpmath.log10(mpmath.gammainc(len(log10_ps), y, mpmath.inf, regularized=True)))


@pytest.mark.parametrize(
    "log10_ps",
    [
        [-0.3, -0.1], [-5.0] * 32, [-300.0] * 32, [-2000.0] * 40, [-9000.0] * 2, [0.0] * 4, [-1e-9] * 3, [-1.0],
        [-215.0, -0.2, -50.0],
    ],
)
def test_fisher_matches_mpmath(log10_ps):
    ours, exact = log10_fisher(log10_ps), _mp_log10_fisher(log10_ps)
    assert math.isfinite(ours)
    assert abs(ours - exact) <= 1e-10 * max(1.0, abs(exact))


@pytest.mark.slow
def test_fisher_of_uniform_pvalues_is_uniform():
    """KS against U(0,1) at alpha=0.01 on 2000 fixed-seed draws: false-failure rate 1%, seed fixed."""
    rng = np.random.default_rng(1)
    combined = [10 ** log10_fisher(np.log10(rng.uniform(size=8))) for _ in range(2000)]
    assert stats.kstest(combined, "uniform").pvalue > 0.01


def test_matching_p_is_floored_at_the_permutation_bound_and_never_infinite():
    for h in (3, 16, 128, 11008):
        floor = log10_inverse_factorial(h)
        assert log10_matching_p(1.0, h) == floor
        assert math.isfinite(floor) and floor < 0
        assert log10_matching_p(0.0, h) == pytest.approx(math.log10(0.5), abs=1e-6)
    assert log10_inverse_factorial(128) == pytest.approx(-float(mpmath.log10(mpmath.factorial(128))), rel=1e-12)


def test_permutation_p_counts_ties_and_the_observed_value():
    assert log10_permutation_p(5.0, [1.0, 2.0, 3.0]) == pytest.approx(math.log10(1 / 4))
    assert log10_permutation_p(2.0, [1.0, 2.0, 3.0]) == pytest.approx(math.log10(3 / 4))
    assert log10_permutation_p(0.0, [1.0, 2.0, 3.0]) == 0.0


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError):
        log10_fisher([])
    with pytest.raises(ValueError):
        log10_fisher([0.5])
    with pytest.raises(ValueError):
        log10_student_t_sf(float("nan"), 3)
