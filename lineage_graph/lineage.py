"""From current models and pair tests to the lineage: FDR-controlled edges, directions, families, trees,
discrepancies. Pure: build.py reads the store and writes the result back."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import networkx as nx

from lineage_graph.block_maps import copied_sources, map_closeness
from lineage_graph.direction import (
    DEFAULT_WEIGHING,
    NOT_ALONE,
    Vote,
    Weighing,
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
from lineage_graph.kinship import LINK_KINSHIP
from lineage_graph.multiple_testing import Method, fdr_adjust, fdr_reject, holm_reject
from lineage_graph.phylogeny import CLONE_CLOSENESS, FamilyEvidence, Phylogeny, family_phylogeny
from lineage_graph.value_sources import ValueSources, value_sources
from scanner.pairs.block_map import BlockMap, one_width

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


def _edges(models: Mapping[str, ModelInfo], tests: list[PairTest], q: float, method: Method,
           block_maps: Mapping[tuple[str, str], BlockMap], weighing: Weighing) -> list[Edge]:
    log10_p = [t.log10_p for t in tests]
    adjusted, rejected = fdr_adjust(log10_p, method=method), fdr_reject(log10_p, q=q, method=method)
    family_wise = holm_reject(log10_p, alpha=q)
    ancestors = declared_ancestry(models.values())
    edges = []
    for test, log10_q, dependent, strong in zip(tests, adjusted, rejected, family_wise):
        block_map = tuple((int(layer["layer_a"]), int(layer["layer_b"])) for layer in test.layers
                          if layer.get("log10_p") is not None and layer["log10_p"] <= BLOCK_LOG10_P)
        direction = (orient(models[test.model_a], models[test.model_b], ancestors,
                            block_maps.get((test.model_a, test.model_b)), test.closeness, weighing)
                     if dependent else NO_DIRECTION)
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
    block_maps: Mapping[tuple[str, str], BlockMap] | None = None,
    weighing: Weighing = DEFAULT_WEIGHING,
) -> Lineage:
    """The lineage of these models from their pair tests (tests of unknown models and without a p are ignored).

    previous_families (family id -> members, from the last rebuild) keeps family ids stable; a direction whose
    confidence is below min_direction_confidence is kept but not claimed (``Direction.decided``); block_maps: the
    any-order block maps of depth-changed pairs, (model_a, model_b) -> map (lineage_graph.block_maps), where made;
    weighing: how the votes are weighed (each signal's reliability, the shape prior): ablations and reliabilities
    measured on held-out recipes are passed here.
    """
    block_maps = block_maps or {}
    by_id = {m.model_id: m for m in models}
    usable = sorted((t for t in tests if t.model_a in by_id and t.model_b in by_id and t.log10_p is not None
                     and math.isfinite(t.log10_p)), key=lambda t: (t.model_a, t.model_b))
    edges = _edges(by_id, usable, q, method, block_maps, weighing)
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
        values = value_sources(members, by_id, {e.pair: e.test.closeness for e in inside
                                                if e.test.closeness is not None})
        tree = _closeness_tree(members, inside, confirmed, by_id, block_maps, values, weighing)
        if tree is None:  # pairs tested before closeness was recorded: trees from p-values and votes, as before
            root, parents = family_tree(members, evidence, confirmed, depth)
        else:
            root, parents = tree.root, tree.parents
            edges = _orient_links(edges, tree, members, values)
        families.append(Family(fid, tuple(sorted(members)), root, parents))
    edges = [_decide(e, min_direction_confidence) for e in edges]
    edges = relatives(edges, families, min_direction_confidence)
    families = [replace(f, root_decided=root_decided(f, edges)) for f in families]
    return Lineage(q, method, statistic, by_id, edges, families,
                   find_discrepancies(by_id, edges, families, min_direction_confidence, block_maps),
                   min_direction_confidence)


def _decide(edge: Edge, level: float) -> Edge:
    """The edge with its direction claimed only when its confidence reaches ``level`` and something besides the
    signals that may not decide alone supports it; an unclaimed one says why."""
    d = edge.direction
    if d.parent is None or (d.confidence >= level and d.corroborated):
        return edge
    if d.confidence < level:
        reason = (f"direction undecided: confidence {d.confidence:.2f} is below the level set "
                  f"(lineage.min_direction_confidence = {level:g}); {d.parent} and {d.child} are related, and which "
                  "came first is not claimed")
    else:
        reason = (f"direction undecided: the leaning (confidence {d.confidence:.2f}) rests on nothing that may "
                  f"decide it: {' and '.join(sorted(NOT_ALONE)).replace('_', ' ')} alone, which may tip a direction "
                  "other evidence supports but never decides one, or a placement among models the weights tie in an "
                  "exact relation; which came first is not claimed")
    return replace(edge, direction=replace(d, decided=False, reasons=(*d.reasons, reason)))


def _closeness_tree(members: frozenset[str], inside: list[Edge], confirmed: Mapping[str, set[str]],
                    models: Mapping[str, ModelInfo], block_maps: Mapping[tuple[str, str], BlockMap],
                    values: ValueSources, weighing: Weighing) -> Phylogeny | None:
    """The family's tree from closeness when every dependent pair inside it has one (else None); ``values``: what
    the members' verbatim weight values say (linked like copied blocks, with a strong vote each)."""
    if any(e.test.closeness is None for e in inside):
        return None
    mapped = {m for pair in block_maps for m in pair if m in members}
    closeness = {e.pair: whole_model_closeness(e.test, models, block_maps.get(e.pair)) for e in inside
                 if e.pair in block_maps or not _unmapped_depth_change(e.pair, models, mapped)}
    _reconnect(closeness, members, [e.test for e in inside if e.pair not in closeness], models)
    ancestors = declared_ancestry(models.values())
    cast: dict[tuple[str, str], tuple[Vote, ...]] = {}
    for e in inside:
        pair_votes = votes(models[e.pair[0]], models[e.pair[1]], ancestors, block_maps.get(e.pair), e.test.closeness)
        pair_votes += [Vote(p, "verbatim_values", values.reasons[(p, c)]) for p, c in (e.pair, e.pair[::-1])
                       if (p, c) in values.reasons]
        if values.entangled_pair(*e.pair):  # a merge or its source: the rank and the scale cannot tell
            pair_votes = [v for v in pair_votes if v.signal not in NOT_ALONE]
        cast[e.pair] = tuple(pair_votes)
    copied = copied_sources({p: m for p, m in block_maps.items() if set(p) <= members}, models, CLONE_CLOSENESS)
    for child, holds in values.links().items():
        copied.setdefault(child, set()).update(holds)
    evidence = FamilyEvidence(
        closeness, cast, confirmed, copied,
        shapes={m: (models[m].n_layers, models[m].hidden_size, models[m].intermediate_size, models[m].n_experts or 1)
                for m in members},
        ranks={m: sum(models[m].activation_rank) / len(models[m].activation_rank) for m in members
               if models[m].activation_rank},
        no_merge=values.rules_out_merge)
    return family_phylogeny(members, evidence, weighing)


def _unmapped_depth_change(pair: tuple[str, str], models: Mapping[str, ModelInfo], mapped: set[str]) -> bool:
    """A depth-changed pair of one width without a block map whose deeper model has maps to other relatives: comparing
    its blocks by index pairs misaligned ones (closeness far too low beside the mapped pairs'), so the tree leaves the
    pair's distance out rather than mix the two estimates."""
    a, b = (models[m] for m in pair)
    if not a.n_layers or not b.n_layers or a.n_layers == b.n_layers or not one_width(a, b):
        return False  # no map could be made for it: the by-index estimate is all there is
    deeper = pair[0] if a.n_layers > b.n_layers else pair[1]
    return deeper in mapped


def _reconnect(closeness: dict[tuple[str, str], float], members: frozenset[str], left_out: list[PairTest],
               models: Mapping[str, ModelInfo]) -> None:
    """Add back, nearest first, the by-index estimates of pairs left out (_unmapped_depth_change) that the family's
    distances need to connect its members: a rough distance places a model, where none leaves the tree undrawn."""
    parts = nx.utils.UnionFind(members)
    for a, b in closeness:
        parts.union(a, b)
    for test in sorted(left_out, key=lambda t: (-float(t.closeness), t.model_a, t.model_b)):
        if parts[test.model_a] != parts[test.model_b]:
            closeness[(test.model_a, test.model_b)] = whole_model_closeness(test, models)
            parts.union(test.model_a, test.model_b)


def whole_model_closeness(test: PairTest, models: Mapping[str, ModelInfo], block_map: BlockMap | None = None
                          ) -> float:
    """The test's closeness with every block that only one model has counted as 0: a depth-pruned model is then no
    nearer to a distant relative than its unpruned parent is merely because fewer blocks were compared. With the
    pair's any-order block map (depths differ), the mean over the deeper model's blocks of each one's closeness to
    the block it maps to: an up-scaled model's repeated blocks are near their source, not counted as missing.

    The factor is the shared depth over the larger depth, never the number of blocks the test compared: a sequential
    test that stopped after its screening blocks compared 4 of 30 shared blocks, and its closeness (their mean) is an
    estimate for all 30, not a model that shares only 4."""
    depths = [models[m].n_layers for m in (test.model_a, test.model_b)]
    if not all(depths):
        return float(test.closeness)
    if block_map is not None:
        return map_closeness(block_map, max(depths))
    return float(test.closeness) * min(depths) / max(depths)


def _orient_links(edges: list[Edge], tree: Phylogeny, members: frozenset[str], values: ValueSources) -> list[Edge]:
    """Every tree or merge link of the family points the way the rooted tree does, with the tree's confidence (and
    the verbatim values' reason where they gave one)."""
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
        own = [r for r in e.direction.reasons if r != "no direction evidence"]
        found = [values.reasons[pair] for pair in (link, link[::-1]) if pair in values.reasons]
        if relation := values.entangled_pair(*link):
            found.append(f"exact combination: {', '.join(sorted(relation))} reproduce one another's sampled MLP "
                         "weight values to float32 rounding, but none as an average of the others (a task-arithmetic "
                         "merge whose weights sum to more than 1): any of them may be the merge of the others, so "
                         "neither the rank and scale nor the tree's placement orders two of them")
        out.append(replace(e, direction=Direction(parent, child, tree.confidence[link], (*own, *found, reason),
                                                  corroborated=tree.corroborated.get(link, True) and not relation)))
    return out


def root_decided(family: Family, edges: list[Edge]) -> bool:
    """Whether the family's root is claimed as its original: every link out of it is a decided direction (a lone
    model is its own original)."""
    by_pair = {e.pair: e for e in edges}
    out = [by_pair.get((min(p, c), max(p, c))) for p, c, _ in family.tree_edges() if p == family.root]
    return all(e is not None and e.direction.claimed and e.direction.parent == family.root for e in out)


@dataclass(frozen=True)
class _Up:
    """A link from a member to one of its parents in the tree: the parent, the link's confidence, and whether its
    direction is claimed."""

    parent: str
    confidence: float
    claimed: bool


def relatives(edges: list[Edge], families: list[Family], level: float) -> list[Edge]:
    """Every dependent pair inside one family tree that is no link of it, with its kinship and the direction the
    tree gives it: an ancestor is the parent with the product of the link confidences between them (claimed when
    every one is claimed and the product reaches ``level``); siblings and cousins get no direction (neither derives
    from the other); a pair with an undecided link between them is a "relative" whose order is not claimed. Copies
    count as one model (the tree's links to a copy group hold for each of its members)."""
    by_pair = {e.pair: e for e in edges}
    family_of = {m: f for f in families for m in f.members}
    links = {(min(p, c), max(p, c)): kind for f in families for p, c, kind in f.tree_edges()}
    trees = {f.family_id: _FamilyTree(f, by_pair) for f in families if len(f.members) > 1}
    out = []
    for e in edges:
        a, b = e.pair
        family = family_of.get(a)
        if not e.dependent or family is None or b not in family.members:
            out.append(e)
        elif e.pair in links:
            out.append(replace(e, kinship=LINK_KINSHIP[links[e.pair]]))
        else:
            out.append(trees[family.family_id].relate(e, level))
    return out


class _FamilyTree:
    """One family's links as ancestry: each copy group as one member, each member's parents (tree and merge links;
    an alternative parent is a doubt, not an ancestor) and its ancestors with the best path to each."""

    def __init__(self, family: Family, edges: Mapping[tuple[str, str], Edge]) -> None:
        self.group = {m: m for m in family.members}
        self.up: dict[str, list[_Up]] = {}
        for parent, child, kind in family.tree_edges():
            if kind == "copy":
                self.group[child] = parent
        for parent, child, kind in family.tree_edges():
            if kind in ("tree", "merge"):
                d = edges[(min(parent, child), max(parent, child))].direction
                self.up.setdefault(self.rep(child), []).append(_Up(self.rep(parent), d.confidence, d.claimed))
        self._ancestors: dict[str, dict[str, tuple[float, bool, tuple[str, ...]]]] = {}

    def rep(self, model: str) -> str:
        while self.group[model] != model:
            model = self.group[model]
        return model

    def ancestors(self, node: str) -> dict[str, tuple[float, bool, tuple[str, ...]]]:
        """ancestor -> (product of link confidences, every link claimed, the members between) on the best path."""
        if node not in self._ancestors:
            self._ancestors[node] = {}  # a cycle (none in a tree) would end here
            found: dict[str, tuple[float, bool, tuple[str, ...]]] = {}
            for link in self.up.get(node, ()):
                candidates = {link.parent: (link.confidence, link.claimed, ())}
                for anc, (conf, claimed, via) in self.ancestors(link.parent).items():
                    candidates[anc] = (conf * link.confidence, claimed and link.claimed, (link.parent, *via))
                for anc, value in candidates.items():
                    if anc not in found or value[0] > found[anc][0]:
                        found[anc] = value
            self._ancestors[node] = found
        return self._ancestors[node]

    def relate(self, edge: Edge, level: float) -> Edge:
        a, b = edge.pair
        ra, rb = self.rep(a), self.rep(b)
        own = tuple(r for r in edge.direction.reasons if r != "no direction evidence")
        if ra == rb:
            reason = f"family tree: {a} and {b} are copies of one function ({ra}'s): no direction claimed"
            return replace(edge, kinship="copy", direction=Direction(None, None, 0.5, (*own, reason), decided=False))
        for older, younger, r_old, r_young in ((a, b, ra, rb), (b, a, rb, ra)):
            if r_old in self.ancestors(r_young):
                conf, claimed, via = self.ancestors(r_young)[r_old]
                decided = claimed and conf >= level
                path = " -> ".join((r_old, *reversed(via), r_young))
                reason = (f"family tree: {older} is an ancestor of {younger} ({path}; confidence {conf:.2f}, the "
                          "product of its links')")
                if not decided:
                    reason += ("; direction undecided: " + ("a link between them is undecided" if not claimed else
                               f"{conf:.2f} is below the level set ({level:g})"))
                return replace(edge, kinship="ancestor" if decided else "relative",
                               direction=Direction(older, younger, conf, (*own, reason), decided=decided))
        up_a, up_b = self.ancestors(ra), self.ancestors(rb)
        common = sorted(set(up_a) & set(up_b), key=lambda c: (-up_a[c][0] * up_b[c][0], c))
        parents_a = {u.parent for u in self.up.get(ra, ())}
        shared = sorted(parents_a & {u.parent for u in self.up.get(rb, ())})
        nearest = shared[0] if shared else common[0] if common else None
        claimed = nearest is not None and up_a[nearest][1] and up_b[nearest][1]
        kind = ("sibling" if shared else "cousin") if claimed else "relative"
        words = {"sibling": f"siblings: both derive from {nearest}, neither from the other",
                 "cousin": f"cousins: related through {nearest}, neither derives from the other",
                 "relative": (f"related through {nearest}, but a link between them is undecided, so whether one "
                              "derives from the other is not known" if nearest else "related")}[kind]
        return replace(edge, kinship=kind,
                       direction=Direction(None, None, 0.5, (*own, f"family tree: {words}"), decided=False))
