"""Conflicts between model cards and weights: what an investigator looks at first.

Only claims the weights actually speak to are judged: a declared base that was never tested against
its model is not called false, and a model is called an undeclared derivative only when it has a
parent in its family tree by a link whose direction is claimed. A model related to another whose order the
evidence does not settle is accused of nothing: it gets a ``cannot_tell`` entry instead ("which came first is not
known"), which exports and pages do not flag.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lineage_graph.direction import combine, votes
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE, Discrepancy, Edge, ModelInfo
from lineage_graph.families import Family
from scanner.pairs.block_map import BlockMap

ACCUSATIONS = ("false_from_scratch", "undeclared_base", "declared_base_independent", "relation_contradicted",
               "declared_direction_contradicted")
"""Kinds that say a card is wrong."""
CANNOT_TELL = "cannot_tell"
"""A model that declares no relative the weights tie it to, where which of the two came first is undecided: no one is
accused."""
KINDS = (*ACCUSATIONS, CANNOT_TELL)
FINETUNE_RELATIONS = {"finetune", "adapter", "quantized"}
"""Declared relations that keep every block and unit of the base."""
WEIGHT_SIGNALS = frozenset({"structure", "depth", "block_map", "activation_rank"})
"""Direction signals read from the weights alone (what a declaration is checked against)."""


def _edge(edges: Mapping[tuple[str, str], Edge], a: str, b: str) -> Edge | None:
    return edges.get((min(a, b), max(a, b)))


def _undeclared(model: ModelInfo, family: Family, edges: Mapping[tuple[str, str], Edge]) -> list[Discrepancy]:
    links = family.parents.get(model.model_id, ())
    confirmed = set(model.declared_base_models) & set(family.members)
    if not links or confirmed and not model.claims_from_scratch:
        return []
    claim = "claims to be trained from scratch" if model.claims_from_scratch else "declares no base model"
    out = []
    for parent, kind in links:
        if kind == "alternative":  # one accusation per model: the tree's parent is named, the note says the rest
            continue
        if kind == "copy":  # a copy is one function with its original: what holds for the group holds for it
            out += _copy_findings(model, parent, family, edges, claim)
            continue
        edge = _edge(edges, parent, model.model_id)
        if edge is None:
            continue
        second = "second " if kind == "merge" else ""
        out.append(_finding(model, parent, edge, claim, f"its weights depend on {parent}", second))
    return out


def _finding(model: ModelInfo, parent: str, edge: Edge, claim: str, how: str, second: str = "") -> Discrepancy:
    """An accusation when the link's direction (parent above the model) is claimed, else "cannot tell"."""
    d = edge.direction
    confidence = d.confidence if d.parent == parent else 1.0 - d.confidence
    evidence = {"log10_p": edge.test.log10_p, "log10_q": edge.log10_q, "direction_reasons": list(d.reasons)}
    if d.claimed and d.parent == parent:
        return Discrepancy(
            model.model_id, "false_from_scratch" if model.claims_from_scratch else "undeclared_base", parent,
            confidence, f"{model.model_id} {claim}, but {how} (log10 p = {edge.test.log10_p:.1f}; {parent} is the "
                        f"{second}parent with confidence {confidence:.2f})", evidence)
    return Discrepancy(
        model.model_id, CANNOT_TELL, parent, max(confidence, 1.0 - confidence),
        f"{model.model_id} {claim} and {how} (log10 p = "
        f"{edge.test.log10_p:.1f}), but which of the two came first is undecided (confidence {confidence:.2f} that "
        f"{parent} did): neither card is accused", evidence)


def _copy_findings(model: ModelInfo, original: str, family: Family, edges: Mapping[tuple[str, str], Edge],
                   claim: str) -> list[Discrepancy]:
    """A copy (the same function as ``original``) depends on whatever the group derives from: accused when the
    group has a parent by a claimed link; cannot tell when the group is the family's root (which copy is the
    original is not known) or its parent link is undecided."""
    links = [(p, k) for p, k in family.parents.get(original, ()) if k in ("tree", "merge")]
    if not links:
        edge = _edge(edges, original, model.model_id)
        if edge is None:
            return []
        return [Discrepancy(
            model.model_id, CANNOT_TELL, original, 0.5,
            f"{model.model_id} {claim} and is a copy of {original} (the same function; log10 p = "
            f"{edge.test.log10_p:.1f}), but which of the two is the original cannot be told from weights: neither "
            "card is accused", {"log10_p": edge.test.log10_p, "log10_q": edge.log10_q})]
    out = []
    for parent, kind in links:
        edge = _edge(edges, parent, original)
        if edge is not None:
            out.append(_finding(model, parent, edge, claim,
                                f"it is a copy of {original} (the same function), whose weights depend on {parent}",
                                "second " if kind == "merge" else ""))
    return out


