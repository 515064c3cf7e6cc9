"""The independence statistics of the paper, as pure functions of arrays.

Each block-level statistic returns a BlockTest whose p-value is valid under the null hypothesis that
the two models were trained independently; FISHER combines blocks whose p-values are independent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from scanner.stats.logp import log10_fisher, log10_matching_p, log10_permutation_p
from scanner.stats.matching import (
    AssignmentSolver,
    Matching,
    cosine_similarity_matrix,
    match,
    match_similarities,
    match_similarity,
    spearman,
)

Theta = TypeVar("Theta")


@dataclass(frozen=True)
class BlockTest:
    """One block's (or one expert's) statistic: Spearman rho, its log10 p-value, and how many units it saw.

    closeness (phi_MATCH only) is the mean cosine of the matched units' activations: how near two related blocks
    are, a descriptive number with no p-value (see matched_closeness)."""

    rho: float
    log10_p: float
    n_units: int
    closeness: float | None = None


def _identity_correlation(matching: Matching) -> BlockTest:
    rho = spearman(matching.a_index.astype(float), matching.b_index.astype(float))
    return BlockTest(rho=rho, log10_p=log10_matching_p(rho, matching.size), n_units=matching.size)


def phi_u(up_a: np.ndarray, up_b: np.ndarray) -> BlockTest:
    """phi_U: Spearman between MATCH of the up-projection weights (h, d) and the identity."""
    return _identity_correlation(match(up_a, up_b))


def phi_h(hidden_a: np.ndarray, hidden_b: np.ndarray, *, device: str | None = None) -> BlockTest:
    """phi_H: Spearman between MATCH of the down-projection inputs (h, tokens) and the identity."""
    return _identity_correlation(match_similarity(cosine_similarity_matrix(hidden_a, hidden_b, device=device)))


def phi_match(
    gate_a: np.ndarray, up_a: np.ndarray, gate_b: np.ndarray, up_b: np.ndarray, *, device: str | None = None
) -> BlockTest:
    """Robust phi_MATCH: Spearman between the gate-activation and the up-activation matchings.

    An adversary who permutes (or re-trains) the hidden units must move gate and up together to keep
    the output, so the two matchings agree for dependent models whatever was done to the units, and
    are unrelated for independent ones. Works for different widths (the smaller side is matched).
    ``device`` (e.g. "cuda") computes the cosine matrices there; the matchings are the same.
    """
    return phi_match_similarity(
        cosine_similarity_matrix(gate_a, gate_b, device=device), cosine_similarity_matrix(up_a, up_b, device=device)
    )


def phi_match_similarity(gate_similarity: Any, up_similarity: Any) -> BlockTest:
    """phi_MATCH from the two precomputed cosine matrices (gate and up), each shaped (units_a, units_b)."""
    return _phi_match_from(gate_similarity, up_similarity, match_similarity(gate_similarity),
                           match_similarity(up_similarity))


MatchInputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(gate_a, up_a, gate_b, up_b): one block's (or expert's) activations of both models."""


def phi_match_many(
    blocks: Sequence[MatchInputs], *, device: str | None = None, solver: AssignmentSolver = "auto",
    max_matrix_bytes: int | None = None,
) -> list[BlockTest]:
    """``[phi_match(*x, device=device) for x in blocks]``, with the assignments of many blocks solved together.

    On a GPU the cosine matrices of as many blocks as fit in ``max_matrix_bytes`` (default: a third of the free
    GPU memory, leaving room for the auction's working memory) are built there and their assignments solved as
    one batch by the auction (``solver``, see scanner.stats.matching); the results are those of ``phi_match``
    (every matching is certified optimal either way). On the host one block's matrices are held at a time.
    """
    if max_matrix_bytes is None:
        max_matrix_bytes = _free_matrix_bytes(device) if device not in (None, "cpu") or solver == "auction" else 0
    results: list[BlockTest] = []
    group: list[MatchInputs] = []
    group_bytes = 0
    for inputs in [*blocks, None]:
        size = 0 if inputs is None else 8 * inputs[0].shape[0] * inputs[2].shape[0]  # two float32 matrices
        if group and (inputs is None or group_bytes + size > max_matrix_bytes):
            gates = [cosine_similarity_matrix(ga, gb, device=device) for ga, _, gb, _ in group]
            ups = [cosine_similarity_matrix(ua, ub, device=device) for _, ua, _, ub in group]
            matchings = match_similarities([*gates, *ups], solver)
            results += [_phi_match_from(g, u, by_g, by_u) for g, u, by_g, by_u in
                        zip(gates, ups, matchings[: len(group)], matchings[len(group):], strict=True)]
            group, group_bytes = [], 0
        if inputs is not None:
            group.append(inputs)
            group_bytes += size
    return results


def _free_matrix_bytes(device: str | None) -> int:
    import torch

    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0] // 3
    return 1 << 30


def _phi_match_from(gate_similarity: Any, up_similarity: Any, by_gate: Matching, by_up: Matching) -> BlockTest:
    rho = spearman(by_gate.larger_side.astype(float), by_up.larger_side.astype(float))
    closeness = (matched_closeness(gate_similarity, by_gate) + matched_closeness(up_similarity, by_up)) / 2.0
    return BlockTest(rho=rho, log10_p=log10_matching_p(rho, by_gate.size), n_units=by_gate.size, closeness=closeness)


def matched_closeness(similarity: Any, matching: Matching) -> float:
    """Mean cosine between the activations of the units MATCH paired: 1 for a copy, lower the further two
    related blocks have moved apart, near 0 for unrelated ones.

    It orders relatives by nearness where p-values cannot (they saturate at the permutation floor), and it is
    unchanged by every output-preserving transformation (unit permutation and rescaling, residual rotation)
    because it is read from matched activations. A descriptive number: it has no null distribution.
    """
    if matching.size == 0:
        return 0.0
    if isinstance(similarity, np.ndarray):
        return float(np.mean(similarity[matching.a_index, matching.b_index], dtype=np.float64))
    import torch

    rows = torch.as_tensor(matching.a_index, device=similarity.device)
    cols = torch.as_tensor(matching.b_index, device=similarity.device)
    return float(similarity[rows, cols].double().mean())


def fisher(tests: list[BlockTest]) -> float:
    """FISHER (Algorithm 3): one log10 p for blocks whose p-values are independent under the null."""
    return log10_fisher([t.log10_p for t in tests])


@dataclass(frozen=True)
class PermTestResult(Generic[Theta]):
    """PERMTEST outcome: the observed statistic, the T resampled ones, and the exact log10 p."""

    observed: float
    null_values: np.ndarray
    log10_p: float


def permtest(
    statistic: Callable[[Theta, Theta], float],
    theta_a: Theta,
    theta_b: Theta,
    sample_transform: Callable[[np.random.Generator], Callable[[Theta], Theta]],
    n_samples: int = 99,
    seed: int = 0,
) -> PermTestResult[Theta]:
    """PERMTEST (Algorithm 1) for any statistic and any transformation class.

    If theta_a's training is equivariant and its initialisation invariant under the transformations
    drawn by sample_transform, transformed copies of theta_a are exchangeable with theta_a under the
    null, so the rank of the observed statistic among them is uniform: p >= 1/(T+1), exactly valid.
    """
    rng = np.random.default_rng(seed)
    observed = statistic(theta_a, theta_b)
    null_values = np.array([statistic(sample_transform(rng)(theta_a), theta_b) for _ in range(n_samples)])
    return PermTestResult(
        observed=observed, null_values=null_values, log10_p=log10_permutation_p(observed, null_values)
    )
