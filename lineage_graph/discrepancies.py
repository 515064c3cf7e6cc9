"""Conflicts between model cards and weights: what an investigator looks at first.

Only claims the weights actually speak to are judged: a declared base that was never tested against
its model is not called false, and a model is called an undeclared derivative only when it has a
parent in its family tree (the root of a family, the presumed original, is never accused).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from lineage_graph.evidence import Discrepancy, Edge, ModelInfo
from lineage_graph.families import Family

KINDS = ("false_from_scratch", "undeclared_base", "declared_base_independent", "relation_contradicted")
FINETUNE_RELATIONS = {"finetune", "adapter", "quantized"}
"""Declared relations that keep every block and unit of the base."""


def _edge(edges: Mapping[tuple[str, str], Edge], a: str, b: str) -> Edge | None:
    return edges.get((min(a, b), max(a, b)))


def _undeclared(model: ModelInfo, family: Family, edges: Mapping[tuple[str, str], Edge]) -> list[Discrepancy]:
    links = family.parents.get(model.model_id, ())
    confirmed = set(model.declared_base_models) & set(family.members)
    if not links or confirmed and not model.claims_from_scratch:
        return []
    out = []
    for parent, kind in links:
        if kind == "alternative":  # one accusation per model: the tree's parent is named, the note says the rest
            continue
        edge = _edge(edges, parent, model.model_id)
        confidence = edge.direction.confidence if edge.direction.parent == parent else 1.0 - edge.direction.confidence
        claim = "claims to be trained from scratch" if model.claims_from_scratch else "declares no base model"
        order = (f"{parent} is the {'second ' if kind == 'merge' else ''}parent with confidence {confidence:.2f}"
                 if edge.direction.claimed else
                 f"which of the two came first is undecided: confidence {confidence:.2f} that {parent} did")
        out.append(Discrepancy(
            model.model_id,
            "false_from_scratch" if model.claims_from_scratch else "undeclared_base",
            parent,
            confidence,
            f"{model.model_id} {claim}, but its weights depend on {parent} (log10 p = {edge.test.log10_p:.1f}; "
            f"{order})",
            {"log10_p": edge.test.log10_p, "log10_q": edge.log10_q, "direction_reasons": list(edge.direction.reasons)},
        ))
    return out


def _declared_checks(model: ModelInfo, models: Mapping[str, ModelInfo],
                     edges: Mapping[tuple[str, str], Edge]) -> list[Discrepancy]:
    out = []
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
        relation = (model.declared_relation or "").lower()
        if base_info is None or relation not in FINETUNE_RELATIONS:
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


def find_discrepancies(
    models: Mapping[str, ModelInfo], edges: Iterable[Edge], families: Iterable[Family]
) -> list[Discrepancy]:
    """All card-versus-weights conflicts, sorted by model then kind."""
    by_pair = {e.pair: e for e in edges}
    family_of = {m: f for f in families for m in f.members}
    found: list[Discrepancy] = []
    for model in models.values():
        if model.model_id in family_of:
            found += _undeclared(model, family_of[model.model_id], by_pair)
        found += _declared_checks(model, models, by_pair)
    return sorted(found, key=lambda d: (d.model_id, KINDS.index(d.kind), d.related_model or ""))