def _declared_checks(model: ModelInfo, models: Mapping[str, ModelInfo], edges: Mapping[tuple[str, str], Edge],
                     level: float, block_maps: Mapping[tuple[str, str], BlockMap]) -> list[Discrepancy]:
    out = _stacking_check(model)
    for base in model.declared_base_models:
        edge = _edge(edges, base, model.model_id)
        if edge is None:
            continue
        if not edge.dependent:
            out.append(Discrepancy(
                model.model_id, "declared_base_independent", base, 1.0 - 10 ** edge.test.log10_p,
                f"{model.model_id} declares {base} as its base, but the weights show no dependence "
                f"(log10 p = {edge.test.log10_p:.2f}, not significant after FDR control)",
                {"log10_p": edge.test.log10_p, "log10_q": edge.log10_q, "statistic": edge.test.statistic},
            ))
            continue
        base_info = models.get(base)
        if base_info is None:
            continue
        out += _direction_check(model, base_info, edge, level, block_maps.get(edge.pair))
        relation = (model.declared_relation or "").lower()
        if relation not in FINETUNE_RELATIONS:
            continue
        dropped = [f"{m} vs {b} {name}" for m, b, name in (
            (model.n_layers, base_info.n_layers, "blocks"),
            (model.intermediate_size, base_info.intermediate_size, "MLP units"),
        ) if m is not None and b is not None and m < b]
        if dropped:
            out.append(Discrepancy(
                model.model_id, "relation_contradicted", base, 0.85,
                f"{model.model_id} declares a {relation} of {base}, but it is smaller ({', '.join(dropped)}): "
                "blocks or units were dropped, so it is at least a pruned derivative",
                {"log10_p": edge.test.log10_p, "declared_relation": relation},
            ))
    return out


def _direction_check(model: ModelInfo, base: ModelInfo, edge: Edge, level: float, block_map: BlockMap | None
                     ) -> list[Discrepancy]:
    """The weights alone (structure, block map, activation statistics) claiming the declared base derives from the
    model: the declaration runs against a direction the weights decide by themselves."""
    alone = combine(model.model_id, base.model_id,
                    [v for v in votes(model, base, {}, block_map) if v.signal in WEIGHT_SIGNALS])
    if alone.parent != model.model_id or alone.confidence < level or not alone.corroborated:
        return []
    return [Discrepancy(
        model.model_id, "declared_direction_contradicted", base.model_id, alone.confidence,
        f"{model.model_id} declares {base.model_id} as its base, but the weights alone say {base.model_id} derives "
        f"from {model.model_id} (confidence {alone.confidence:.2f}: {'; '.join(alone.reasons)})",
        {"log10_p": edge.test.log10_p, "direction_reasons": list(alone.reasons)})]


def _stacking_check(model: ModelInfo) -> list[Discrepancy]:
    """A passthrough merge config whose slices stack another number of blocks than the weights hold."""
    merge = model.declared_merge
    stacked = merge.stacked_blocks if merge is not None else None
    if stacked is None or model.n_layers is None or stacked == model.n_layers:
        return []
    sources = ", ".join(f"{s.model} blocks {s.layers[0]}-{s.layers[1] - 1}" for s in merge.sources if s.layers)
    return [Discrepancy(
        model.model_id, "relation_contradicted", merge.sources[0].model, 0.95,
        f"{model.model_id}'s mergekit_config.yml stacks {stacked} blocks ({sources}), but its weights have "
        f"{model.n_layers}", {"declared_merge": merge.to_json()})]


def find_discrepancies(
    models: Mapping[str, ModelInfo], edges: Iterable[Edge], families: Iterable[Family],
    level: float = DEFAULT_MIN_DIRECTION_CONFIDENCE, block_maps: Mapping[tuple[str, str], BlockMap] | None = None,
) -> list[Discrepancy]:
    """All card-versus-weights conflicts (and the "cannot tell" entries), sorted by model then kind; ``level``: the
    confidence a direction from the weights alone needs to contradict a declaration."""
    by_pair = {e.pair: e for e in edges}
    family_of = {m: f for f in families for m in f.members}
    found: list[Discrepancy] = []
    for model in models.values():
        if model.model_id in family_of:
            found += _undeclared(model, family_of[model.model_id], by_pair)
        found += _declared_checks(model, models, by_pair, level, block_maps or {})
    return sorted(found, key=lambda d: (d.model_id, KINDS.index(d.kind), d.related_model or ""))
