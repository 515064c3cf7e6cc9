"""The certified sparse assignment solver agrees with scipy's dense linear_sum_assignment."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

from scanner.stats.assignment import (
    AssignmentStats,
    candidates,
    certificate,
    max_weight_assignment,
    solve,
    solve_assignment,
)
from scanner.stats.matching import cosine_similarity_matrix


def _gaussian(rng: np.random.Generator, rows: int, dims: int) -> np.ndarray:
    return rng.standard_normal((rows, dims), dtype=np.float32)


def _assert_same_as_scipy(similarity: np.ndarray, result) -> None:
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    np.testing.assert_array_equal(result.row_ind, rows)
    np.testing.assert_array_equal(result.col_ind, cols)


def test_independent_pair_matches_scipy_and_is_certified_sparse() -> None:
    rng = np.random.default_rng(11)
    similarity = cosine_similarity_matrix(_gaussian(rng, 1500, 256), _gaussian(rng, 1500, 256))
    result = solve_assignment(similarity)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.method == "sparse"
    assert result.stats.solver == "lapmod"
    assert result.stats.edges[0] < 0.1 * similarity.size
    assert 0.0 < result.stats.gap_bound < 1e-8


def test_dependent_pair_matches_scipy_and_recovers_the_permutation() -> None:
    rng = np.random.default_rng(12)
    a = _gaussian(rng, 2000, 256)
    permutation = rng.permutation(2000)
    b = a[permutation] + 0.8 * _gaussian(rng, 2000, 256)
    similarity = cosine_similarity_matrix(a, b)
    row_ind, col_ind = max_weight_assignment(similarity)
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    np.testing.assert_array_equal(row_ind, rows)
    np.testing.assert_array_equal(col_ind, cols)
    # b's row permutation[k] came from a's row... inverse: a's row i went to b's row inv[i]
    inverse = np.argsort(permutation)
    assert np.mean(col_ind == inverse) > 0.99


@pytest.mark.parametrize("dependent", [False, True])
def test_rectangular_pruned_pair_matches_scipy(dependent: bool) -> None:
    rng = np.random.default_rng(13 + dependent)
    b = _gaussian(rng, 1200, 192)
    if dependent:  # a is a pruned (kept 700 of 1200 units), shuffled, noisy copy of b
        kept = rng.choice(1200, size=700, replace=False)
        a = b[kept] + 0.7 * _gaussian(rng, 700, 192)
    else:
        a = _gaussian(rng, 700, 192)
    similarity = cosine_similarity_matrix(a, b)
    assert similarity.shape == (700, 1200)
    result = solve_assignment(similarity)
    _assert_same_as_scipy(similarity, result)
    if dependent:  # every kept unit's best match is its own original: no solver needed
        assert result.stats.method == "row-maxima"
        assert np.mean(result.col_ind == kept) > 0.99
    else:
        assert result.stats.method == "sparse"
        assert result.stats.solver == "scipy-sparse"


def _band_adversary(n: int, half: int, seed: int) -> np.ndarray:
    """Top-2 candidates of every row are its band {i, i+1 mod n}; the optimum needs an entry outside.

    Rows < half prefer i+1 (1.1 vs 1.0), rows >= half prefer i; inside the band only the identity and
    the cyclic shift are perfect matchings, each giving n + 0.1 n / 2. Taking the shift for rows < half
    and the identity after, with row `half` on column 0 at 0.5, gives (n - 1) 1.1 + 0.5, which is more.
    """
    rng = np.random.default_rng(seed)
    similarity = 0.5 + 1e-3 * rng.random((n, n))  # everything outside the band: about 0.5
    rows = np.arange(n)
    prefers_next = rows < half
    similarity[rows, rows] = np.where(prefers_next, 1.0, 1.1) + 1e-3 * rng.random(n)
    similarity[rows, (rows + 1) % n] = np.where(prefers_next, 1.1, 1.0) + 1e-3 * rng.random(n)
    return similarity


@pytest.mark.parametrize("device", [None, "cpu"])
def test_rows_whose_maxima_fall_in_distinct_columns_take_them_without_a_solve(device: str | None) -> None:
    rng = np.random.default_rng(14)
    a = _gaussian(rng, 1000, 128)
    b = a[rng.permutation(1000)] + 1.0 * _gaussian(rng, 1000, 128)
    similarity = cosine_similarity_matrix(a, b, device=device)
    dense = similarity if device is None else similarity.numpy()
    assert np.unique(dense.argmax(axis=1)).size == 1000  # the premise: no two rows share a best column
    result = solve_assignment(similarity)
    _assert_same_as_scipy(dense, result)
    assert result.stats.method == "row-maxima" and result.stats.rounds == 0 and result.stats.gap_bound == 0.0
    assert "candidates" not in result.stats.seconds  # no candidate graph was built


def test_two_rows_sharing_a_best_column_go_on_to_the_certified_solve() -> None:
    rng = np.random.default_rng(15)
    similarity = 0.1 * rng.random((1000, 1000))
    similarity[np.arange(1000), rng.permutation(1000)] = 0.9  # row maxima in distinct columns ...
    similarity[1, :] = similarity[0, :] - 0.01 * rng.random(1000)  # ... but row 1's best is row 0's
    result = solve_assignment(similarity)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.method == "sparse"


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_nan_or_inf_is_refused_even_where_the_maxima_fall_in_distinct_columns(bad: float) -> None:
    similarity = np.eye(300) + 0.01 * np.random.default_rng(16).random((300, 300))
    similarity[3, 3] = bad  # NaN and +inf both count as row 3's maximum, in its own column
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        max_weight_assignment(similarity)
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        max_weight_assignment(torch.from_numpy(similarity))


def test_adversarial_top_k_forces_enlargement_then_certifies() -> None:
    similarity = _band_adversary(64, 32, seed=5)
    result = solve_assignment(similarity, candidates=2)
    _assert_same_as_scipy(similarity, result)
    stats = result.stats
    assert stats.edges[0] == 2 * 64  # exactly the bands
    assert stats.infeasible_rounds == 0
    assert stats.certificate_failures >= 1
    assert stats.enlarged_rows >= 1
    assert stats.rounds >= 2
    assert stats.repaired_rounds >= 1  # later rounds re-optimised by JV augmentations, not lapmod
    assert stats.method == "sparse"
    # the dense optimum really does use an entry outside the original band
    band = {(i, i) for i in range(64)} | {(i, (i + 1) % 64) for i in range(64)}
    assert any((int(i), int(j)) not in band for i, j in zip(result.row_ind, result.col_ind))


@pytest.mark.parametrize("rows", [600, 450])
def test_random_matrix_with_tiny_candidate_sets_enlarges_until_certified(rows: int) -> None:
    rng = np.random.default_rng(21)
    similarity = cosine_similarity_matrix(_gaussian(rng, rows, 64), _gaussian(rng, 600, 64))
    result = solve_assignment(similarity, candidates=6)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.certificate_failures >= 1
    assert result.stats.rounds >= 2
    assert result.stats.method == "sparse"
    if rows < 600:  # rectangular: later rounds are solved afresh by scipy's sparse solver
        assert result.stats.solver == "scipy-sparse" and result.stats.repaired_rounds == 0
    else:
        assert result.stats.repaired_rounds >= 1


def test_a_wrong_repair_is_caught_and_solved_afresh(monkeypatch: pytest.MonkeyPatch) -> None:
    real_repair = solve._repair
    calls = []

    def worse_repair(indptr, indices, values, x_old, D_old, rows):
        calls.append(rows.size)
        (x, _), D = real_repair(indptr, indices, values, x_old, D_old, rows)
        n = x.size
        for i in range(n):  # swap two rows' columns where both swapped entries are candidates
            for k in range(i + 1, n):
                a = indices[indptr[i] : indptr[i + 1]]
                b = indices[indptr[k] : indptr[k + 1]]
                if x[k] in a and x[i] in b:
                    x[[i, k]] = x[[k, i]]
                    return candidates.validated(x, indptr, indices, n, D.size), D
        raise AssertionError("no swappable pair")

    monkeypatch.setattr(solve, "_repair", worse_repair)
    similarity = _band_adversary(64, 32, seed=5)
    result = solve_assignment(similarity, candidates=2)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.certificate_failures >= 1
    assert calls  # the repair ran, and each of its answers was refused
    assert result.stats.repaired_rounds == 0
    assert result.stats.method == "sparse"


def test_infeasible_candidate_graph_is_enlarged_along_a_hall_violator() -> None:
    # Square random matrix, 3 candidates per row: about n e^-3 columns are in nobody's top 3.
    rng = np.random.default_rng(3)
    similarity = cosine_similarity_matrix(_gaussian(rng, 500, 64), _gaussian(rng, 500, 64))
    result = solve_assignment(similarity, candidates=3)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.infeasible_rounds >= 1
    assert result.stats.edges[1] > result.stats.edges[0]
    assert result.stats.method == "sparse"


def test_popular_columns_make_sparse_hopeless_and_fall_back_to_dense() -> None:
    # Every row ranks the columns alike (a shared popularity term): all top-k sets coincide.
    rng = np.random.default_rng(4)
    popularity = np.linspace(0.0, 1.0, 400)
    similarity = popularity[None, :] + 1e-4 * rng.random((300, 400))
    result = solve_assignment(similarity, candidates=8)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.infeasible_rounds >= 1
    assert result.stats.method == "dense"
    assert result.stats.fallback_reason == "candidate graph too dense"


def test_a_wrong_sparse_solver_answer_is_never_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(6)
    similarity = cosine_similarity_matrix(_gaussian(rng, 400, 64), _gaussian(rng, 400, 64))

    class ReversedLap:
        @staticmethod
        def lapmod(n, costs, indptr, indices, return_cost=False):
            rows, cols = linear_sum_assignment(similarity, maximize=True)
            worse = cols.copy()
            worse[[0, 1]] = worse[[1, 0]]  # a valid permutation, not optimal
            return worse, np.argsort(worse)

    monkeypatch.setattr(solve, "_lap", ReversedLap)
    result = solve_assignment(similarity)
    _assert_same_as_scipy(similarity, result)
    assert result.stats.solver == "scipy-sparse"  # lapmod's answer was rejected
    assert result.stats.method == "sparse"


def test_potentials_reject_a_suboptimal_sparse_matching() -> None:
    # rows 0, 1 and columns 0, 1, all four entries candidates; x = identity scores 1 + 1 < 3 + 3.
    values = np.array([1.0, 3.0, 3.0, 1.0])
    indices = np.array([0, 1, 0, 1], dtype=np.int32)
    indptr = np.array([0, 2, 4])
    x = np.array([0, 1])
    hit = np.array([0, 3])
    assert certificate.potentials(indptr, indices, values, (x, hit), 2) is None
    x, hit = np.array([1, 0]), np.array([1, 2])
    proof = certificate.potentials(indptr, indices, values, (x, hit), 2)
    assert proof is not None
    _, u, D, tol = proof
    full = values.reshape(2, 2)
    assert np.all(u[:, None] + D[None, :] >= full - tol)


def test_ties_give_an_optimal_assignment_of_equal_weight() -> None:
    # Dead units: all-zero activations give all-zero similarity rows, which tie everywhere.
    rng = np.random.default_rng(8)
    a = _gaussian(rng, 300, 64)
    a[:5] = 0.0
    similarity = cosine_similarity_matrix(a, _gaussian(rng, 300, 64))
    result = solve_assignment(similarity)
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    assert sorted(result.col_ind.tolist()) == list(range(300))
    np.testing.assert_allclose(similarity[rows, result.col_ind].sum(), similarity[rows, cols].sum(), rtol=0, atol=1e-6)
    np.testing.assert_array_equal(result.col_ind[5:], cols[5:])  # outside the tied rows: identical


#: Every torch device this machine has: the CPU always, CUDA where present (a GPU machine runs both).
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_tensor_input_on_a_device_matches_numpy(device: str) -> None:
    rng = np.random.default_rng(9)
    a, b = _gaussian(rng, 800, 128), _gaussian(rng, 800, 128)
    similarity = cosine_similarity_matrix(a, b, device=device)
    assert isinstance(similarity, torch.Tensor) and similarity.device.type == device
    np.testing.assert_allclose(similarity.cpu().numpy(), cosine_similarity_matrix(a, b), atol=1e-5)
    result = solve_assignment(similarity, device=device)
    _assert_same_as_scipy(similarity.cpu().numpy(), result)
    assert result.stats.method == "sparse"
    # the torch path also handles the enlargement and infeasible paths
    hard = solve_assignment(similarity, candidates=3)
    _assert_same_as_scipy(similarity.cpu().numpy(), hard)


def test_cuda_request_is_served_or_refused_with_a_clear_error() -> None:
    similarity = np.random.default_rng(4).random((40, 40)).astype(np.float32)
    if torch.cuda.is_available():
        _assert_same_as_scipy(similarity, solve_assignment(similarity, device="cuda"))
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            max_weight_assignment(similarity, device="cuda")


def test_shapes_and_invalid_entries() -> None:
    with pytest.raises(ValueError, match="rows <= cols"):
        max_weight_assignment(np.zeros((50, 40)))
    bad = np.random.default_rng(0).random((100, 200))
    bad[7, 9] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        max_weight_assignment(bad)
    row_ind, col_ind = max_weight_assignment(np.zeros((0, 5)))
    assert row_ind.size == col_ind.size == 0
    small = np.random.default_rng(1).random((10, 12))
    result = solve_assignment(small)
    _assert_same_as_scipy(small, result)
    assert result.stats.method == "dense" and result.stats.fallback_reason == "small problem"


def test_float64_and_fortran_order_inputs() -> None:
    rng = np.random.default_rng(10)
    similarity = cosine_similarity_matrix(_gaussian(rng, 900, 96), _gaussian(rng, 700, 96)).astype(np.float64)
    transposed = similarity.T  # (700, 900), Fortran-ordered: how MATCH hands over a wider first side
    result = solve_assignment(transposed)
    _assert_same_as_scipy(transposed, result)
    assert isinstance(result.stats, AssignmentStats) and result.stats.method == "sparse"
