"""MATCH's rules: the greedy matching is a complete matching that permutes with the units, the same on every backend,
the greedy matching by definition where its candidates are complete, and about as good as the maximum-weight
assignment at finding related units; the default rule gives the exact rule's result on related blocks and the greedy
one's on unrelated blocks; phi_MATCH's p-values are uniform where the units are unrelated.

Statistical checks use fixed seeds; their false-failure rates are stated where they are made.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from scanner.stats.assignment import greedy
from scanner.stats.assignment.greedy import greedy_matching
from scanner.stats.independence import phi_match
from scanner.stats.logp import log10_matching_p
from scanner.stats.matching import SCREEN_LOG10_P, cosine_similarity_matrix, match_similarity, spearman

#: Candidates per row that send many rows through the later stages (one), some (four), and the default.
SETTINGS = [dict(candidates=1), dict(candidates=4), {}]


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


@pytest.mark.parametrize("shape", [(200, 200), (150, 260)])
def test_every_row_gets_its_own_column(shape: tuple[int, int]) -> None:
    similarity = _gaussian(np.random.default_rng(1), *shape)
    for settings in SETTINGS:
        columns = greedy_matching(similarity, **settings)
        assert columns.shape == (shape[0],) and columns.min() >= 0 and columns.max() < shape[1]
        assert np.unique(columns).size == shape[0]


def test_with_every_column_a_candidate_the_greedy_rule_is_the_greedy_matching() -> None:
    similarity = _gaussian(np.random.default_rng(2), 120, 170)
    np.testing.assert_array_equal(greedy_matching(similarity, candidates=170), _greedy_by_sorting(similarity))


@pytest.mark.parametrize("related", [False, True])
def test_permuting_the_units_permutes_the_matching(related: bool) -> None:
    """The property the p-values rest on: no unit's index, only the entries' values, decides its partner. With few
    candidates most rows reach the later stages, which must not pair leftovers by index either."""
    rng = np.random.default_rng(3)
    similarity = _related(rng, 250, 60, 1.5) if related else _gaussian(rng, 300, 340)
    rows, cols = rng.permutation(similarity.shape[0]), rng.permutation(similarity.shape[1])
    for settings in SETTINGS:
        columns = greedy_matching(similarity, **settings)
        permuted = greedy_matching(similarity[rows][:, cols], **settings)
        np.testing.assert_array_equal(cols[permuted], columns[rows])


def test_the_rounds_a_gpu_runs_in_torch_give_the_rounds_a_cpu_runs_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule on every device: the torch operations (run here on the CPU in place of a GPU) give the numpy
    ones' matching, through every stage."""
    similarity = _related(np.random.default_rng(10), 250, 60, 1.5)
    on_numpy = [greedy_matching(similarity, **settings) for settings in SETTINGS]

    class TorchOps(greedy.Ops):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            self.numpy = False

    monkeypatch.setattr(greedy, "Ops", TorchOps)
    for settings, expected in zip(SETTINGS, on_numpy, strict=True):
        np.testing.assert_array_equal(greedy_matching(torch.from_numpy(similarity.copy()), **settings), expected)


def test_non_finite_entries_and_a_wider_first_side_are_refused() -> None:
    similarity = _gaussian(np.random.default_rng(5), 50, 50)
    similarity[3, 7] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        greedy_matching(similarity, candidates=50)
    with pytest.raises(ValueError, match="rows <= cols"):
        greedy_matching(_gaussian(np.random.default_rng(5), 60, 50))


@pytest.mark.parametrize("noise", [0.8, 3.0, 4.0, 6.0])
def test_related_units_are_found_about_as_often_as_the_exact_assignment_finds_them(noise: float) -> None:
    """A permuted copy with noise of ``noise`` times the activations' scale (the true partner's cosine falls from 0.8
    to 0.16): the greedy matching pairs units with their true partner nearly as often as the exact assignment (it
    lost at most 1.6% of the units, near noise 3, on two seeds here; at noise 6 it wins by 1%), asserted to within
    3%."""
    rng = np.random.default_rng(6)
    a = _gaussian(rng, 2000, 256)
    permutation = rng.permutation(2000)
    b = a[permutation] + noise * _gaussian(rng, 2000, 256)
    similarity = cosine_similarity_matrix(a, b)
    truth = np.argsort(permutation)
    ours = np.mean(match_similarity(similarity, "greedy").b_index == truth)
    exact = np.mean(match_similarity(similarity, "exact").b_index == truth)
    assert ours >= exact - 0.03 and ours > 0.1, (ours, exact)


