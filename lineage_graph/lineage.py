"""From current models and pair tests to the lineage: FDR-controlled edges, directions, families, trees,
discrepancies. Pure: build.py reads the store and writes the result back."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from lineage_graph.direction import (
    MERGE_BLIND,
    combine,
    declared_ancestry,
    evidence_graph,
    orient,
    votes,
)
from lineage_graph.discrepancies import find_discrepancies
from lineage_graph.evidence import (
    DEFAULT_MIN_DIRECTION_CONFIDENCE,
    Direction,
    Discrepancy,
    Edge,
    ModelInfo,
    PairTest,
)
from lineage_graph.families import Family, assign_ids, components, family_tree
from lineage_graph.multiple_testing import Method, fdr_adjust, fdr_reject, holm_reject
from lineage_graph.phylogeny import CLONE_CLOSENESS, Phylogeny, family_phylogeny

BLOCK_LOG10_P = -2.0
"""A block pair enters an edge's block map when its own log10 p is at most this (localize's default)."""

NO_DIRECTION = Direction(None, None, 0.5, ())


@dataclass(frozen=True)
class Lineage:
    """Everything rebuilt from one state of the store."""

    q: float
    method: str
    statistic: str
    models: Mapping[str, ModelInfo]
    edges: list[Edge]
    families: list[Family]
    discrepancies: list[Discrepancy]
    min_direction_confidence: float = DEFAULT_MIN_DIRECTION_CONFIDENCE
    """Directions below this confidence are not claimed (drawn without an arrow, "direction undecided")."""

    def family_of(self, model_id: str) -> Family | None:
        return next((f for f in self.families if model_id in f.members), None)

    def edge(self, a: str, b: str) -> Edge | None:
        return next((e for e in self.edges if e.pair == (min(a, b), max(a, b))), None)


def _earliest_key(models: Mapping[str, ModelInfo]):
    far = datetime.max.replace(tzinfo=UTC)

    def key(model_id: str) -> tuple[datetime, str]:
        created = models[model_id].created_at if model_id in models else None
        if created is not None and created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return created or far, model_id

    return lambda members: min(members, key=key)


def _edges(models: Mapping[str, ModelInfo], tests: list[PairTest], q: float, method: Method) -> list[Edge]:
    log10_p = [t.log10_p for t in tests]
    adjusted, rejected = fdr_adjust(log10_p, method=method), fdr_reject(log10_p, q=q, method=method)
    family_wise = holm_reject(log10_p, alpha=q)
    ancestors = declared_ancestry(models.values())
    edges = []
    for test, log10_q, dependent, strong in zip(tests, adjusted, rejected, family_wise):
        block_map = tuple((int(layer["layer_a"]), int(layer["layer_b"])) for layer in test.layers
                          if layer.get("log10_p") is not None and layer["log10_p"] <= BLOCK_LOG10_P)
        direction = orient(models[test.model_a], models[test.model_b], ancestors) if dependent else NO_DIRECTION
        edges.append(Edge(test, float(log10_q), bool(dependent), direction, block_map, bool(dependent and strong)))
    return edges


def compute_lineage(
    models: Iterable[ModelInfo],
    tests: Iterable[PairTest],
    *,
    q: float = 0.05,
    method: Method = "bh",
    statistic: str = "match",
    previous_families: Mapping[str, Collection[str]] | None = None,
    min_direction_confidence: float = DEFAULT_MIN_DIRECTION_CONFIDENCE,
) -> Lineage:
    """The lineage of these models from their pair tests (tests of unknown models and without a p are ignored).

    previous_families (family id -> members, from the last rebuild) keeps family ids stable; a direction whose
    confidence is below min_direction_confidence is kept but not claimed (``Direction.decided``).
    """
    by_id = {m.model_id: m for m in models}
    usable = sorted((t for t in tests if t.model_a in by_id and t.model_b in by_id and t.log10_p is not None
                     and math.isfinite(t.log10_p)), key=lambda t: (t.model_a, t.model_b))
    edges = _edges(by_id, usable, q, method)
    dependent_pairs = {e.pair for e in edges if e.dependent}
    ancestors = declared_ancestry(by_id.values())
    depth = {m: len(a) for m, a in ancestors.items()}
    evidence = evidence_graph(edges)
    named = assign_ids(components(by_id, edges), previous_families or {}, _earliest_key(by_id))
    families = []
    for fid, members in sorted(named.items()):
        confirmed = {m: {b for b in by_id[m].declared_base_models if (min(b, m), max(b, m)) in dependent_pairs}
                     for m in members}
        inside = [e for e in edges if e.dependent and set(e.pair) <= members]
        tree = _closeness_tree(members, inside, confirmed, by_id)
        if tree is None:  # pairs tested before closeness was recorded: trees from p-values and votes, as before
            root, parents = family_tree(members, evidence, confirmed, depth)
        else:
            root, parents = tree.root, tree.parents
            edges = _orient_links(edges, tree, members)
        families.append(Family(fid, tuple(sorted(members)), root, parents))
    edges = [_decide(e, min_direction_confidence) for e in edges]
    return Lineage(q, method, statistic, by_id, edges, families, find_discrepancies(by_id, edges, families),
                   min_direction_confidence)


def _decide(edge: Edge, level: float) -> Edge:
    """The edge with its direction claimed only when its confidence reaches ``level``; an unclaimed one says why."""
    d = edge.direction
    if d.parent is None or d.confidence >= level:
        return edge
    reason = (f"direction undecided: confidence {d.confidence:.2f} is below the level set "
              f"(lineage.min_direction_confidence = {level:g}); {d.parent} and {d.child} are related, and which "
              "came first is not claimed")
    return replace(edge, direction=replace(d, decided=False, reasons=(*d.reasons, reason)))


def _closeness_tree(members: frozenset[str], inside: list[Edge], confirmed: Mapping[str, set[str]],
                    models: Mapping[str, ModelInfo]) -> Phylogeny | None:
    """The family's tree from closeness when every dependent pair inside it has one (else None)."""
    if any(e.test.closeness is None for e in inside):
        return None
    closeness = {e.pair: whole_model_closeness(e.test, models) for e in inside}
    ancestors = declared_ancestry(models.values())
    log_odds, merge_log_odds = {}, {}
    for e in inside:
        cast = votes(models[e.pair[0]], models[e.pair[1]], ancestors)
        for odds, kept in ((log_odds, cast), (merge_log_odds, [v for v in cast if v.signal not in MERGE_BLIND])):
            d = combine(*e.pair, kept)
            if d.parent is not None and 0.5 < d.confidence < 1.0:
                value = math.log(d.confidence / (1.0 - d.confidence))
                odds[e.pair] = value if d.parent == e.pair[0] else -value
    return family_phylogeny(members, closeness, log_odds, confirmed, merge_log_odds)


