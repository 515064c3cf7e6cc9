"""The independence statistics of the paper, as pure functions of arrays.

Each block-level statistic returns a BlockTest whose p-value is valid under the null hypothesis that
the two models were trained independently; FISHER combines blocks whose p-values are independent.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

import numpy as np

from scanner.stats.degenerate import (
    MIN_INFORMATIVE_UNITS,
    UnitScreen,
    combined_rows,
    describe,
    screen_units,
    too_few,
)
from scanner.stats.logp import log10_fisher, log10_matching_p, log10_permutation_p
from scanner.stats.matching import (
    Matching,
    MatchingRule,
    cosine_similarity_matrix,
    match_for,
    spearman,
    unit_rows,
    unit_rows_tensor,
)
from scanner.stats.views import decoupled_up, oriented_rows

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
    set_aside: str = ""  # what scanner.stats.degenerate set aside (all-zero, duplicated units), or ""
    cannot_test: str = ""  # why the block could not be tested ("" when it was): its log10_p counts for nothing

    @property
    def value(self) -> float:
        """The raw statistic, Spearman's rho (scanner.stats.result.StatisticResult)."""
        return self.rho


def _no_p_value(a: UnitScreen, b: UnitScreen) -> BlockTest:
    """A block with too few informative units: it cannot be tested (no evidence either way), and why."""
    kept = " and ".join(f"{side} has {s.kept}" for side, s in (("A", a), ("B", b)) if s.kept < MIN_INFORMATIVE_UNITS)
    return BlockTest(rho=0.0, log10_p=0.0, n_units=min(a.kept, b.kept), set_aside=describe(a, b),
                     cannot_test=f"too few informative units ({kept}; at least {MIN_INFORMATIVE_UNITS} needed)")


def _identity_correlation(rows_a: np.ndarray, rows_b: np.ndarray, similarity: Callable[[], Any],
                           rule: MatchingRule) -> BlockTest:
    """Spearman between MATCH (on the informative rows) and the identity, on the rows' own indices."""
    a, b = screen_units(rows_a), screen_units(rows_b)
    if too_few(a, b):
        return _no_p_value(a, b)
    kept_a, kept_b = np.flatnonzero(a.informative), np.flatnonzero(b.informative)

    def with_identity(matching: Matching) -> float:
        return spearman(kept_a[matching.a_index].astype(float), kept_b[matching.b_index].astype(float))

    (matching,) = match_for([similarity(kept_a, kept_b)],
                            lambda m: log10_matching_p(with_identity(m[0]), m[0].size), rule)
    rho = with_identity(matching)
    return BlockTest(rho=rho, log10_p=log10_matching_p(rho, matching.size), n_units=matching.size,
                     set_aside=describe(a, b))


def phi_u(up_a: np.ndarray, up_b: np.ndarray, *, rule: MatchingRule = "screened") -> BlockTest:
    """phi_U: Spearman between MATCH of the up-projection weights (h, d) and the identity."""
    return _identity_correlation(up_a, up_b, lambda ka, kb: cosine_similarity_matrix(up_a[ka], up_b[kb]), rule)


def phi_h(hidden_a: np.ndarray, hidden_b: np.ndarray, *, device: str | None = None,
          rule: MatchingRule = "screened") -> BlockTest:
    """phi_H: Spearman between MATCH of the down-projection inputs (h, tokens) and the identity."""
    return _identity_correlation(
        hidden_a, hidden_b, lambda ka, kb: cosine_similarity_matrix(hidden_a[ka], hidden_b[kb], device=device), rule
    )


def phi_match(
    gate_a: np.ndarray, up_a: np.ndarray, gate_b: np.ndarray, up_b: np.ndarray, *, device: str | None = None,
    up_sign_free: bool = False, rule: MatchingRule = "screened",
) -> BlockTest:
    """Robust phi_MATCH: Spearman between the gate-activation and the up-activation matchings.

    An adversary who permutes (or re-trains) the hidden units must move gate and up together to keep
    the output, so the two matchings agree for dependent models whatever was done to the units, and
    are unrelated for independent ones. Works for different widths (the smaller side is matched).
    ``device`` (e.g. "cuda") computes the cosine matrices there; the matchings are the same. Units that are
    all-zero or constant in either view are set aside first, and each group of duplicated units keeps one
    (scanner.stats.degenerate). ``up_sign_free``: the up view's sign carries no identity (a gated MLP: negating a
    unit's up row and its down column keeps the outputs), so up units are matched on |cosine|. ``rule``: how MATCH
    pairs units (scanner.stats.matching.MatchingRule).
    """
    return phi_match_many([(gate_a, up_a, gate_b, up_b)], device=device, rule=rule, up_sign_free=up_sign_free)[0]


