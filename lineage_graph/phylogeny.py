"""Family trees from closeness: nearest relatives as parents, rooted by the family's shape and the direction evidence.

A p-value says whether two models are related; at the permutation floor it says nothing about which of two
relatives is nearer. Closeness (mean cosine of matched activations, scanner.stats.independence) does. Its
distance 1 - closeness is close to additive along lineages: for small drifts 1 - cos(theta) ~ theta^2 / 2, and
the drifts of two fine-tunes of one base are nearly orthogonal, so d(ft1, ft2) ~ d(base, ft1) + d(base, ft2): a
base sits between its fine-tunes and a chain base -> ft1 -> ft2 is a path. With every ancestor observed (a hub
keeps its bases), the tree that links each model to its nearest relatives is then the minimum spanning tree of
the distances (the minimum-evolution tree when the internal nodes are the members themselves, as in MoTHer's
model trees); networkx computes it. Exact copies (closeness above CLONE_CLOSENESS, e.g. a camouflaged copy) are
indistinguishable by weights: they form one node, whose first member (by the direction evidence) carries the
links and the others hang under it by "copy" links.

Distances make a tree without a root. Each member is weighed as the root by two things: the shape of the tree
and the direction evidence of its links. Shape: if a hub grows by each new model deriving from one already there
(uniform attachment, a random recursive tree), the probability that member v is the root is proportional to the
number of orders in which the tree could have grown from v, n! / prod_u |subtree of u when rooted at v| (the rumour
centrality of Shah and Zaman; it is largest at the tree's centroid): a base with several fine-tunes is far more
likely the root than one of its leaves, while a chain gives each of its members similar weight. Evidence: a vote of
reliability r weighs log r when the placement orients the link as it says and log(1 - r) when not. A placement's
log-likelihood is the sum of both; the best wins (ties: the member nearest to all others, then the larger id). A
tree link's confidence compares the best placement that keeps it as drawn with the best that reverses it (a
likelihood ratio: one vote alone on a tree whose shape says nothing gives confidence r; 0.5 when nothing tells
them apart). Copies get no direction from shape (they are one node); only votes can order them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import networkx as nx

CLONE_CLOSENESS = 0.999
"""Pairs at least this close are copies: their activations agree to the noise of floating point."""
MERGE_RATIO = 0.87
"""A member m is a merge of x and y when d(x, m) + d(m, y) <= MERGE_RATIO * d(x, y). Along a lineage distances
add (a base between two fine-tunes: ratio ~1); an average of x and y sits much closer to both than they are to
each other (ratio (1 - a)^2 + a^2 for weights a, 1 - a in the small-drift limit). Set at the middle of the gap the
fitted zoos leave (bench/bench_family_trees.py): their merges measure 0.67-0.71, every triple centred on a member
that is no merge 1.04 or more."""
PLACEMENT_MARGIN = 0.3
"""A child c drawn under p, itself under g, is placed only when c is nearer p than g by at least this share of the
p-g distance: r = (d(c, g) - d(c, p)) / d(p, g) >= PLACEMENT_MARGIN. With additive distances r = 1 when c derives
from p and -1 when it derives from g (then a sibling of p); between, the data cannot tell p from g and c is linked to
both ("alternative"). The fitted zoos' true links measure r >= 0.59; the margin is half of that."""
SHAPE_PRIOR = True
"""Weigh placements of the root by the tree's shape (rumour centrality); False leaves the votes alone (ablation)."""
MERGE_BONUS = 0.9
"""Assumed probability that a member found between two others (MERGE_RATIO) is their merge, not their ancestor."""


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


@dataclass(frozen=True)
class Phylogeny:
    """One family's tree: root, links child -> ((parent, kind), ...), and each link's confidence.

    kind: "tree" (nearest relative), "merge" (a merge's second parent), "copy" (the child is a copy of the parent:
    the same function, so which of the two came first is the direction votes' call alone, 0.5 without any) or
    "alternative" (a parent as likely as the tree's: the data cannot tell which of the two the child derives from;
    see PLACEMENT_MARGIN). ``notes`` says why, per (parent, child) link, where a link needs more than its kind."""

    root: str
    parents: dict[str, tuple[tuple[str, str], ...]]
    confidence: dict[tuple[str, str], float]
    """(parent, child) -> probability-like confidence that the link points the right way."""
    ancestors: dict[str, frozenset[str]]
    """model -> its ancestors along tree links (merge and alternative links not followed)."""
    notes: dict[tuple[str, str], str] = field(default_factory=dict)
    corroborated: dict[tuple[str, str], bool] = field(default_factory=dict)
    """(parent, child) -> whether the link leans this way without the signals that may not decide alone (the
    shape, the merge geometry or another vote agrees); a link that is not corroborated is never claimed."""


