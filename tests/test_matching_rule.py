"""MATCH's default rule, the candidate auction (and the greedy matching that completes it): a complete matching that
permutes with the units, the same on every backend, near the maximum-weight assignment on related units, and
phi_MATCH's p-values uniform where the units are unrelated.

Statistical checks use fixed seeds; their false-failure rates are stated where they are made.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from scanner.stats.assignment import arrays, auction, greedy
from scanner.stats.assignment.auction import auction_matching
from scanner.stats.assignment.greedy import greedy_matching
from scanner.stats.independence import phi_match
from scanner.stats.logp import log10_matching_p
from scanner.stats.matching import cosine_similarity_matrix, match_similarity, spearman

#: Settings that send many rows through every stage: one candidate each, or a single round per auction phase.
SETTINGS = {"greedy": [dict(candidates=1), dict(candidates=4), {}],
            "auction": [dict(candidates=1, rounds=1), dict(candidates=3, rounds=2), {}]}
RULES = {"greedy": greedy_matching, "auction": auction_matching}


def _gaussian(rng: np.random.Generator, rows: int, dims: int) -> np.ndarray:
    return rng.standard_normal((rows, dims), dtype=np.float32)


def _greedy_by_sorting(similarity: np.ndarray) -> np.ndarray:
    """The greedy matching from its definition: entries in decreasing order, each taken when its row and column
    are both free."""
    rows, cols = similarity.shape
    out = np.full(rows, -1)
    free_row, free_col = np.ones(rows, bool), np.ones(cols, bool)
    for flat in np.argsort(-similarity, axis=None, kind="stable"):
        i, j = divmod(int(flat), cols)
        if free_row[i] and free_col[j]:
            out[i], free_row[i], free_col[j] = j, False, False
    return out


def _related(rng: np.random.Generator, units: int, extra: int, noise: float) -> np.ndarray:
    """Cosines of a block against a noisy permuted copy of it with ``extra`` unrelated units added."""
    a = _gaussian(rng, units, 64)
    b = np.vstack([a[rng.permutation(units)] + noise * _gaussian(rng, units, 64), _gaussian(rng, extra, 64)])
    return cosine_similarity_matrix(a, b)


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("shape", [(200, 200), (150, 260)])
def test_every_row_gets_its_own_column(rule: str, shape: tuple[int, int]) -> None:
    similarity = _gaussian(np.random.default_rng(1), *shape)
    for settings in SETTINGS[rule]:
        columns = RULES[rule](similarity, **settings)
        assert columns.shape == (shape[0],) and columns.min() >= 0 and columns.max() < shape[1]
        assert np.unique(columns).size == shape[0]


def test_with_every_column_a_candidate_the_greedy_rule_is_the_greedy_matching() -> None:
    similarity = _gaussian(np.random.default_rng(2), 120, 170)
    np.testing.assert_array_equal(greedy_matching(similarity, candidates=170), _greedy_by_sorting(similarity))


@pytest.mark.parametrize("rule", sorted(RULES))
@pytest.mark.parametrize("related", [False, True])
def test_permuting_the_units_permutes_the_matching(rule: str, related: bool) -> None:
    """The property the p-values rest on: no unit's index, only the entries' values, decides its partner. With few
    candidates or rounds most rows reach the later stages, which must not pair leftovers by index either; a related
    block makes the auction's bids tie exactly (equal increments), which must not be settled by index."""
    rng = np.random.default_rng(3)
    similarity = _related(rng, 250, 60, 1.5) if related else _gaussian(rng, 300, 340)
    rows, cols = rng.permutation(similarity.shape[0]), rng.permutation(similarity.shape[1])
    for settings in SETTINGS[rule]:
        columns = RULES[rule](similarity, **settings)
        permuted = RULES[rule](similarity[rows][:, cols], **settings)
        np.testing.assert_array_equal(cols[permuted], columns[rows])


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_rounds_a_gpu_runs_in_torch_give_the_rounds_a_cpu_runs_in_numpy(rule: str,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule on every device: the torch operations (run here on the CPU in place of a GPU) give the numpy
    ones' matching, through every stage."""
    similarity = _related(np.random.default_rng(10), 250, 60, 1.5)
    on_numpy = [RULES[rule](similarity, **settings) for settings in SETTINGS[rule]]

    class TorchOps(arrays.Ops):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            self.numpy = False

    monkeypatch.setattr(greedy, "Ops", TorchOps)
    monkeypatch.setattr(auction, "Ops", TorchOps)
    for settings, expected in zip(SETTINGS[rule], on_numpy, strict=True):
        np.testing.assert_array_equal(RULES[rule](torch.from_numpy(similarity.copy()), **settings), expected)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_non_finite_entries_and_a_wider_first_side_are_refused(rule: str) -> None:
    similarity = _gaussian(np.random.default_rng(5), 50, 50)
    similarity[3, 7] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        RULES[rule](similarity, candidates=50)
    with pytest.raises(ValueError, match="rows <= cols"):
        RULES[rule](_gaussian(np.random.default_rng(5), 60, 50))


@pytest.mark.parametrize("noise", [0.8, 3.0, 4.0, 6.0])
def test_related_units_are_found_as_the_exact_assignment_finds_them(noise: float) -> None:
    """A permuted copy with noise of ``noise`` times the activations' scale (the true partner's cosine falls from 0.8
    to 0.16): the auction pairs units with their true partner about as often as the exact assignment (measured on two
    seeds: at most 0.5% fewer, near noise 3; up to 0.6% more at noise 4 and 6), asserted to within 2%, and its total
    cosine is within 4e-4 per unit of the optimum (what the closeness of related models rests on), asserted within
    1e-3 (the greedy matching alone: 7.5e-4 here, 6e-3 on the zoos' 128-unit blocks)."""
    rng = np.random.default_rng(6)
    a = _gaussian(rng, 2000, 256)
    permutation = rng.permutation(2000)
    b = a[permutation] + noise * _gaussian(rng, 2000, 256)
    similarity = cosine_similarity_matrix(a, b)
    truth, rows = np.argsort(permutation), np.arange(2000)
    ours, exact = match_similarity(similarity).b_index, match_similarity(similarity, "exact").b_index
    assert np.mean(ours == truth) >= np.mean(exact == truth) - 0.02
    lost = similarity[rows, exact].sum(dtype=np.float64) - similarity[rows, ours].sum(dtype=np.float64)
    assert 0.0 <= lost / 2000 < 1e-3


def test_rectangular_matrices_match_the_smaller_side_either_way() -> None:
    similarity = _gaussian(np.random.default_rng(7), 90, 40)
    matching = match_similarity(similarity)
    assert matching.size == 40 and np.unique(matching.a_index).size == 40
    np.testing.assert_array_equal(np.sort(matching.b_index), np.arange(40))
    transposed = match_similarity(similarity.T)
    np.testing.assert_array_equal(transposed.a_index, matching.b_index)
    np.testing.assert_array_equal(transposed.b_index, matching.a_index)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_two_unrelated_matchings_give_uniform_spearman_p_values(rule: str) -> None:
    """Two views of unrelated units (independent Gaussian similarity matrices), matched with the settings that send
    most rows to the later stages: were leftovers paired by index, both matchings would pair late rows with late
    columns and agree. One-sided KS of 300 p-values at 1e-3 (false failure 0.1%)."""
    rng = np.random.default_rng(8)
    settings = SETTINGS[rule][0]
    log10_ps = []
    for _ in range(300):
        first = RULES[rule](_gaussian(rng, 64, 64), **settings)
        second = RULES[rule](_gaussian(rng, 64, 64), **settings)
        log10_ps.append(log10_matching_p(spearman(first.astype(float), second.astype(float)), 64))
    assert kstest(10.0 ** np.asarray(log10_ps), "uniform", alternative="greater").pvalue >= 1e-3


def test_phi_match_is_valid_on_independent_blocks_and_finds_a_disguised_copy() -> None:
    """Independent random blocks: one-sided KS of 120 block p-values at 1e-3 (false failure 0.1%). A copy with its
    units permuted and its up rows rescaled: the permutation floor, by either rule."""
    rng = np.random.default_rng(9)
    log10_ps = [phi_match(_gaussian(rng, 128, 64), _gaussian(rng, 128, 64), _gaussian(rng, 128, 64),
                          _gaussian(rng, 128, 64)).log10_p for _ in range(120)]
    assert kstest(10.0 ** np.asarray(log10_ps), "uniform", alternative="greater").pvalue >= 1e-3
    gate, up = _gaussian(rng, 128, 64), _gaussian(rng, 128, 64)
    permutation = rng.permutation(128)
    scale = rng.uniform(0.5, 2.0, size=(128, 1)).astype(np.float32)
    floor = log10_matching_p(1.0, 128)
    for rule in ("auction", "exact"):
        copy = phi_match(gate, up, gate[permutation], scale * up[permutation], rule=rule)
        assert copy.log10_p == pytest.approx(floor)
