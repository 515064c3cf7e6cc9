"""The batched auction (the GPU's assignment solver) gives scipy's matchings, certified, and flags what it cannot
certify; a pair compared through it gives exactly the host solver's result.

Run here on CPU torch, which executes the same tensor code the GPU runs: sizes are small because a bidding round
on the CPU costs what the GPU spends on a matrix of 11008 x 11008 (bench/bench_auction.py times the GPU).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from scanner.fingerprint_compare import compare_fingerprints
from scanner.stats.assignment.auction import auction_assignments
from scanner.stats.matching import cosine_similarity_matrix, match_similarities, match_similarity
from scanner.stats.sequential import SequentialDesign
from scanner.testing.synthetic import synthetic_pair
from tests.synthetic_fingerprints import template_fingerprint

UNITS = 96


def _cosines(rng: np.random.Generator, dependent: bool, dims: int = 48) -> np.ndarray:
    a = rng.standard_normal((UNITS, dims), dtype=np.float32)
    b = a[rng.permutation(UNITS)] + rng.standard_normal((UNITS, dims), dtype=np.float32) if dependent else \
        rng.standard_normal((UNITS, dims), dtype=np.float32)
    return cosine_similarity_matrix(a, b)


def test_a_batch_of_problems_gets_scipys_matchings_each_certified():
    rng = np.random.default_rng(5)
    problems = np.stack([_cosines(rng, dependent) for dependent in (False, True, False, True)])
    out = auction_assignments(torch.from_numpy(problems))
    assert out.certified.all()
    for k, similarity in enumerate(problems):
        rows, cols = linear_sum_assignment(similarity, maximize=True)
        np.testing.assert_array_equal(out.columns[k], cols)
        assert 0.0 < out.gap_bound[k] < 1e-9  # n * 2**-43 * scale plus the auction's final slack
    assert out.phases > 1 and out.iterations >= 1


def test_ties_give_an_optimal_assignment_of_equal_weight():
    rng = np.random.default_rng(6)
    similarity = _cosines(rng, dependent=False)
    similarity[:10] = 0.0  # dead units: every column is as good as any other for these rows
    similarity[:, :10] = 0.0
    out = auction_assignments(torch.from_numpy(similarity[None]))
    assert out.certified[0]
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    assert np.unique(out.columns[0]).size == UNITS
    ours = float(similarity[rows, out.columns[0]].astype(np.float64).sum())
    assert ours == pytest.approx(float(similarity[rows, cols].astype(np.float64).sum()), abs=out.gap_bound[0])


def test_an_unfinished_auction_is_flagged_and_the_host_solves_it():
    rng = np.random.default_rng(7)
    similarity = torch.from_numpy(_cosines(rng, dependent=False))
    out = auction_assignments(similarity[None], max_iterations=1)
    assert not out.certified[0]  # one bidding round cannot settle a random problem
    (matching,) = match_similarities([similarity], solver="auction")
    rows, cols = linear_sum_assignment(similarity.numpy(), maximize=True)
    np.testing.assert_array_equal(matching.b_index, cols)


def test_match_similarities_agrees_with_match_similarity_on_every_shape():
    rng = np.random.default_rng(8)
    square = [torch.from_numpy(_cosines(rng, dependent)) for dependent in (False, True)]
    wide = torch.from_numpy(cosine_similarity_matrix(rng.standard_normal((60, 48)), rng.standard_normal((UNITS, 48))))
    tall = wide.T.contiguous()
    mixed = [*square, wide, tall, square[0].numpy()]
    for ours, reference in zip(match_similarities(mixed, solver="auction"), map(match_similarity, mixed), strict=True):
        np.testing.assert_array_equal(ours.a_index, reference.a_index)
        np.testing.assert_array_equal(ours.b_index, reference.b_index)


def test_invalid_inputs_are_refused():
    with pytest.raises(ValueError, match="square"):
        auction_assignments(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="NaN"):
        auction_assignments(torch.tensor([[[0.0, float("nan")], [1.0, 0.0]]]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), 32)
    return synthetic_pair(template, 5, UNITS, {0: 0, 3: 3}, seed=12)


@pytest.mark.parametrize("design", [None, SequentialDesign(2, -300.0, -0.5)])
def test_a_pair_compared_through_the_auction_gives_the_host_result(pair, design):
    a, b = pair
    host = compare_fingerprints(a, b, design=design)
    assert compare_fingerprints(a, b, design=design, solver="auction") == host
    assert host.log10_p < -5  # two of five blocks derive: the matchings did real work