def clone_groups(members: frozenset[str], closeness: Mapping[tuple[str, str], float]) -> list[frozenset[str]]:
    graph = nx.Graph()
    graph.add_nodes_from(members)
    graph.add_edges_from(pair for pair, c in closeness.items() if c >= CLONE_CLOSENESS and set(pair) <= members)
    return [frozenset(g) for g in nx.connected_components(graph)]


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _lo(log_odds: Mapping[tuple[str, str], float], parent: str, child: str) -> float:
    """Log-odds that parent -> child (log_odds holds one sign per unordered pair, keyed (a, b) with a < b)."""
    value = log_odds.get(_key(parent, child), 0.0)
    return value if parent < child else -value


def _set(log_odds: dict[tuple[str, str], float], parent: str, child: str, value: float) -> None:
    """Make ``value`` the log-odds that parent -> child."""
    log_odds[_key(parent, child)] = value if parent < child else -value


def _first(group: frozenset[str], log_odds: Mapping[tuple[str, str], float], confirmed: Mapping[str, set[str]]) -> str:
    """The member of a group of copies that the direction evidence puts above the others; on a tie the one whose
    card names a confirmed base outside the group (it states where the weights came from), then the smallest id
    (arbitrary: the link then has confidence 0.5)."""
    def key(m: str) -> tuple[float, bool, str]:
        votes = sum(_lo(log_odds, m, o) for o in group if o != m)
        return (-round(votes, 9), not (confirmed.get(m, set()) - group), m)

    return min(group, key=key)


def _orient(tree: nx.Graph, root: str) -> dict[str, str]:
    return {child: parent for parent, child in nx.bfs_edges(tree, root)}


def _ancestors(parent_of: Mapping[str, str]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}

    def walk(node: str) -> set[str]:
        if node not in out:
            parent = parent_of.get(node)
            out[node] = set() if parent is None else {parent} | walk(parent)
        return out[node]

    for node in parent_of:
        walk(node)
    return out


def _score(tree: nx.Graph, root: str, log_odds: Mapping[tuple[str, str], float]) -> float:
    """Sum of the log-odds of the tree's links as this root orients them. Only links count: a pair that the root
    leaves as cousins has no direction to agree with, and counting every ancestor pair would favour roots at
    leaves, which put the most pairs in ancestor order. (Merge links orient the same way under every root.)"""
    return sum(_lo(log_odds, parent, child) for child, parent in _orient(tree, root).items())


def log_rumour_centrality(tree: nx.Graph, root: str) -> float:
    """log of n! / prod over nodes u of |subtree of u| with the tree rooted at root: the number of orders in which
    a tree grown by uniform attachment from root reaches this shape (Shah and Zaman's rumour centrality)."""
    size: dict[str, int] = {}
    for node in reversed(list(nx.dfs_preorder_nodes(tree, root))):
        size[node] = 1 + sum(size[c] for c in tree.neighbors(node) if c in size)
    return math.lgamma(tree.number_of_nodes() + 1) - sum(math.log(s) for s in size.values())


def placement_log_likelihood(tree: nx.Graph, log_odds: Mapping[tuple[str, str], float]) -> dict[str, float]:
    """Each member as root: log prior from the tree's shape plus the log-likelihood of the votes on its links (a
    vote's log r or log(1 - r) is +-lo/2 around a constant)."""
    return {r: (log_rumour_centrality(tree, r) if SHAPE_PRIOR else 0.0) + _score(tree, r, log_odds) / 2
            for r in tree.nodes}


def merges(heads: list[str], distance: Mapping[tuple[str, str], float],
           declared: Mapping[str, tuple[str, str]],
           plausible: Callable[[str, str, str], bool] = lambda m, x, y: True) -> dict[str, tuple[str, str]]:
    """Merge members -> their two parents: the declared ones, then, greedily by the smallest ratio, members that lie
    between two others (MERGE_RATIO) and that ``plausible(m, x, y)`` allows (the direction evidence does not put m
    above them); each found merge leaves the candidates before the next search."""
    found = dict(declared)
    while True:
        rest = [h for h in heads if h not in found]
        best: tuple[float, str, str, str] | None = None
        for m in rest:
            for i, x in enumerate(rest):
                for y in rest[i + 1:]:
                    if m in (x, y):
                        continue
                    d_xm, d_my, d_xy = (distance.get(_key(*p)) for p in ((x, m), (m, y), (x, y)))
                    if d_xm is None or d_my is None or d_xy is None or d_xy <= 0:
                        continue
                    ratio = (d_xm + d_my) / d_xy
                    if ratio <= MERGE_RATIO and (best is None or ratio < best[0]) and plausible(m, x, y):
                        best = (ratio, m, x, y)
        if best is None:
            return found
        _, m, x, y = best
        found[m] = (x, y) if distance[_key(x, m)] <= distance[_key(y, m)] else (y, x)


