"""MATCH, phi_U, phi_H, phi_MATCH, PERMTEST and the Appendix B permutations on synthetic arrays."""

import math

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit

from scanner.errors import IncomparableError
from scanner.stats.independence import fisher, permtest, phi_h, phi_match, phi_u
from scanner.stats.l2 import BlockSource, phi_l2
from scanner.stats.logp import log10_inverse_factorial
from scanner.stats.matching import match, spearman
from scanner.stats.permutations import permute_role, sample_permutation


def silu(x):
    return x * expit(x)


def test_match_recovers_a_hidden_permutation():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(64, 32))
    perm = rng.permutation(64)
    m = match(a, a[perm] + 0.01 * rng.normal(size=(64, 32)))
    np.testing.assert_array_equal(m.a_index, np.arange(64))
    np.testing.assert_array_equal(perm[m.b_index], np.arange(64))


def test_match_is_equivariant_to_row_permutations():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(40, 16)), rng.normal(size=(40, 16))
    perm = rng.permutation(40)
    base, permuted = match(a, b), match(a[perm], b)
    np.testing.assert_array_equal(permuted.b_index, base.b_index[perm])


def test_rectangular_match_returns_the_smaller_side():
    rng = np.random.default_rng(2)
    big = rng.normal(size=(50, 20))
    kept = np.sort(rng.choice(50, size=30, replace=False))
    for m, smaller_first in ((match(big[kept], big), True), (match(big, big[kept]), False)):
        assert m.size == 30
        if smaller_first:
            np.testing.assert_array_equal(m.a_index, np.arange(30))
            np.testing.assert_array_equal(m.b_index, kept)
        else:
            np.testing.assert_array_equal(m.b_index, np.arange(30))
            np.testing.assert_array_equal(m.a_index, kept)


def test_spearman_edge_cases():
    assert spearman(np.arange(5.0), np.arange(5.0)) == pytest.approx(1.0)
    assert spearman(np.arange(5.0), -np.arange(5.0)) == pytest.approx(-1.0)
    assert spearman(np.ones(5), np.arange(5.0)) == 0.0
    with pytest.raises(ValueError):
        spearman(np.arange(3.0), np.arange(4.0))


def test_phi_u_detects_a_fine_tune_and_is_fooled_by_a_permutation():
    rng = np.random.default_rng(3)
    up = rng.normal(size=(128, 64))
    tuned = up + 0.5 * rng.normal(size=up.shape)
    dependent = phi_u(up, tuned)
    assert dependent.log10_p < -100 and math.isfinite(dependent.log10_p)
    assert phi_u(up, tuned[rng.permutation(128)]).log10_p > -3


@pytest.mark.slow
def test_phi_u_pvalues_are_uniform_for_independent_weights():
    """KS at alpha=0.01 over 300 independent pairs; fixed seed, false-failure rate 1%."""
    rng = np.random.default_rng(4)
    ps = [10 ** phi_u(rng.normal(size=(48, 24)), rng.normal(size=(48, 24))).log10_p for _ in range(300)]
    assert stats.kstest(ps, "uniform").pvalue > 0.01


def _glu_activations(rng, h, d, tokens):
    gate, up = rng.normal(size=(h, d)), rng.normal(size=(h, d))
    return gate, up, tokens @ gate.T, tokens @ up.T


def test_phi_match_survives_permutation_scaling_and_residual_rotation():
    rng = np.random.default_rng(5)
    h, d, n = 96, 32, 400
    x = rng.normal(size=(n, d))
    gate, up, gate_act, up_act = _glu_activations(rng, h, d, x)
    rotation, _ = np.linalg.qr(rng.normal(size=(d, d)))
    perm = rng.permutation(h)
    # The camouflaged copy sees rotated inputs through rotated, permuted, rescaled weights.
    gate_b, up_b = (gate @ rotation)[perm], 3.0 * (up @ rotation)[perm]
    x_b = x @ rotation
    gate_act_b = (x_b @ gate_b.T) * (1 + 0.05 * rng.normal(size=(n, h)))
    up_act_b = x_b @ up_b.T
    result = phi_match(gate_act.T, up_act.T, gate_act_b.T, up_act_b.T)
    assert result.rho > 0.99
    assert result.log10_p == log10_inverse_factorial(h)
    assert phi_h((silu(gate_act) * up_act).T, (silu(gate_act_b) * up_act_b).T).log10_p > -3


