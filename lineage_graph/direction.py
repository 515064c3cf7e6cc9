"""Direction of a dependent pair: independent pieces of evidence, each with a stated reliability, combined.

An independence test says two models share ancestry, not which came first. Each signal below votes for
a parent with a reliability r (the probability it is right when it speaks, an assumption documented in
docs/lineage.md); votes add as log-odds log(r / (1 - r)), so a strong declaration outweighs a weak
weight statistic and two weak signals that agree beat one alone. The result states its reasons.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import networkx as nx

from lineage_graph.evidence import Direction, Edge, ModelInfo

RELIABILITY: dict[str, float] = {
    "declared": 0.95,
    "declared_ancestry": 0.9,
    "structure": 0.85,
    "depth": 0.75,
    "dates": 0.75,
    "activation_rank": 0.8,
    "scratch_claim": 0.65,
}
"""Assumed probability that each signal points the right way when it votes. activation_rank's is measured: it
pointed the right way on 22 of the 25 true parent links of the zoo, seeds 1-3 and the fine-tune chain where it voted
(copies and merges aside; 0.88, Wilson 95% interval 0.70-0.96); the three misses are the small zoos' long
fine-tune, whose rank rose above its base's. depth (fewer blocks, the same units and experts) is below structure
and below the default level: a depth prune and a depth up-scaling (blocks repeated, as SOLAR-10.7B was made) differ
only in which model is the parent, so alone it leaves the direction undecided."""

MERGE_BLIND = frozenset({"activation_rank"})
"""Signals that say nothing between a merge and its parents: averaging two models spreads activations, so a merge
has a higher activation rank than its parents and the vote would point backwards. Family trees leave them out of
the confidence of merge links (lineage_graph.phylogeny)."""

NOT_ALONE = frozenset({"activation_rank"})
"""Signals that never decide a direction alone: a leaning that nothing else supports is left undecided, whatever its
confidence. The activation rank is a statistic of one model's activations that training can move either way by a
little (a short fine-tune measured 0.5% above its base); it may tip a direction other evidence leans towards, not
make one."""

RANK_MARGIN = 0.005
"""Relative differences in activation effective rank below this (0.5%) give no vote: copies differ by ~1e-6,
fine-tunes of the zoo by 1.5-6%."""


@dataclass(frozen=True)
class Vote:
    parent: str
    signal: str
    reason: str


def declared_ancestry(models: Iterable[ModelInfo]) -> dict[str, set[str]]:
    """Every model's declared ancestors, following base_model declarations transitively (cycles tolerated)."""
    graph = nx.DiGraph()
    for model in models:
        graph.add_node(model.model_id)
        for base in model.declared_base_models:
            if base != model.model_id:
                graph.add_edge(base, model.model_id)
    return {node: nx.ancestors(graph, node) for node in graph.nodes}


def _declared_votes(a: ModelInfo, b: ModelInfo, ancestors: Mapping[str, set[str]]) -> list[Vote]:
    votes = []
    for parent, child in ((a, b), (b, a)):
        if parent.model_id in child.declared_base_models and child.model_id not in parent.declared_base_models:
            relation = f" ({child.declared_relation})" if child.declared_relation else ""
            votes.append(Vote(parent.model_id, "declared",
                              f"{child.model_id} declares base_model {parent.model_id}{relation}"))
    if votes:
        return votes
    a_anc, b_anc = ancestors.get(a.model_id, set()), ancestors.get(b.model_id, set())
    for parent, child, child_anc, parent_anc in ((a, b, b_anc, a_anc), (b, a, a_anc, b_anc)):
        if parent.model_id in child_anc and child.model_id not in parent_anc:
            votes.append(Vote(parent.model_id, "declared_ancestry",
                              f"{parent.model_id} is a declared ancestor of {child.model_id}"))
    return votes


def _smaller(x: ModelInfo, y: ModelInfo) -> tuple[str, str] | None:
    """(signal, reason) when x's blocks and units fit strictly inside y's (x is the pruned one), else None: signal
    "depth" when only the block count differs (an up-scaling would read the same), else "structure"."""
    dims = [(x.n_layers, y.n_layers, "blocks"), (x.intermediate_size, y.intermediate_size, "MLP units"),
            (x.n_experts or 1, y.n_experts or 1, "experts")]
    if any(u is None or v is None for u, v, _ in dims) or x.hidden_size != y.hidden_size:
        return None
    if all(u <= v for u, v, _ in dims) and any(u < v for u, v, _ in dims):
        shrunk = ", ".join(f"{u} vs {v} {name}" for u, v, name in dims if u < v)
        if all(u == v for u, v, _ in dims[1:]):
            return "depth", (f"{x.model_id} has fewer blocks than {y.model_id} ({shrunk}): the shallower model is "
                             "taken as the pruned one (a depth up-scaling would be the reverse)")
        return "structure", f"{x.model_id} fits inside {y.model_id} ({shrunk}): the smaller model is the pruned one"
    return None