def _group_odds(log_odds: Mapping[tuple[str, str], float], head: Mapping[str, str]) -> dict[tuple[str, str], float]:
    """The evidence between groups of copies, keyed by their heads. Copies are one function: their pairs with another
    group repeat the same weight evidence, so it is counted once, from the member pair whose votes are the most
    decisive (a declaration made by one copy's card is not diluted by the others' silence)."""
    out: dict[tuple[str, str], float] = {}
    for (a, b), value in log_odds.items():
        ha, hb = head[a], head[b]
        if ha != hb:
            oriented = value if (a < b) == (ha < hb) else -value
            if abs(oriented) > abs(out.get(_key(ha, hb), 0.0)):
                out[_key(ha, hb)] = oriented
    return out


def family_phylogeny(
    members: frozenset[str],
    closeness: Mapping[tuple[str, str], float],
    log_odds: Mapping[tuple[str, str], float],
    confirmed: Mapping[str, set[str]],
    merge_log_odds: Mapping[tuple[str, str], float] | None = None,
    corroborating_log_odds: Mapping[tuple[str, str], float] | None = None,
) -> Phylogeny | None:
    """The family's tree from closeness, or None when the dependent pairs with a closeness do not connect it.

    closeness: (a, b) with a < b -> closeness, for the dependent pairs of the family; log_odds: (a, b) with a < b
    -> log-odds that a is b's ancestor (from each pair's direction votes; absent = no evidence); confirmed:
    child -> declared bases that the weights confirm: a single one is linked before any distance, several (a
    declared merge) are all kept; merge_log_odds: the votes that still mean something between a merge and its
    parents (a statistic that averaging reverses, like the activation rank, must be left out; default log_odds);
    corroborating_log_odds: the votes without the signals that may not decide alone (default log_odds): a link
    whose leaning they and the shape do not share is not corroborated.
    """
    if len(members) == 1:
        only = next(iter(members))
        return Phylogeny(only, {}, {}, {only: frozenset()})
    groups = clone_groups(members, closeness)
    head = {m: _first(g, log_odds, confirmed) for g in groups for m in g}
    heads = sorted(set(head.values()))
    # Distances between groups (the nearest pair of members) and the evidence carried over to the group heads.
    distance: dict[tuple[str, str], float] = {}
    for (a, b), c in closeness.items():
        ha, hb = head[a], head[b]
        if ha != hb:
            distance[_key(ha, hb)] = min(distance.get(_key(ha, hb), math.inf), 1.0 - c)
    head_odds = _group_odds(log_odds, head)
    head_merge_odds = _group_odds(log_odds if merge_log_odds is None else merge_log_odds, head)
    head_plain_odds = _group_odds(log_odds if corroborating_log_odds is None else corroborating_log_odds, head)
    bases = {h: sorted({head[b] for m in members if head[m] == h for b in confirmed.get(m, ()) if b in members}
                       - {h}) for h in heads}
    declared_merges = {h: (b[0], b[1]) for h, b in bases.items() if len(b) >= 2}
    geometry = math.log(MERGE_BONUS / (1 - MERGE_BONUS))

    def merge_score(m: str, x: str, y: str) -> float:
        """Log-odds that m is the merge of x and y: the geometry (for an undeclared one) and the votes against both."""
        return (0.0 if m in declared_merges else geometry) + _lo(head_merge_odds, x, m) + _lo(head_merge_odds, y, m)

    merged = merges(heads, distance, declared_merges, lambda m, x, y: merge_score(m, x, y) > 0)
    graph = nx.Graph()
    graph.add_nodes_from(h for h in heads if h not in merged)
    for pair, d in distance.items():
        if not set(pair) & set(merged):
            declared = any(len(bases[c]) == 1 and bases[c][0] == p for c, p in (pair, pair[::-1]))
            # A confirmed declaration is linked before any distance; otherwise Kruskal takes the nearest first.
            graph.add_edge(*pair, weight=-1.0 if declared else d, distance=d)
    if graph.number_of_nodes() == 0 or not nx.is_connected(graph):
        return None
    tree = nx.minimum_spanning_tree(graph, weight="weight", algorithm="kruskal")
    _hang_merges(tree, merged, distance)
    for m, (x, y) in merged.items():
        for odds in (head_odds, head_plain_odds):  # its own votes are in merge_score, the rank left out
            _set(odds, x, m, merge_score(m, x, y))
    scores = placement_log_likelihood(tree, head_odds)
    plain = placement_log_likelihood(tree, head_plain_odds)
    spread = {r: sum(nx.single_source_dijkstra_path_length(tree, r, weight="distance").values()) for r in tree.nodes}
    root = max(tree.nodes, key=lambda r: (round(scores[r], 9), -spread[r], r))
    parents: dict[str, list[tuple[str, str]]] = {c: [(p, "tree")] for c, p in _orient(tree, root).items()}
    confidence: dict[tuple[str, str], float] = {}
    corroborated: dict[tuple[str, str], bool] = {}
    for child, [(parent, _)] in list(parents.items()):
        side = nx.node_connected_component(nx.restricted_view(tree, [], [(parent, child)]), parent)
        keep = max(scores[r] for r in side)
        flip = max(scores[r] for r in tree.nodes if r not in side)
        confidence[(parent, child)] = sigmoid(keep - flip)  # >= 0.5: the root, the best placement, is on this side
        corroborated[(parent, child)] = (max(plain[r] for r in side)
                                         - max(plain[r] for r in tree.nodes if r not in side)) > 1e-9
    for m, (x, y) in merged.items():
        if parents.get(m, [(None, "")])[0][0] != x:
            continue  # the evidence put the merge above its first parent after all: it is no merge of the two
        parents[m].append((y, "merge"))
        confidence[(y, m)] = sigmoid(merge_score(m, x, y))  # > 0.5: merges() took only plausible ones
        corroborated[(y, m)] = True  # the geometry (or the declaration) and the votes
    notes = _alternatives(tree, root, parents, distance, confidence, set(merged))
    for g, c in notes:
        if (g, c) not in corroborated:
            p = next(p for p, kind in parents[c] if kind == "tree")
            corroborated[(g, c)] = corroborated[(p, c)]
    for m in members:
        if head[m] != m:
            parents[m] = [(head[m], "copy")]
            lo, plain_lo = _lo(log_odds, head[m], m), _lo(log_odds if corroborating_log_odds is None
                                                          else corroborating_log_odds, head[m], m)
            confidence[(head[m], m)] = sigmoid(lo) if lo > 0 else 0.5
            corroborated[(head[m], m)] = plain_lo > 0
    ancestors = _ancestors({c: links[0][0] for c, links in parents.items()})
    return Phylogeny(root, {c: tuple(links) for c, links in parents.items()}, confidence,
                     {m: frozenset(ancestors.get(m, ())) for m in members}, notes, corroborated)