@pytest.mark.slow
def test_phi_match_pvalues_are_uniform_for_independent_mlps():
    """KS at alpha=0.01 over 200 independent GLU pairs on shared inputs; fixed seed, false-failure rate 1%."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(200, 16))
    ps = []
    for _ in range(200):
        _, _, ga, ua = _glu_activations(rng, 32, 16, x)
        _, _, gb, ub = _glu_activations(rng, 32, 16, x)
        ps.append(10 ** phi_match(ga.T, ua.T, gb.T, ub.T).log10_p)
    assert stats.kstest(ps, "uniform").pvalue > 0.01


def test_phi_match_handles_different_widths():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(300, 24))
    gate, up, gate_act, up_act = _glu_activations(rng, 80, 24, x)
    kept = np.sort(rng.choice(80, size=50, replace=False))
    pruned = phi_match(gate_act.T, up_act.T, gate_act.T[kept], up_act.T[kept])
    assert pruned.n_units == 50 and pruned.rho == pytest.approx(1.0)
    assert pruned.log10_p == log10_inverse_factorial(50)


def test_fisher_combines_blocks():
    rng = np.random.default_rng(8)
    up = rng.normal(size=(64, 32))
    blocks = [phi_u(up, up + 0.8 * rng.normal(size=up.shape)) for _ in range(4)]
    assert fisher(blocks) < min(b.log10_p for b in blocks)


def _two_layer_mlp_test(theta_a, theta_b, seed):
    """Paper Example 1: phi = -||theta_a - theta_b|| with hidden-unit permutations."""

    def statistic(a, b):
        return -sum(np.linalg.norm(x - y) for x, y in zip(a, b))

    def sample(rng):
        perm = rng.permutation(theta_a[0].shape[0])
        return lambda theta: (theta[0][perm], theta[1][:, perm])

    return permtest(statistic, theta_a, theta_b, sample, n_samples=19, seed=seed)


def test_permtest_is_uniform_on_its_grid_under_independence():
    """Chi-square goodness of fit over the 20 possible p-values, 1000 fixed-seed draws,
    alpha=0.01 (1% false failures)."""
    rng = np.random.default_rng(9)
    counts = np.zeros(20)
    for seed in range(1000):
        a = (rng.normal(size=(10, 5)), rng.normal(size=(3, 10)))
        b = (rng.normal(size=(10, 5)), rng.normal(size=(3, 10)))
        p = 10 ** _two_layer_mlp_test(a, b, seed).log10_p
        counts[round(p * 20) - 1] += 1
    assert stats.chisquare(counts).pvalue > 0.01


def test_permtest_detects_dependence_at_its_resolution():
    rng = np.random.default_rng(10)
    a = (rng.normal(size=(10, 5)), rng.normal(size=(3, 10)))
    b = (a[0] + 0.1 * rng.normal(size=(10, 5)), a[1] + 0.1 * rng.normal(size=(3, 10)))
    assert _two_layer_mlp_test(a, b, seed=0).log10_p == pytest.approx(math.log10(1 / 20))


def _random_block(rng, d=8, h=12):
    return {
        "attn_norm": rng.normal(size=d), "q": rng.normal(size=(d, d)), "k": rng.normal(size=(4, d)),
        "v": rng.normal(size=(4, d)), "o": rng.normal(size=(d, d)), "mlp_norm": rng.normal(size=d),
        "gate": rng.normal(size=(h, d)), "up": rng.normal(size=(h, d)), "down": rng.normal(size=(d, h)),
    }


def test_appendix_b_permutation_preserves_a_glu_block():
    rng = np.random.default_rng(11)
    block = _random_block(rng)
    perm = sample_permutation(rng, 8, {(0, ""): 12})
    moved = {role: permute_role(role, t, perm, 0) for role, t in block.items()}
    x = rng.normal(size=(5, 8))

    def mlp(w, inp):
        z = inp * w["mlp_norm"]
        return (silu(z @ w["gate"].T) * (z @ w["up"].T)) @ w["down"].T

    np.testing.assert_allclose(mlp(moved, x[:, perm.residual]), mlp(block, x)[:, perm.residual], atol=1e-10)
    with pytest.raises(IncomparableError, match="mystery"):
        permute_role("mystery", block["q"], perm, 0)


def test_phi_l2_separates_a_fine_tune_from_an_independent_model():
    """The independent pair must not reach p < 10**-1.5 (a 3% false-failure rate; the seed is fixed)."""
    rng = np.random.default_rng(12)
    base = [_random_block(rng) for _ in range(3)]
    tuned = [{r: t + 0.05 * rng.normal(size=t.shape) for r, t in b.items()} for b in base]
    other = [_random_block(rng) for _ in range(3)]

    def source(blocks):
        return BlockSource(read_block=lambda layer: blocks[layer], n_layers=3, hidden_size=8)

    assert phi_l2(source(base), source(tuned), n_samples=99).log10_p == pytest.approx(-2.0)
    assert phi_l2(source(base), source(other), n_samples=99).log10_p > -1.5