def phi_match_similarity(gate_similarity: Any, up_similarity: Any, stored_up: tuple[Any, Any],
                         up_sign_free: bool = False, rule: MatchingRule = "screened") -> BlockTest:
    """phi_MATCH from the two precomputed cosine matrices (gate, and up as the test reads it: decoupled_up), each
    shaped (units_a, units_b); ``stored_up``: both sides' up rows as stored, in the matrices' unit order, which the
    closeness reads (paired_cosine)."""
    matchings = match_for([gate_similarity, up_similarity], views_log10_p, rule)
    return _phi_match_from(gate_similarity, matchings, paired_cosine(*stored_up, matchings[1], up_sign_free))


MatchInputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""(gate_a, up_a, gate_b, up_b): one block's (or expert's) activations of both models."""

WriteViews = tuple[Any, Any] | None
"""(write_a, write_b): one block's (or expert's) write views of both models, or None where a side has none."""


def phi_match_many(
    blocks: Sequence[MatchInputs], *, device: str | None = None, rule: MatchingRule = "screened",
    max_matrix_bytes: int | None = None, up_sign_free: bool = False,
    screens: Sequence[tuple[UnitScreen, UnitScreen]] | None = None, writes: Sequence[WriteViews] | None = None,
    gate_sign_free: bool = False,
) -> list[BlockTest]:
    """``[phi_match(*x, device=device, up_sign_free=up_sign_free, rule=rule) for x in blocks]``; ``screens`` (each
    side's `screen_units` of every block, as `UnitScreen`s made with the same ``up_sign_free``) spares screening
    units again that a caller screened before.

    ``writes``: per block, both sides' write views (what each unit writes, scanner.reading.activations). For a gated MLP
    (``up_sign_free``) with both, the block's units are matched by a third view, and its p-value is the smallest of
    the three view pairs' (gate and decoupled up, gate and write, decoupled up and write) times three (Bonferroni;
    phi_MATCH version 4, see views_log10_p): a copy fine-tuned to push its read views away from the original's has
    to push what each unit writes too, which costs it its outputs.

    ``gate_sign_free``: a plain MLP whose activation has act(z) - act(-z) = z, whose write views are its second view
    free of the units' signs (scanner.reading.activations.plain_views). Its units are matched in four views, and its
    p-value is the smaller of two pairs' times two: the first and second views as stored (their power on relatives), and
    the first turned to a positive mean (`oriented_rows`) with the sign-free write view, which a copy whose units were
    negated leaves as they were. The stored and the turned first view are one view read twice and are never paired.

    On a GPU the cosine matrices of as many blocks as fit in ``max_matrix_bytes`` (default: a third of the free
    GPU memory) are built there in one go and matched there (the greedy matching; the exact one selects candidates
    there and solves on the host). On the host one block's matrices are held at a time.
    """
    if max_matrix_bytes is None:
        max_matrix_bytes = _free_matrix_bytes(device) if device not in (None, "cpu") else 0
    results: list[BlockTest | None] = []
    group: list[tuple[int, MatchInputs, WriteViews, str]] = []  # (position, informative inputs, writes, set aside)
    group_bytes = 0
    given = list(screens) if screens is not None else [None] * len(blocks)
    read_writes = list(writes) if writes is not None and (up_sign_free or gate_sign_free) else [None] * len(blocks)
    for inputs, screen, write in zip([*blocks, None], [*given, None], [*read_writes, None], strict=True):
        screened = None if inputs is None else _screened(inputs, screen, up_sign_free, write)
        if isinstance(screened, BlockTest):
            results.append(screened)
            continue
        views = 2 if screened is None or screened[2] is None else 3 if up_sign_free else 4
        size = 0 if screened is None else 4 * views * screened[1][0].shape[0] * screened[1][2].shape[0]
        if group and (screened is None or group_bytes + size > max_matrix_bytes):
            for k, test in _group_tests(group, device, rule, up_sign_free):
                results[k] = test
            group, group_bytes = [], 0
        if screened is not None:
            results.append(None)
            group.append((len(results) - 1, screened[1], screened[2], screened[0]))
            group_bytes += size
    return [r for r in results if r is not None]


def _group_tests(group: list[tuple[int, MatchInputs, WriteViews, str]], device: str | None, rule: MatchingRule,
                 up_sign_free: bool) -> list[tuple[int, BlockTest]]:
    """phi_MATCH of a group of screened blocks, their cosine matrices built together (on ``device``)."""
    similarities = []
    for _, (ga, ua, gb, ub), write, _ in group:
        views = [cosine_similarity_matrix(ga, gb, device=device),
                 cosine_similarity_matrix(decoupled_up(ga, ua), decoupled_up(gb, ub), device=device,
                                          sign_free=up_sign_free)]
        if write is not None and up_sign_free:
            views.append(cosine_similarity_matrix(*write, device=device, sign_free=True))
        elif write is not None:  # a plain MLP whose gate sign is free (phi_match_many)
            views += [cosine_similarity_matrix(oriented_rows(ga), oriented_rows(gb), device=device),
                      cosine_similarity_matrix(*write, device=device)]
        similarities.append(views)
    out = []
    for (k, (_, ua, _, ub), _, note), views in zip(group, similarities, strict=True):
        matchings = match_for(views, views_log10_p, rule)
        out.append((k, replace(_phi_match_from(views[0], matchings, paired_cosine(ua, ub, matchings[1], up_sign_free)),
                               set_aside=note)))
    return out


def _screened(inputs: MatchInputs, screens: tuple[UnitScreen, UnitScreen] | None, up_sign_free: bool,
              write: WriteViews = None) -> BlockTest | tuple[str, MatchInputs, WriteViews]:
    """One block's inputs (and write views) reduced to its informative units (scanner.stats.degenerate) with a note
    of what was set aside, or the block's no-p-value result when too few are left."""
    gate_a, up_a, gate_b, up_b = inputs
    a, b = screens or (match_screen(gate_a, up_a, up_sign_free, None if write is None else write[0]),
                       match_screen(gate_b, up_b, up_sign_free, None if write is None else write[1]))
    if too_few(a, b):
        return _no_p_value(a, b)
    if not (a.set_aside or b.set_aside):
        return "", inputs, write
    merged_write = None if write is None else (_merged(write[0], a, "write"), _merged(write[1], b, "write"))
    return describe(a, b), (_merged(gate_a, a, "gate"), _merged(up_a, a, "up"), _merged(gate_b, b, "gate"),
                            _merged(up_b, b, "up")), merged_write


