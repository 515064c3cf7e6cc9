"""The greedy matching, MATCH's default rule: a complete matching that permutes with the units, is the greedy
matching where its candidates are complete, finds what the exact assignment finds on related units, and keeps
phi_MATCH's p-values uniform where the units are unrelated.

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
from scanner.stats.matching import cosine_similarity_matrix, match_similarity, spearman


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


@pytest.mark.parametrize("shape", [(200, 200), (150, 260)])
def test_every_row_gets_its_own_column(shape: tuple[int, int]) -> None:
    similarity = _gaussian(np.random.default_rng(1), *shape)
    for candidates in (1, 3, 16):
        columns = greedy_matching(similarity, candidates=candidates)
        assert columns.shape == (shape[0],) and columns.min() >= 0 and columns.max() < shape[1]
        assert np.unique(columns).size == shape[0]


def test_with_every_column_a_candidate_it_is_the_greedy_matching() -> None:
    similarity = _gaussian(np.random.default_rng(2), 120, 170)
    np.testing.assert_array_equal(greedy_matching(similarity, candidates=170), _greedy_by_sorting(similarity))


@pytest.mark.parametrize("candidates", [1, 4, 16])
def test_permuting_the_units_permutes_the_matching(candidates: int) -> None:
    """The property the p-values rest on: no unit's index, only the entries' values, decides its partner (with few
    candidates most rows are matched in later stages, which must not pair leftovers by index either)."""
    rng = np.random.default_rng(3)
    similarity = _gaussian(rng, 300, 340)
    rows, cols = rng.permutation(300), rng.permutation(340)
    columns = greedy_matching(similarity, candidates=candidates)
    permuted = greedy_matching(similarity[rows][:, cols], candidates=candidates)
    np.testing.assert_array_equal(cols[permuted], columns[rows])


def test_a_torch_matrix_gives_the_numpy_matching() -> None:
    similarity = _gaussian(np.random.default_rng(4), 256, 300)
    np.testing.assert_array_equal(greedy_matching(torch.from_numpy(similarity.copy()), candidates=2),
                                  greedy_matching(similarity, candidates=2))


def test_the_rounds_a_gpu_runs_in_torch_give_the_rounds_a_cpu_runs_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same rule on every device: the torch rounds (run here on the CPU in place of a GPU) give the numpy ones'
    matching, over several stages."""
    similarity = _gaussian(np.random.default_rng(10), 300, 360)
    on_numpy = greedy_matching(similarity, candidates=2)

    class TorchRounds(greedy._Ops):
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            self.numpy = False

    monkeypatch.setattr(greedy, "_Ops", TorchRounds)
    np.testing.assert_array_equal(greedy_matching(similarity, candidates=2), on_numpy)


def test_non_finite_entries_are_refused() -> None:
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
    lost at most 1.6% of the units, near noise 3, on two seeds here; more often it is within 0.2%; at noise 6 it
    wins by 1%), asserted to within 3%."""
    rng = np.random.default_rng(6)
    a = _gaussian(rng, 2000, 256)
    permutation = rng.permutation(2000)
    b = a[permutation] + noise * _gaussian(rng, 2000, 256)
    similarity = cosine_similarity_matrix(a, b)
    truth = np.argsort(permutation)
    greedy = np.mean(match_similarity(similarity).b_index == truth)
    exact = np.mean(match_similarity(similarity, "exact").b_index == truth)
    assert greedy >= exact - 0.03 and greedy > 0.1, (greedy, exact)


def test_rectangular_matrices_match_the_smaller_side_either_way() -> None:
    similarity = _gaussian(np.random.default_rng(7), 90, 40)
    matching = match_similarity(similarity)
    assert matching.size == 40 and np.unique(matching.a_index).size == 40
    np.testing.assert_array_equal(np.sort(matching.b_index), np.arange(40))
    transposed = match_similarity(similarity.T)
    np.testing.assert_array_equal(transposed.a_index, matching.b_index)
    np.testing.assert_array_equal(transposed.b_index, matching.a_index)


def test_two_unrelated_matchings_give_uniform_spearman_p_values() -> None:
    """Two views of unrelated units (independent Gaussian similarity matrices), matched with a single candidate per
    stage so that most rows fall to later stages: if leftovers were paired by index, both matchings would pair late
    rows with late columns and agree. One-sided KS of 300 p-values at 1e-3 (false failure 0.1%)."""
    rng = np.random.default_rng(8)
    log10_ps = []
    for _ in range(300):
        first = greedy_matching(_gaussian(rng, 64, 64), candidates=1)
        second = greedy_matching(_gaussian(rng, 64, 64), candidates=1)
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
    for rule in ("greedy", "exact"):
        copy = phi_match(gate, up, gate[permutation], scale * up[permutation], rule=rule)
        assert copy.log10_p == pytest.approx(floor)
