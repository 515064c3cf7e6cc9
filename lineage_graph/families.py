"""Families (connected components of dependence), their stable ids, and their trees (Edmonds arborescences).

Family ids must survive nightly rebuilds so investigators can cite them: a component keeps the id of
the previous family it overlaps most (one-to-one, largest overlaps first); a new component is named
after its earliest member. Trees are maximum spanning arborescences over the directed evidence, with
confirmed declarations preferred; merges get a second parent.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field

import networkx as nx

from lineage_graph.evidence import Edge

DECLARED_BOOST = 10.0
"""A confirmed declared base (declared and dependent) outweighs any undeclared candidate parent."""
MERGE_MIN_CONFIDENCE = 0.6
"""An undeclared second parent needs its own direction at least this sure."""
TIE_TOLERANCE = 0.02
"""Candidate parents whose -log10 p are within 2% of each other are tied: pairs that share every copied block sit
near the permutation floor (log10 1/h! per block), where a few percent says nothing about who came first."""
MERGE_MARGIN = 1.0
"""log10 units by which a merge child must be closer to its second parent than its first parent is."""


@dataclass(frozen=True)
class Family:
    """A family: its members, the root of its tree, and each member's parents with the kind of link."""

    family_id: str
    members: tuple[str, ...]
    root: str
    parents: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    """child -> ((parent, "tree" | "merge" | "copy" | "alternative"), ...); the root has none."""
    root_decided: bool = True
    """Whether the root is claimed: every link out of it is decided. When not, ``root`` is only where the drawing
    starts (the evidence leans that way), not "the original"."""

    def tree_edges(self) -> list[tuple[str, str, str]]:
        return [(p, c, kind) for c, links in sorted(self.parents.items()) for p, kind in links]


def components(model_ids: Iterable[str], edges: Iterable[Edge]) -> list[frozenset[str]]:
    """Connected components of the edges that join families; a model with none is a family of one."""
    graph = nx.Graph()
    graph.add_nodes_from(model_ids)
    graph.add_edges_from(e.pair for e in edges if e.joins_family)
    return [frozenset(c) for c in nx.connected_components(graph)]


def assign_ids(
    comps: Iterable[frozenset[str]],
    previous: Mapping[str, Collection[str]],
    earliest: Callable[[Collection[str]], str],
) -> dict[str, frozenset[str]]:
    """Family id -> members. Largest overlaps with previous families keep their ids (each id once);
    the rest are named after their earliest member, suffixed '#2', '#3'... if that name is taken."""
    comps = list(comps)
    candidates = sorted(
        ((len(c & set(members)), fid, i) for i, c in enumerate(comps) for fid, members in previous.items()
         if c & set(members)),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    named: dict[int, str] = {}
    for _, fid, i in candidates:
        if i not in named and fid not in named.values():
            named[i] = fid
    taken = set(named.values()) | set(previous)
    for i, comp in sorted(enumerate(comps), key=lambda t: earliest(t[1])):
        if i in named:
            continue
        base = earliest(comp)
        fid, n = base, 2
        while fid in taken:
            fid, n = f"{base}#{n}", n + 1
        named[i] = fid
        taken.add(fid)
    return {fid: comps[i] for i, fid in named.items()}


def _tree_graph(members: frozenset[str], evidence: nx.DiGraph, confirmed: Mapping[str, set[str]],
                depth: Mapping[str, int]) -> nx.DiGraph:
    """Candidate parent links of one family, weighted for Edmonds.

    A child's candidate parents (oriented towards it) whose dependence is within TIE_TOLERANCE of the strongest
    are tied, unless the child declares a base the weights confirm: among them the one the direction evidence
    puts above most of the others (the most basal) gets the best weight, then the one with fewer declared
    ancestors. A model as strongly related to a base as to the base's fine-tunes most plausibly derives from
    the base.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(members)
    sub = evidence.subgraph(members)
    for v in members:
        weights = {u: data["weight"] * (DECLARED_BOOST if u in confirmed.get(v, ()) else 1.0)
                   for u, _, data in sub.in_edges(v, data=True)}
        declared = confirmed.get(v, set()) & set(weights)  # a confirmed declaration decides, ties or not
        oriented = {u: sub[u][v]["strength"] for u in weights if sub[u][v]["p"] > 0.5 and not declared}
        strongest = max(oriented.values(), default=0.0)
        tied = {u for u, strength in oriented.items() if strength >= (1.0 - TIE_TOLERANCE) * strongest}
        best = max(weights.values(), default=0.0)
        for u, weight in weights.items():
            if u in tied and len(tied) > 1:
                above = sum(sub.has_edge(u, t) and sub[u][t]["p"] > 0.5 for t in tied - {u})
                weight = best * (1.0 + 1e-6 * above - 1e-9 * depth.get(u, 0))
            graph.add_edge(u, v, tree_weight=weight)
    return graph


def _second_parent(child: str, parent: str, tree: nx.DiGraph, evidence: nx.DiGraph) -> str | None:
    related = {parent} | nx.ancestors(tree, parent) | nx.descendants(tree, parent) | nx.descendants(tree, child)
    first = evidence[parent][child]["strength"]
    best, best_strength = None, -1.0
    for w in evidence.predecessors(child):
        if w in related or w == child or evidence[w][child]["p"] < MERGE_MIN_CONFIDENCE:
            continue
        s = evidence[w][child]["strength"]
        s_wp = evidence[w][parent]["strength"] if evidence.has_edge(w, parent) else 0.0
        if s >= first and s > s_wp + MERGE_MARGIN and s > best_strength:
            best, best_strength = w, s
    return best


def family_tree(members: frozenset[str], evidence: nx.DiGraph, confirmed: Mapping[str, set[str]],
                depth: Mapping[str, int]) -> tuple[str, dict[str, tuple[tuple[str, str], ...]]]:
    """Root and parent links of one family.

    confirmed: child -> declared bases that the weights confirm (same family). A child that declares
    several confirmed bases (a merge) gets all of them; an undeclared child gets a second parent when it
    depends at least as strongly on a model outside its parent's line as on its parent, and more strongly
    than its parent does (it carries that model's weights beyond what it inherited).
    """
    if len(members) == 1:
        return next(iter(members)), {}
    tree = nx.maximum_spanning_arborescence(_tree_graph(members, evidence, confirmed, depth), attr="tree_weight")
    root = next(n for n in tree.nodes if tree.in_degree(n) == 0)
    parents: dict[str, list[tuple[str, str]]] = {c: [(p, "tree")] for p, c in tree.edges}
    for child, (parent, _) in [(c, links[0]) for c, links in parents.items()]:
        declared = confirmed.get(child, set())
        extra = sorted(declared - {parent} - nx.descendants(tree, child)) if len(declared) > 1 else []
        if not declared:
            second = _second_parent(child, parent, tree, evidence)
            extra = [second] if second else []
        parents[child] += [(p, "merge") for p in extra]
    return root, {c: tuple(links) for c, links in parents.items()}