def match_screen(gate: Any, up: Any, up_sign_free: bool, write: Any = None,
                 magnitude: np.ndarray | None = None) -> UnitScreen:
    """The screen phi_MATCH reads one side through: its gate and up views, and its ``write`` view where given (units
    are duplicates only if they agree in every view: a copy fine-tuned to make its units read alike still writes
    apart), the up and write views up to sign where it is free; each duplicate group's rows those of its members'
    one function, from their writes and sizes (``magnitude``: |write| |up| per unit; combined_rows)."""
    views, flips = ((gate, up), (False, up_sign_free)) if write is None else \
        ((gate, up, write), (False, up_sign_free, up_sign_free))
    screen = screen_units(*views, sign_free=flips, mass=magnitude)
    if not screen.duplicated:
        return screen
    gates, ups, writes = combined_rows(screen, gate, up, sign_free=up_sign_free, writes=write, magnitude=magnitude)
    return replace(screen, gate=gates, up=ups, write=writes)


def _merged(view: Any, screen: UnitScreen, part: str) -> Any:
    """The view's informative rows (each duplicate group's combined row, see match_screen), kept where the view
    lives: a pair worker's fingerprints are tensors on its GPU."""
    on_gpu = hasattr(view, "cpu")  # a torch tensor (numpy 2 arrays have .device too)
    combined = getattr(screen, part)
    if combined is not None:
        if on_gpu:
            import torch

            return torch.as_tensor(combined, dtype=view.dtype if view.is_floating_point() else None,
                                   device=view.device)
        return combined.astype(np.float32)
    if on_gpu:
        import torch

        return view[torch.as_tensor(screen.informative, device=view.device)]
    return view[screen.informative]


