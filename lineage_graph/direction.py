"""Direction of a dependent pair: independent pieces of evidence, each with a stated reliability, combined.

An independence test says two models share ancestry, not which came first. Each signal below votes for
a parent with a reliability r (the probability it is right when it speaks, an assumption documented in
docs/lineage.md); votes add as log-odds log(r / (1 - r)), so a strong declaration outweighs a weak
weight statistic and two weak signals that agree beat one alone. The result states its reasons.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import networkx as nx

from lineage_graph.block_maps import reading
from lineage_graph.evidence import Direction, Edge, ModelInfo
from scanner.pairs.block_map import BlockMap


@dataclass(frozen=True)
class Signal:
    """One kind of direction evidence: the probability it points the right way when it votes (assumed or measured),
    whether it may decide a direction by itself, and whether averaging moves it as descent does (so that it says
    nothing between a merge and its parents)."""

    reliability: float
    decides_alone: bool = True
    merge_blind: bool = False


_WEAK = {"decides_alone": False, "merge_blind": True}
SIGNALS: dict[str, Signal] = {
    "declared": Signal(0.95),
    "declared_ancestry": Signal(0.9),
    "structure": Signal(0.85),
    "block_map": Signal(0.9),
    "depth": Signal(0.75),
    "dates": Signal(0.75),
    "activation_rank": Signal(0.8, **_WEAK),
    "activation_scale": Signal(0.8, **_WEAK),
    "scratch_claim": Signal(0.65),
    "verbatim_values": Signal(0.95),
}
"""Assumed probability that each signal points the right way when it votes. activation_rank's is measured: it
pointed the right way on 22 of the 25 true parent links of the zoo, seeds 1-3 and the fine-tune chain where it voted
(copies and merges aside; 0.88, Wilson 95% interval 0.70-0.96); the three misses are the small zoos' long
fine-tune, whose rank rose above its base's. depth (fewer blocks, the same units and experts) is below structure
and below the default level: a depth prune and a depth up-scaling (blocks repeated, as SOLAR-10.7B was made) differ
only in which model is the parent, so alone it leaves the direction undecided. block_map tells them apart where the
pair's any-order block map is known (lineage_graph.block_maps): repeated blocks mean an up-scaling, dropped ones a
prune; it replaces the depth vote. activation_scale (the gate activations' scale grows under training) pointed the
right way on all 59 of the fitted zoos' fine-tune links where it voted (3% margin; Wilson 95% lower bound 0.94) and
never the wrong way on the 91 fine-tunes and retrained MLPs measured; 0.8 like the rank, both weak signals that never
decide alone. verbatim_values (lineage_graph.value_sources: a merge that took bit-equal values from
relatives sharing none, a sparse edit of a model whose other sparse edits share its values, a change that is a
relative's exactly scaled) is a declaration the weights make themselves, as reliable as a card's: it named the 39
TIES and DARE merges of the 13 bench merge zoos with exactly their parents and nothing anywhere else (the recipe,
small, chain and merge zoos' 1,000-odd models).

The two weak signals (``decides_alone`` false) are statistics of one model's activations that training can move by a
little either way (a short fine-tune measured 0.5% above its base's rank): none decides a direction by itself; a
leaning is claimed when a strong signal (a declaration, structure, a block map, dates, a merge's geometry) supports
it, or two independent weak ones do (these two, or one with the family tree's shape). They are ``merge_blind`` too:
averaging two models spreads activations and shrinks their scale, so a merge has a higher activation rank and a lower
scale than its parents, as a parent has, and the votes would point backwards; family trees leave them out of the
confidence of merge links (lineage_graph.phylogeny)."""

NOT_ALONE = frozenset(name for name, signal in SIGNALS.items() if not signal.decides_alone)
MERGE_BLIND = frozenset(name for name, signal in SIGNALS.items() if signal.merge_blind)


@dataclass(frozen=True)
class Weighing:
    """How the evidence is weighed: each signal's reliability (SIGNALS' unless given: reliabilities measured on
    held-out recipes, or 0.5 for a signal removed, which then says nothing) and whether the family tree's shape is a
    prior on its root. Ablations and held-out measurements pass one of these; nothing edits the module's tables."""

    reliability: Mapping[str, float] = field(default_factory=lambda: {n: s.reliability for n, s in SIGNALS.items()})
    shape_prior: bool = True

    def without(self, source: str) -> Weighing:
        """This weighing with one source removed: a vote signal (reliability 0.5), or "shape" (no shape prior)."""
        if source == "shape":
            return replace(self, shape_prior=False)
        return replace(self, reliability={**self.reliability, source: 0.5})

    def log_odds(self, a: str, cast: Iterable[Vote]) -> float:
        """The log-odds that ``a`` is the parent, from these votes (each log(r / (1 - r)), signed by whom it names)."""
        total = 0.0
        for vote in cast:
            r = self.reliability[vote.signal]
            total += math.log(r / (1 - r)) * (1 if vote.parent == a else -1)
        return total


DEFAULT_WEIGHING = Weighing()

NEAR_COPY_CLOSENESS = 0.96
"""Pairs at least this close are near copies (a few steps of training, 0.967-0.973 on the merge zoos; a round trip
through a quantized format, 0.976 on SmolLM2; an average that stayed by one of its models, such as a model-stock merge
of fine-tunes that drifted apart, 0.99 from its base): their activation statistics differ by what an average or a
few steps add, which points either way, so neither the rank nor the scale votes between them."""

RANK_MARGIN = 0.005
"""Relative differences in activation effective rank below this (0.5%) give no vote: copies differ by ~1e-6,
fine-tunes of the zoo by 1.5-6%."""
SCALE_MARGIN = 0.03
"""Relative differences in activation scale below this (3%) give no vote: camouflaged copies differ by < 0.1%, MLPs
retrained by distillation by up to 2.3% either way, the fitted zoos' fine-tunes by -1.3% to +100% (59 of 82 above
3%, none below -2%)."""


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


def _structure_votes(a: ModelInfo, b: ModelInfo, block_map: BlockMap | None = None) -> list[Vote]:
    votes = []
    for child, parent in ((a, b), (b, a)):
        found = _smaller(child, parent)
        if found and found[0] == "depth" and block_map is not None:
            votes += _block_map_votes(child, parent, block_map)
        elif found:
            votes.append(Vote(parent.model_id, *found))
    return votes


def _block_map_votes(shallow: ModelInfo, deep: ModelInfo, block_map: BlockMap) -> list[Vote]:
    """The depth change read from the pair's any-order block map: an up-scaling (the shallower model is the parent)
    or a prune (the deeper one is); nothing when the map shows neither."""
    found = reading(block_map, shallow.n_layers or 0, deep.n_layers or 0)
    mapped = ", ".join(f"{link.deep}<-{link.shallow}" for link in sorted(block_map, key=lambda x: x.deep))
    if found == "upscale":
        return [Vote(shallow.model_id, "block_map",
                     f"every block of {deep.model_id} maps to a block of {shallow.model_id} and some to the same one "
                     f"(blocks {mapped}): blocks repeated, a depth up-scaling of {shallow.model_id}")]
    if found == "prune":
        return [Vote(deep.model_id, "block_map",
                     f"each block of {shallow.model_id} maps to its own block of {deep.model_id}, and some of "
                     f"{deep.model_id}'s map to none (blocks {mapped}): blocks dropped, a depth prune of "
                     f"{deep.model_id}")]
    return []


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


def _scale_votes(a: ModelInfo, b: ModelInfo) -> list[Vote]:
    """The model whose gate activations are smaller is taken as the earlier one: training grows them (an update
    adds to a unit's weights in directions nearly orthogonal to them). Only between models of one shape."""
    if not a.activation_scale or not b.activation_scale or len(a.activation_scale) != len(b.activation_scale):
        return []
    if (a.intermediate_size, a.n_experts) != (b.intermediate_size, b.n_experts):
        return []
    sa, sb = sum(a.activation_scale) / len(a.activation_scale), sum(b.activation_scale) / len(b.activation_scale)
    if abs(sa - sb) < SCALE_MARGIN * min(sa, sb):
        return []
    parent, child, sp, sc = (a, b, sa, sb) if sa < sb else (b, a, sb, sa)
    return [Vote(parent.model_id, "activation_scale",
                 f"activation scale grows from {parent.model_id} ({sp:.4g}) to {child.model_id} ({sc:.4g}): training "
                 "grows the gate activations, so the larger-scale model is taken as the later one")]


def votes(a: ModelInfo, b: ModelInfo, ancestors: Mapping[str, set[str]], block_map: BlockMap | None = None,
          closeness: float | None = None) -> list[Vote]:
    """Every signal's vote on the pair (a, b); a signal with nothing to say casts none. ``block_map``: the pair's
    any-order block map when its depths differ and one was made; ``closeness``: the pair's, when known (near copies
    get no rank vote)."""
    near_copy = closeness is not None and closeness >= NEAR_COPY_CLOSENESS
    return [*_declared_votes(a, b, ancestors), *_structure_votes(a, b, block_map), *_date_votes(a, b),
            *_scratch_votes(a, b), *([] if near_copy else [*_rank_votes(a, b), *_scale_votes(a, b)])]


def combine(a: str, b: str, cast: Iterable[Vote], weighing: Weighing = DEFAULT_WEIGHING) -> Direction:
    """Naive-Bayes combination of votes: sum of signed log-odds, confidence = sigmoid(|sum|)."""
    cast = list(cast)
    score = weighing.log_odds(a, cast)
    reasons = tuple(f"{v.signal}: {v.reason}" for v in cast)
    if abs(score) < 1e-12:
        return Direction(None, None, 0.5, reasons or ("no direction evidence",))
    parent, child = (a, b) if score > 0 else (b, a)
    supporting = {v.signal for v in cast if v.parent == parent}
    corroborated = not supporting <= NOT_ALONE or len(supporting) >= 2
    return Direction(parent, child, 1.0 / (1.0 + math.exp(-abs(score))), reasons, corroborated=corroborated)


def orient(a: ModelInfo, b: ModelInfo, ancestors: Mapping[str, set[str]], block_map: BlockMap | None = None,
           closeness: float | None = None, weighing: Weighing = DEFAULT_WEIGHING) -> Direction:
    """Direction of the dependent pair (a, b) with its confidence and reasons."""
    return combine(a.model_id, b.model_id, votes(a, b, ancestors, block_map, closeness), weighing)


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
