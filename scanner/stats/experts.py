"""Which expert of one MoE block goes with which expert of another, before the experts are tested.

Pairing experts by index misses a camouflaged MoE (experts permuted together with the router's rows: the
output is unchanged, every expert i of B is expert pi(i) of A). So the experts are matched first, on an
expert-to-expert similarity that does not depend on the order of A's hidden units inside any expert:

    s(i, j) = mean over sampled units k of B's expert j of max over all units u of A's expert i of
              cos(gate_a[u], gate_b[k])

(a copied, camouflaged or fine-tuned expert scores near 1, an unrelated one near the cosine of random rows). It
reads the gate view alone: a similarity that rewarded the same unit of A for matching in both views (the sum of the
gate and up cosines, as it once was) would pick the expert pairs whose units agree across views, which is what
phi_MATCH measures. Among many small experts that selection shows: a random tiny model with 512 experts of 32 units
per block gave an independent pair log10 p = -5.3 paired on both views, -0.5 on the gate alone.
In a pair test the mean is weighed by what each unit of B contributes (its hidden row's length times its write's,
scanner.reading.activations.block_contributions) over B's largest contributors: an independent check
(bench/redteam/canonical59) put units that add next to nothing into each expert of a copy, their gates copies of
another expert's, and the unweighed mean paired every expert of the original with the wrong one. The weights are a
function of B alone, so the argument below is unchanged.
The pairing is the maximum-similarity assignment of s (one-to-one); when one side has a single MLP (a dense
block against an upcycled MoE), every expert of the other side is paired with it.

Why the p-values stay valid: phi_MATCH's null argument is that, under independence, A's hidden units inside
an expert are exchangeable given B. s, and hence the pairing, is invariant to permuting A's units inside any
expert (a maximum over all of them), so conditioning on the pairing leaves that exchangeability, and each
paired expert's phi_MATCH p-value, intact. One-to-one pairs use disjoint experts on both sides, whose
p-values are independent under the null (FISHER); one-to-many pairs share the single MLP, so they are
combined by Bonferroni (the smallest p-value times the number of pairs), which needs no independence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from scanner.stats.logp import log10_bonferroni, log10_fisher
from scanner.stats.matching import unit_rows

SIMILARITY_UNITS = 512
"""Units of B's expert that the similarity averages over (evenly spaced; all of A's units are always used)."""


@dataclass(frozen=True)
class ExpertPairing:
    """pairs[k] = (expert of A, expert of B); ``one_to_many`` when one side has a single MLP."""

    pairs: list[tuple[int, int]]
    one_to_many: bool
    similarity: np.ndarray

    @property
    def by_index(self) -> bool:
        return all(a == b for a, b in self.pairs)

    def combine(self, log10_ps: Sequence[float]) -> float:
        """One log10 p for the block from the paired experts' log10 p-values (FISHER, or Bonferroni)."""
        if len(log10_ps) == 1:
            return float(log10_ps[0])
        if self.one_to_many:
            return log10_bonferroni(log10_ps)
        return log10_fisher(list(log10_ps))

    def describe(self) -> str:
        """B's experts in order, each with its A expert: '0<-2 1<-0 2<-3 3<-1'."""
        return " ".join(f"{b}<-{a}" for a, b in sorted(self.pairs, key=lambda pair: pair[1]))


def expert_similarity(
    experts_a: Sequence[tuple[np.ndarray, np.ndarray]],
    experts_b: Sequence[tuple[np.ndarray, np.ndarray]],
    units: int = SIMILARITY_UNITS,
    weights_b: Sequence[np.ndarray] | None = None,
) -> np.ndarray:
    """(E_a, E_b) similarities s(i, j) of (gate, up) activations shaped (units, tokens); see the module docstring.
    An expert left with no units (its canonical form dropped every one: it computes nothing) is similar to none:
    0, so the pairing goes on over the others instead of failing on an empty maximum. ``weights_b``: per expert of B,
    what each unit contributes (the mean over B's units is then weighed by it, and the units sampled are the largest
    contributors), so units that add next to nothing cannot lead an expert to another's partner."""
    given = list(weights_b) if weights_b is not None else [None] * len(experts_b)
    picks = [_sample(g.shape[0], units) if w is None else _largest(w, units) for (g, _), w in zip(experts_b, given)]
    gates_a = [unit_rows(g) for g, _ in experts_a]
    gates_b = [unit_rows(g[pick]) for (g, _), pick in zip(experts_b, picks)]
    weights = [np.ones(pick.size) if w is None else np.asarray(w, dtype=np.float64)[pick]
               for w, pick in zip(given, picks)]
    out = np.zeros((len(gates_a), len(gates_b)))
    for i, gate_a in enumerate(gates_a):
        for j, (gate_b, weight) in enumerate(zip(gates_b, weights)):
            if gate_a.shape[0] and gate_b.shape[0] and weight.sum() > 0:
                out[i, j] = float(np.average((gate_b @ gate_a.T).max(axis=1), weights=weight))
    return out


def pair_experts(
    experts_a: Sequence[tuple[np.ndarray, np.ndarray]], experts_b: Sequence[tuple[np.ndarray, np.ndarray]],
    weights_b: Sequence[np.ndarray] | None = None,
) -> ExpertPairing:
    """The pairing of A's and B's experts that the block's tests use (see the module docstring); ``weights_b`` as
    `expert_similarity` takes them."""
    if len(experts_a) == 1 or len(experts_b) == 1:
        pairs = (
            [(0, j) for j in range(len(experts_b))] if len(experts_a) == 1 else [(i, 0) for i in range(len(experts_a))]
        )
        return ExpertPairing(
            pairs=pairs, one_to_many=len(pairs) > 1, similarity=np.ones((len(experts_a), len(experts_b)))
        )
    similarity = expert_similarity(experts_a, experts_b, weights_b=weights_b)
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return ExpertPairing(pairs=[(int(i), int(j)) for i, j in zip(rows, cols)], one_to_many=False, similarity=similarity)


def pair_block_experts(
    experts_a: Sequence[tuple[np.ndarray, np.ndarray]],
    experts_b: Sequence[tuple[np.ndarray, np.ndarray]],
    routed_a: int,
    routed_b: int,
    weights_b: Sequence[np.ndarray] | None = None,
) -> ExpertPairing:
    """`pair_experts` for whole blocks: routed experts come first, shared experts (Qwen-MoE) after them.

    A side with a single MLP (dense) is paired with every MLP of the other; otherwise the routed experts are
    matched and the shared experts that follow them are paired by position.
    """
    if len(experts_a) == 1 or len(experts_b) == 1:
        return pair_experts(experts_a, experts_b)
    routed_a, routed_b = min(routed_a, len(experts_a)), min(routed_b, len(experts_b))
    routed = pair_experts(experts_a[:routed_a], experts_b[:routed_b],
                          None if weights_b is None else list(weights_b)[:routed_b])
    shared = [(routed_a + k, routed_b + k) for k in range(min(len(experts_a) - routed_a, len(experts_b) - routed_b))]
    return ExpertPairing(pairs=routed.pairs + shared, one_to_many=False, similarity=routed.similarity)


def _largest(weights: np.ndarray, units: int) -> np.ndarray:
    """The ``units`` units of largest weight (all where there are no more), in stored order."""
    weights = np.asarray(weights, dtype=np.float64)
    return np.arange(weights.size) if weights.size <= units else np.sort(np.argsort(-weights, kind="stable")[:units])


def _sample(n: int, units: int) -> np.ndarray:
    return np.arange(n) if n <= units else np.unique(np.linspace(0, n - 1, units).round().astype(np.int64))