def whole_model_closeness(test: PairTest, models: Mapping[str, ModelInfo]) -> float:
    """The test's closeness with every block that only one model has counted as 0: a depth-pruned model is then no
    nearer to a distant relative than its unpruned parent is merely because fewer blocks were compared.

    The factor is the shared depth over the larger depth, never the number of blocks the test compared: a sequential
    test that stopped after its screening blocks compared 4 of 30 shared blocks, and its closeness (their mean) is an
    estimate for all 30, not a model that shares only 4."""
    depths = [models[m].n_layers for m in (test.model_a, test.model_b)]
    if not all(depths):
        return float(test.closeness)
    return float(test.closeness) * min(depths) / max(depths)


def _orient_links(edges: list[Edge], tree: Phylogeny, members: frozenset[str]) -> list[Edge]:
    """Every tree or merge link of the family points the way the rooted tree does, with the tree's confidence."""
    links = {(p, c): kind for c, ls in tree.parents.items() for p, kind in ls}
    out = []
    for e in edges:
        a, b = e.pair
        link = next(((p, c) for p, c in ((a, b), (b, a)) if (p, c) in links), None)
        if link is None or not set(e.pair) <= members:
            out.append(e)
            continue
        parent, child = link
        closeness = e.test.closeness if e.test.closeness is not None else float("nan")
        if links[link] == "copy":
            reason = (f"family tree: {child} is a copy of {parent} (closeness {closeness:.4f} >= {CLONE_CLOSENESS}): "
                      "the same function, so the weights cannot say which is the original: which way it points rests "
                      "on the votes above alone (none: confidence 0.5, no direction claimed)")
        else:
            kind = {"merge": "merge parent", "alternative": "alternative parent"}.get(links[link], "parent")
            reason = (f"family tree: {parent} is the {kind} of {child} (closeness {closeness:.4f}); the tree is rooted "
                      f"at {tree.root}, the placement that agrees best with the family's shape and the direction "
                      "evidence of its links")
            if link in tree.notes:
                reason += f"; {tree.notes[link]}"
        out.append(replace(e, direction=Direction(parent, child, tree.confidence[link],
                                                  (*[r for r in e.direction.reasons if r != "no direction evidence"],
                                                   reason))))
    return out