def test_the_default_rule_matches_related_blocks_exactly_and_unrelated_ones_greedily() -> None:
    """A noisy permuted copy (the greedy matchings already give log10 p far below SCREEN_LOG10_P): the default rule's
    result is the exact rule's, p-value and closeness. An unrelated block whose greedy p is above it: the greedy
    rule's."""
    rng = np.random.default_rng(11)
    gate, up = _gaussian(rng, 300, 64), _gaussian(rng, 300, 64)
    permutation = rng.permutation(300)
    copy = (gate[permutation] + 2.0 * _gaussian(rng, 300, 64), up[permutation] + 2.0 * _gaussian(rng, 300, 64))
    related = {rule: phi_match(gate, up, *copy, rule=rule) for rule in ("screened", "greedy", "exact")}
    assert related["greedy"].log10_p < SCREEN_LOG10_P and related["screened"] == related["exact"]
    assert related["greedy"] != related["exact"]  # the two rules do differ on this block
    while True:
        unrelated = (_gaussian(rng, 300, 64), _gaussian(rng, 300, 64))
        greedy_test = phi_match(gate, up, *unrelated, rule="greedy")
        if greedy_test.log10_p > SCREEN_LOG10_P:
            break
    assert phi_match(gate, up, *unrelated) == greedy_test


def test_rectangular_matrices_match_the_smaller_side_either_way() -> None:
    similarity = _gaussian(np.random.default_rng(7), 90, 40)
    matching = match_similarity(similarity)
    assert matching.size == 40 and np.unique(matching.a_index).size == 40
    np.testing.assert_array_equal(np.sort(matching.b_index), np.arange(40))
    transposed = match_similarity(similarity.T)
    np.testing.assert_array_equal(transposed.a_index, matching.b_index)
    np.testing.assert_array_equal(transposed.b_index, matching.a_index)


@pytest.mark.slow
def test_two_unrelated_matchings_give_uniform_spearman_p_values() -> None:
    """Two views of unrelated units (independent Gaussian similarity matrices), matched with one candidate per stage
    so that most rows reach the later stages: were leftovers paired by index, both matchings would pair late rows
    with late columns and agree. One-sided KS of 300 p-values at 1e-3 (false failure 0.1%)."""
    rng = np.random.default_rng(8)
    log10_ps = []
    for _ in range(300):
        first = greedy_matching(_gaussian(rng, 64, 64), candidates=1)
        second = greedy_matching(_gaussian(rng, 64, 64), candidates=1)
        log10_ps.append(log10_matching_p(spearman(first.astype(float), second.astype(float)), 64))
    assert kstest(10.0 ** np.asarray(log10_ps), "uniform", alternative="greater").pvalue >= 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["screened", "greedy"])
def test_phi_match_is_valid_on_independent_blocks_and_finds_a_disguised_copy(rule: str) -> None:
    """Independent random blocks: one-sided KS of 200 block p-values at 1e-3 (false failure 0.1%; the default rule
    reports the exact matchings' p-value for the ones whose greedy p-value is at most 0.1, which must keep the whole
    uniform). A copy with its units permuted and its up rows rescaled: the permutation floor, by every rule."""
    rng = np.random.default_rng(9)
    log10_ps = [phi_match(_gaussian(rng, 128, 64), _gaussian(rng, 128, 64), _gaussian(rng, 128, 64),
                          _gaussian(rng, 128, 64), rule=rule).log10_p for _ in range(200)]
    assert kstest(10.0 ** np.asarray(log10_ps), "uniform", alternative="greater").pvalue >= 1e-3
    gate, up = _gaussian(rng, 128, 64), _gaussian(rng, 128, 64)
    permutation = rng.permutation(128)
    scale = rng.uniform(0.5, 2.0, size=(128, 1)).astype(np.float32)
    floor = log10_matching_p(1.0, 128)
    for rule in ("screened", "greedy", "exact"):
        copy = phi_match(gate, up, gate[permutation], scale * up[permutation], rule=rule)
        assert copy.log10_p == pytest.approx(floor)