def _hang_merges(tree: nx.Graph, merged: Mapping[str, tuple[str, str]], distance: Mapping[tuple[str, str], float]
                 ) -> None:
    """Hang each merge under its nearer parent (its second parent is linked beside the tree), then move under it
    every member whose nearest relative it is and that is not on the path between its parents (an ancestor of its
    parents cannot derive from it): a model derived from a merge hangs under the merge, with what derives from it."""
    for m, (x, _) in merged.items():
        tree.add_edge(x, m, distance=distance[_key(x, m)])
    for m, (x, y) in merged.items():
        between = set(nx.shortest_path(tree, x, y)) if nx.has_path(tree, x, y) else {x, y}
        for c in sorted(tree.nodes):
            if c == m or c in between or c in merged:
                continue
            near = {o: distance[_key(c, o)] for o in tree.nodes if o != c and _key(c, o) in distance}
            if not near or min(near, key=lambda o: (near[o], o)) != m or not nx.has_path(tree, c, x):
                continue
            towards_x = nx.shortest_path(tree, c, x)
            if m in towards_x:
                continue  # already below the merge
            tree.remove_edge(c, towards_x[1])
            tree.add_edge(m, c, distance=near[m])


def _alternatives(tree: nx.Graph, root: str, parents: dict[str, list[tuple[str, str]]],
                  distance: Mapping[tuple[str, str], float], confidence: dict[tuple[str, str], float],
                  merged: set[str]) -> dict[tuple[str, str], str]:
    """Link each child that the distances cannot place between its tree parent p and p's own parent g to g as well
    (PLACEMENT_MARGIN), with the same direction confidence (the child is the later model either way); returns the
    note each such link carries. Merges keep their own geometry and are left alone."""
    parent_of = _orient(tree, root)
    notes = {}
    for child, p in parent_of.items():
        g = parent_of.get(p)
        if g is None or child in merged:
            continue
        d_pg, d_cp, d_cg = (distance.get(_key(*pair)) for pair in ((p, g), (child, p), (child, g)))
        if d_pg is None or d_cp is None or d_cg is None or d_pg <= 0:
            continue
        margin = (d_cg - d_cp) / d_pg
        if margin < PLACEMENT_MARGIN:
            parents[child].append((g, "alternative"))
            confidence[(g, child)] = confidence[(p, child)]
            notes[(g, child)] = notes[(p, child)] = (
                f"cannot tell whether {child} derives from {p} or from {g}: it is {d_cp:.3f} from {p} and {d_cg:.3f} "
                f"from {g}, which are {d_pg:.3f} apart (placed only when it is nearer one of them by "
                f"{PLACEMENT_MARGIN:.0%} of that; here {margin:.0%}), so it is linked to both")
    return notes
