"""The sequential (screen-then-stop) block design: valid p-values, and the blocks it saves.

The validity check simulates null pairs of 32 blocks with seeded uniform per-block p-values. Its bound is the
level plus 5 binomial standard errors at 200,000 draws, so an exactly valid procedure fails it with probability
below 3e-7 per level (and it is deterministic under the fixed seed).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import chi2

from scanner.fingerprints.fingerprint import Fingerprint
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.stats.logp import log10_fisher
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_pair
from tests.synthetic_fingerprints import template_fingerprint

DESIGN = SequentialDesign()


def test_screen_spreads_over_the_depth() -> None:
    assert DESIGN.screen(32) == [0, 10, 21, 31]
    assert DESIGN.screen(3) == [0, 1, 2]
    assert SequentialDesign(screen_blocks=1).screen(32) == [0]
    with pytest.raises(ValueError):
        SequentialDesign(stop_below_log10_p=-2.0, stop_above_log10_p=-30.0)


def test_continued_p_value_adds_the_floor_exactly_in_log_space() -> None:
    assert DESIGN.continued_log10_p(-5.0) == pytest.approx(math.log10(1e-5 + 1e-30), abs=1e-15)
    assert DESIGN.continued_log10_p(-5000.0) == pytest.approx(-30.0, abs=1e-12)
    assert DESIGN.continued_log10_p(-30.0) == pytest.approx(-30.0 + math.log10(2.0))


@pytest.mark.parametrize("design", [DESIGN, SequentialDesign(stop_below_log10_p=-1.5, stop_above_log10_p=-0.5)])
def test_reported_p_values_are_valid_under_the_null(design: SequentialDesign) -> None:
    """The second design has thresholds inside the range simulated here, so every branch is exercised."""
    rng = np.random.default_rng(20261123)
    n, depth = 200_000, 32
    block_ln_p = np.log(rng.uniform(size=(n, depth)))
    screen = design.screen(depth)

    def fisher(ln_p: np.ndarray) -> np.ndarray:  # vectorised FISHER, the same chi-square tail as log10_fisher
        return chi2.logsf(-2.0 * ln_p.sum(axis=1), 2 * ln_p.shape[1]) / math.log(10.0)

    first, every = fisher(block_ln_p[:, screen]), fisher(block_ln_p)
    reported = np.where([design.stops(x) for x in first], first, [design.continued_log10_p(x) for x in every])
    for alpha in (0.001, 0.01, 0.03, 0.05, 0.1, 0.3, 0.5):
        bound = alpha + 5 * math.sqrt(alpha * (1 - alpha) / n)
        assert np.mean(reported <= math.log10(alpha)) <= bound, alpha


# -- on fingerprints ----------------------------------------------------------------------------------------------

DEPTH, UNITS, TOKENS = 12, 96, 64


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Fingerprint:
    return template_fingerprint(tmp_path_factory.mktemp("llama"), TOKENS)


def _pair(template: Fingerprint, related: set[int], seed: int) -> tuple[Fingerprint, Fingerprint]:
    """Two 12-block fingerprints; B's blocks in `related` derive from A's blocks of the same index."""
    return synthetic_pair(template, DEPTH, UNITS, {layer: layer for layer in related}, seed)


def test_independent_pair_stops_after_the_screen(template: Fingerprint) -> None:
    """Under independence the screen stops 99% of the time (p_k > 0.01); this seed is one of those."""
    a, b = _pair(template, set(), seed=0)
    full = compare_fingerprints(a, b)
    result = compare_fingerprints(a, b, design=DESIGN)
    assert [layer.layer_a for layer in result.layers] == DESIGN.screen(DEPTH) == [0, 4, 7, 11]
    assert result.log10_p > -2.0 and result.n_layers == 4 and "sequential test" in result.notes[-1]
    assert [full.layers[k] for k in DESIGN.screen(DEPTH)] == result.layers  # the same blocks, the same numbers


def test_derived_pair_stops_after_the_screen_with_overwhelming_evidence(template: Fingerprint) -> None:
    a, b = _pair(template, set(range(DEPTH)), seed=2)
    result = compare_fingerprints(a, b, design=DESIGN)
    assert result.n_layers == 4 and result.log10_p <= DESIGN.stop_below_log10_p
    assert result.log10_p == log10_fisher([layer.log10_p for layer in result.layers])


def test_pair_related_off_the_screen_compares_every_block(template: Fingerprint) -> None:
    """Blocks 5 and 6 alone are related: the screen is inconclusive, so all blocks decide, with the floor added."""
    a, b = _pair(template, {5, 6}, seed=3)
    full = compare_fingerprints(a, b)
    result = compare_fingerprints(a, b, design=SequentialDesign(stop_above_log10_p=-0.0001))
    assert [layer.layer_a for layer in result.layers] == list(range(DEPTH))
    assert result.layers == full.layers
    assert result.log10_p == pytest.approx(DESIGN.continued_log10_p(full.log10_p))
    assert full.log10_p < -3  # the related blocks carry the evidence the screen missed