def _free_matrix_bytes(device: str | None) -> int:
    import torch

    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.mem_get_info(torch.device(device))[0] // 3
    return 1 << 30


#: Which views' matchings are compared, by the number of views (phi_match_many): two (gate, decoupled up): that
#: pair; three (and write): every pair; four (a plain MLP's first and second view, its first view turned to a
#: positive mean, its sign-free write view): as stored, and turned with the sign-free view.
VIEW_PAIRS = {2: ((0, 1),), 3: ((0, 1), (0, 2), (1, 2)), 4: ((0, 1), (2, 3))}


def _view_pairs(matchings: Sequence[Matching]) -> list[tuple[float, float]]:
    """(Spearman rho, its log10 p) of each compared pair of the views' matchings (`VIEW_PAIRS`), the stored gate
    and decoupled up first."""
    n = matchings[0].size
    rhos = [spearman(matchings[i].larger_side.astype(float), matchings[j].larger_side.astype(float))
            for i, j in VIEW_PAIRS[len(matchings)]]
    return [(rho, log10_matching_p(rho, n)) for rho in rhos]


def views_log10_p(matchings: Sequence[Matching]) -> float:
    """phi_MATCH's log10 p from its views' matchings (what the screened rule screens on): with two views (gate,
    decoupled up), their agreement's; with more, the smallest of the compared pairs' (`VIEW_PAIRS`) times their
    number (Bonferroni: valid whatever the pairs' joint law, each pair's p-value valid by the argument for two
    views)."""
    return _strongest(_view_pairs(matchings))[1]


def _strongest(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The strongest view pair's rho, and its log10 p times the number of pairs (at most 1)."""
    rho, log10_p = min(pairs, key=lambda pair: pair[1])
    return rho, min(0.0, log10_p + math.log10(len(pairs)))


def _phi_match_from(gate_similarity: Any, matchings: Sequence[Matching], up_closeness: float) -> BlockTest:
    """The block's test: rho of its strongest view pair, the combined p-value, the closeness of gate and up."""
    rho, log10_p = _strongest(_view_pairs(matchings))
    closeness = (matched_closeness(gate_similarity, matchings[0]) + up_closeness) / 2.0
    return BlockTest(rho=rho, log10_p=log10_p, n_units=matchings[0].size, closeness=closeness)


def paired_cosine(up_a: Any, up_b: Any, matching: Matching, sign_free: bool) -> float:
    """Mean cosine of the up rows (as stored, not decoupled) of the units a matching paired, |cosine| where the view's
    sign is free: the up half of a block's closeness, which orders relatives as it did before the test decoupled its
    views (the matching is the decoupled views'; a copy's and a fine-tune's pair the same units either way)."""
    if matching.size == 0:
        return 0.0
    if hasattr(up_a, "cpu"):
        import torch

        rows_a = unit_rows_tensor(up_a[torch.as_tensor(matching.a_index, device=up_a.device)].float())
        rows_b = unit_rows_tensor(up_b[torch.as_tensor(matching.b_index, device=up_b.device)].float())
        cosines = (rows_a * rows_b).sum(dim=1).double()
        return float((cosines.abs() if sign_free else cosines).mean())
    cosines = (unit_rows(np.asarray(up_a)[matching.a_index]).astype(np.float64)
               * unit_rows(np.asarray(up_b)[matching.b_index])).sum(axis=1)
    return float(np.mean(np.abs(cosines) if sign_free else cosines))


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
    """FISHER (Algorithm 3): one log10 p for blocks whose p-values are independent under the null (blocks that could
    not be tested left out)."""
    return log10_fisher([t.log10_p for t in tests if not t.cannot_test])


@dataclass(frozen=True)
class PermTestResult(Generic[Theta]):
    """PERMTEST outcome: the observed statistic, the T resampled ones, and the exact log10 p."""

    observed: float
    null_values: np.ndarray
    log10_p: float

    @property
    def value(self) -> float:
        """The observed statistic (scanner.stats.result.StatisticResult)."""
        return self.observed


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