def _structure_votes(a: ModelInfo, b: ModelInfo) -> list[Vote]:
    votes = []
    for child, parent in ((a, b), (b, a)):
        found = _smaller(child, parent)
        if found:
            votes.append(Vote(parent.model_id, *found))
    return votes


def _date_votes(a: ModelInfo, b: ModelInfo) -> list[Vote]:
    if a.created_at is None or b.created_at is None or a.created_at == b.created_at:
        return []
    first, second = (a, b) if a.created_at < b.created_at else (b, a)
    return [Vote(first.model_id, "dates", f"{first.model_id} was created before {second.model_id} "
                 f"({first.created_at:%Y-%m-%d %H:%M} vs {second.created_at:%Y-%m-%d %H:%M})")]


def _scratch_votes(a: ModelInfo, b: ModelInfo) -> list[Vote]:
    for claimer, other in ((a, b), (b, a)):
        if claimer.claims_from_scratch and not other.claims_from_scratch and not other.declares_base:
            return [Vote(claimer.model_id, "scratch_claim",
                         f"{claimer.model_id} claims training from scratch; {other.model_id} declares nothing")]
    return []


def _rank_votes(a: ModelInfo, b: ModelInfo) -> list[Vote]:
    """The model whose activations spread over more directions is taken as the earlier one: fine-tuning
    concentrates them. Only between models of one shape (rank depends on the unit count); abstains on mergers'
    ground too (a merge averages two models and raises the rank), which the family tree handles by closeness."""
    if not a.activation_rank or not b.activation_rank or len(a.activation_rank) != len(b.activation_rank):
        return []
    if (a.intermediate_size, a.n_experts) != (b.intermediate_size, b.n_experts):
        return []
    ra, rb = sum(a.activation_rank) / len(a.activation_rank), sum(b.activation_rank) / len(b.activation_rank)
    if abs(ra - rb) < RANK_MARGIN * (ra + rb) / 2:
        return []
    parent, child, rp, rc = (a, b, ra, rb) if ra > rb else (b, a, rb, ra)
    return [Vote(parent.model_id, "activation_rank",
                 f"activation effective rank falls from {parent.model_id} ({rp:.2f}) to {child.model_id} ({rc:.2f}): "
                 "fine-tuning concentrates activations, so the lower-rank model is taken as the later one")]


def votes(a: ModelInfo, b: ModelInfo, ancestors: Mapping[str, set[str]]) -> list[Vote]:
    """Every signal's vote on the pair (a, b); a signal with nothing to say casts none."""
    return [*_declared_votes(a, b, ancestors), *_structure_votes(a, b), *_date_votes(a, b),
            *_scratch_votes(a, b), *_rank_votes(a, b)]


def combine(a: str, b: str, cast: Iterable[Vote]) -> Direction:
    """Naive-Bayes combination of votes: sum of signed log-odds, confidence = sigmoid(|sum|)."""
    cast = list(cast)
    score = 0.0
    for vote in cast:
        r = RELIABILITY[vote.signal]
        score += math.log(r / (1 - r)) * (1 if vote.parent == a else -1)
    reasons = tuple(f"{v.signal}: {v.reason}" for v in cast)
    if abs(score) < 1e-12:
        return Direction(None, None, 0.5, reasons or ("no direction evidence",))
    parent, child = (a, b) if score > 0 else (b, a)
    corroborated = not {v.signal for v in cast if v.parent == parent} <= NOT_ALONE
    return Direction(parent, child, 1.0 / (1.0 + math.exp(-abs(score))), reasons, corroborated=corroborated)


def orient(a: ModelInfo, b: ModelInfo, ancestors: Mapping[str, set[str]]) -> Direction:
    """Direction of the dependent pair (a, b) with its confidence and reasons."""
    return combine(a.model_id, b.model_id, votes(a, b, ancestors))


def evidence_graph(edges: Iterable[Edge], strength_cap: float | None = None) -> nx.DiGraph:
    """Directed, weighted evidence over dependent pairs: both orientations of every pair, each weighted by
    strength x probability of that orientation, so a spanning arborescence always exists and prefers
    strong, confidently oriented edges. strength_cap bounds -log10 p (None keeps it as is)."""
    graph = nx.DiGraph()
    for edge in edges:
        if not edge.dependent:
            continue
        a, b = edge.pair
        strength = edge.strength if strength_cap is None else min(edge.strength, strength_cap)
        d = edge.direction
        p_ab = 0.5 if d.parent is None else (d.confidence if d.parent == a else 1.0 - d.confidence)
        graph.add_edge(a, b, weight=strength * p_ab, strength=strength, p=p_ab)
        graph.add_edge(b, a, weight=strength * (1.0 - p_ab), strength=strength, p=1.0 - p_ab)
    return graph
