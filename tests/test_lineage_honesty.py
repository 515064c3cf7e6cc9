"""What a family tree claims and what it leaves open (lineage_graph, pure, synthetic closeness): merges of every
shape the weights allow (three parents, a merge's child, a parent with its own child), depth up-scaling told from
pruning by the block map, near copies, weak signals that never decide alone, kinship (siblings and cousins are no
ancestors), undecided roots, "cannot tell" instead of an accusation, declared relations the weights contradict, and
the invariant every link keeps: a parent, a child and a confidence of at least 0.5, the way it leans.

Distances are made additive in -log(closeness) (the geometry the merge test reads; for short paths 1 - closeness),
with an average sitting at the small-drift point of its parents; every decision checked here sits far from its
threshold (the margins are asserted)."""

from __future__ import annotations

import itertools
import math
import random

import networkx as nx
import pytest

from lineage_graph import phylogeny
from lineage_graph.block_maps import copied_sources, map_closeness, reading
from lineage_graph.direction import SIGNALS, combine, orient
from lineage_graph.discrepancies import ACCUSATIONS, CANNOT_TELL
from lineage_graph.evidence import ModelInfo, PairTest
from lineage_graph.kinship import describe
from lineage_graph.lineage import compute_lineage
from scanner.pairs.block_map import BlockLink

SHAPE = dict(n_layers=4, hidden_size=64, intermediate_size=128)


def _tree_closeness(links: dict[str, tuple[str, float]], shared: float = 0.0) -> dict[tuple[str, str], float]:
    """exp(-path length) for every pair of a tree given as child -> (parent, branch length); ``shared``: the share
    by which the path between two models on different branches of an ancestor is shorter than the sum of its
    branches (fine-tunes of one base drift partly alike: measured on the zoos, siblings sit at merge ratio ~1.2)."""
    tree = nx.Graph()
    for child, (parent, length) in links.items():
        tree.add_edge(parent, child, weight=length)
    lengths = dict(nx.all_pairs_dijkstra_path_length(tree))
    parent_of = {child: parent for child, (parent, _) in links.items()}

    def ancestors(m: str) -> set[str]:
        return {m} | (ancestors(parent_of[m]) if m in parent_of else set())

    def length(a: str, b: str) -> float:
        lineal = a in ancestors(b) or b in ancestors(a)
        return lengths[a][b] * (1.0 if lineal else 1.0 - shared)

    return {(a, b): math.exp(-length(a, b)) for a, b in itertools.combinations(sorted(tree.nodes), 2)}


def _with_average(closeness: dict, merge: str, parents: dict[str, float], base: str) -> dict:
    """Add ``merge``, the weighted average of ``parents`` (weights summing to 1) whose drifts from ``base`` are
    orthogonal: its squared distance to any member x is sum_i w_i^2 |d_i|^2 + |d_x|^2 - 2 w_x |d_x|^2 in the
    small-drift picture, read here on -log(closeness) of the parents' branch lengths from base."""
    drift = {p: -math.log(closeness[tuple(sorted((base, p)))]) if p != base else 0.0 for p in parents}
    spread = sum(w * w * drift[p] for p, w in parents.items())
    out = dict(closeness)
    members = {m for pair in closeness for m in pair}
    for x in members:
        own = drift.get(x, -math.log(closeness[tuple(sorted((base, x)))]) if x != base else 0.0)
        d = spread + own - 2 * parents.get(x, 0.0) * drift.get(x, 0.0)
        out[tuple(sorted((merge, x)))] = math.exp(-max(d, 1e-6))
    return out


def _lineage(closeness: dict, models: list[ModelInfo] | None = None, **kwargs):
    members = sorted({m for pair in closeness for m in pair})
    models = models or [ModelInfo(m, **SHAPE) for m in members]
    tests = [PairTest(a, b, "match", -200.0, 4, closeness=c) for (a, b), c in closeness.items()]
    return compute_lineage(models, tests, **kwargs)


def _links(lineage) -> dict[str, tuple[tuple[str, str], ...]]:
    (family,) = [f for f in lineage.families if len(f.members) > 1]
    return dict(family.parents)


def test_a_three_parent_merge_gets_every_parent_and_a_merge_child_hangs_under_the_merge() -> None:
    star = _tree_closeness({"a": ("base", 0.4), "b": ("base", 0.45), "c": ("base", 0.5), "d": ("base", 0.42)})
    closeness = _with_average(star, "m3", {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, "base")
    members = {m for pair in closeness for m in pair}
    # a fine-tune of the merge: its own drift added to every distance from the merge
    closeness |= {tuple(sorted(("m3-ft", x))): (closeness[tuple(sorted(("m3", x)))] if x != "m3" else 1.0)
                  * math.exp(-0.3) for x in members}
    lineage = _lineage(closeness)
    links = _links(lineage)
    assert {p for p, _ in links["m3"]} == {"a", "b", "c"}
    assert sorted(kind for _, kind in links["m3"]) == ["merge", "merge", "tree"]
    assert links["m3-ft"] == (("m3", "tree"),)
    for parent in "abc":
        d = lineage.edge(parent, "m3").direction
        assert (d.parent, d.child) == (parent, "m3") and d.confidence >= SIGNALS["activation_rank"].reliability
    ratio = phylogeny.merge_ratio({k: -math.log(v) for k, v in closeness.items()}, "a", "m3", "b")
    assert ratio < phylogeny.MERGE_RATIO - 0.1  # found far inside the threshold


def test_only_models_of_one_shape_are_tried_as_a_merge_and_its_parents() -> None:
    star = _tree_closeness({"a": ("base", 0.4), "b": ("base", 0.45)})
    closeness = _with_average(star, "m", {"a": 0.5, "b": 0.5}, "base")
    models = [ModelInfo(m, **SHAPE) for m in ("base", "a", "b")] + [ModelInfo("m", **{**SHAPE, "n_layers": 6})]
    links = _links(_lineage(closeness, models))
    assert "merge" not in [kind for _, kind in links["m"]]  # six blocks cannot be an average of two four-block models


def test_a_merge_the_evidence_puts_above_its_parents_is_none() -> None:
    star = _tree_closeness({"a": ("base", 0.4), "b": ("base", 0.45)})
    closeness = _with_average(star, "m", {"a": 0.5, "b": 0.5}, "base")
    models = [ModelInfo(m, **SHAPE, declared_base_models=("m",) if m in ("a", "b") else ())
              for m in ("base", "a", "b", "m")]
    links = _links(_lineage(closeness, models))
    assert all(kind != "merge" for ls in links.values() for _, kind in ls)


@pytest.mark.parametrize("seed", range(12))
def test_every_link_has_a_parent_a_child_and_leans_its_way_with_at_least_half(seed: int) -> None:
    """The invariant docs/lineage.md states, on random families with merges, copies, near copies and random
    weak votes: every tree, merge, copy and alternative link is stored with its parent and child, and its confidence
    is at least 0.5 the way it is drawn (a merge the votes put above its parents is no merge, never a link at 0.36)."""
    draw = random.Random(seed)
    links = {f"m{k}": (f"m{draw.randrange(k)}", draw.uniform(0.05, 0.6)) for k in range(1, 9)}
    closeness = _tree_closeness(links)
    closeness = _with_average(closeness, "avg", {"m1": 0.5, "m2": 0.5}, "m0")
    closeness |= {tuple(sorted(("copy", x))): closeness.get(tuple(sorted(("m3", x))), 1.0)
                  for x in {m for pair in closeness for m in pair} if x != "copy"}
    members = sorted({m for pair in closeness for m in pair})
    models = [ModelInfo(m, **SHAPE, activation_rank=(draw.uniform(20, 30),) * 4,
                        activation_scale=(draw.uniform(0.5, 1.5),) * 4) for m in members]
    lineage = _lineage(closeness, models)
    for family in lineage.families:
        for parent, child, kind in family.tree_edges():
            d = lineage.edge(parent, child).direction
            assert (d.parent, d.child) == (parent, child), (kind, d)
            assert 0.5 <= d.confidence <= 1.0
            assert not d.claimed or d.corroborated


def test_a_weak_signal_never_decides_alone_and_two_agreeing_ones_do() -> None:
    rank = combine("a", "b", [orient_vote("a", "activation_rank")])
    assert rank.parent == "a" and rank.confidence == pytest.approx(0.8) and not rank.corroborated
    both = combine("a", "b", [orient_vote("a", "activation_rank"), orient_vote("a", "activation_scale")])
    assert both.corroborated and both.confidence > 0.9
    strong = combine("a", "b", [orient_vote("a", "structure")])
    assert strong.corroborated
    # a lone pair outside any tree, leaning on its rank alone at 0.8: kept, not claimed
    lone = _lineage({("o/a", "o/b"): 0.6}, [ModelInfo("o/a", **SHAPE, activation_rank=(30.0,) * 4),
                                           ModelInfo("o/b", **SHAPE, activation_rank=(25.0,) * 4)])
    d = lone.edge("o/a", "o/b").direction
    assert d.parent == "o/a" and not d.claimed and "alone" in d.reasons[-1]


def orient_vote(parent: str, signal: str):
    from lineage_graph.direction import Vote

    return Vote(parent, signal, signal)


def test_activation_scale_votes_for_the_smaller_scale_beyond_its_margin() -> None:
    base = ModelInfo("o/base", **SHAPE, activation_scale=(1.0,) * 4)
    grown = ModelInfo("o/ft", **SHAPE, activation_scale=(1.1,) * 4)
    barely = ModelInfo("o/near", **SHAPE, activation_scale=(1.02,) * 4)
    d = orient(base, grown, {})
    assert d.parent == "o/base" and d.reasons[0].startswith("activation_scale:")
    assert orient(base, barely, {}).parent is None  # 2% is below the 3% margin
    assert orient(base, grown, {}, closeness=0.99).parent is None  # near copies: no weak votes


def _map(pairs: list[tuple[int, int]], closeness: float = 0.95) -> tuple[BlockLink, ...]:
    return tuple(BlockLink(s, d, -200.0, closeness) for s, d in pairs)


def test_the_block_map_tells_a_depth_up_scaling_from_a_prune() -> None:
    upscale = _map([(0, 0), (1, 1), (2, 2), (1, 3), (2, 4), (3, 5)])
    prune = _map([(0, 0), (1, 1), (2, 3)])
    assert reading(upscale, 4, 6) == "upscale" and reading(prune, 3, 4) == "prune"
    assert reading(_map([(0, 0), (1, 1)]), 4, 6) is None
    assert map_closeness(upscale, 6) == pytest.approx(0.95) and map_closeness(prune, 4) == pytest.approx(0.95 * 3 / 4)
    base, deep = ModelInfo("o/base", **SHAPE), ModelInfo("o/up", **{**SHAPE, "n_layers": 6})
    up = orient(base, deep, {}, upscale)
    assert (up.parent, up.child) == ("o/base", "o/up") and up.reasons[0].startswith("block_map:")
    assert up.confidence == pytest.approx(SIGNALS["block_map"].reliability) and up.corroborated
    shallow = ModelInfo("o/lite", **{**SHAPE, "n_layers": 3})
    assert orient(base, shallow, {}, prune).parent == "o/base"
    assert orient(base, deep, {}).reasons[0].startswith("depth:")  # no map: the depth vote, below the level


def test_a_stack_of_copied_blocks_names_its_source_as_the_parent() -> None:
    models = {m: ModelInfo(m, **SHAPE) for m in ("o/a", "o/b")} | {"o/franken": ModelInfo("o/franken", **{
        **SHAPE, "n_layers": 6})}
    maps = {("o/a", "o/franken"): _map([(0, 0), (1, 1), (2, 2)], 1.0) + _map([(1, 3), (2, 4), (3, 5)], 0.7),
            ("o/b", "o/franken"): _map([(0, 0), (1, 1), (2, 2), (1, 3), (2, 4), (3, 5)], 0.8)}
    assert copied_sources(maps, models, phylogeny.CLONE_CLOSENESS) == {"o/franken": {"o/a"}}


def test_siblings_and_cousins_are_named_as_such_and_ancestors_carry_their_path() -> None:
    closeness = _tree_closeness({"ft1": ("base", 0.3), "ft2": ("base", 0.35), "ft1-1": ("ft1", 0.3),
                                 "ft2-1": ("ft2", 0.3)}, shared=0.3)
    members = sorted({m for pair in closeness for m in pair})
    ranks = {"base": 40.0, "ft1": 36.0, "ft2": 35.0, "ft1-1": 32.0, "ft2-1": 31.0}
    models = [ModelInfo(m, **SHAPE, activation_rank=(ranks[m],) * 4, activation_scale=(50.0 / ranks[m],) * 4)
              for m in members]
    lineage = _lineage(closeness, models)
    assert lineage.edge("base", "ft1").kinship == "parent"
    sib, cousin, anc = lineage.edge("ft1", "ft2"), lineage.edge("ft1-1", "ft2-1"), lineage.edge("base", "ft1-1")
    assert sib.kinship == "sibling" and sib.direction.parent is None and not sib.direction.claimed
    assert cousin.kinship == "cousin" and cousin.direction.parent is None
    assert anc.kinship == "ancestor" and (anc.direction.parent, anc.direction.child) == ("base", "ft1-1")
    path = lineage.edge("base", "ft1").direction.confidence * lineage.edge("ft1", "ft1-1").direction.confidence
    assert anc.direction.confidence == pytest.approx(path)
    (family,) = [f for f in lineage.families if len(f.members) > 1]
    assert family.root == "base" and family.root_decided
    assert "neither derives from the other" in describe("sibling", "ft2", None, None, False)
    assert describe("ancestor", "base", "base", "ft1-1", True).startswith("an ancestor")


def test_an_undecided_link_leaves_the_root_and_the_relatives_order_open() -> None:
    """Two models and nothing but the shape between them: no direction, no root claimed, no accusation, a
    "cannot tell" entry instead."""
    lineage = _lineage({("o/a", "o/b"): 0.7})
    (family,) = [f for f in lineage.families if len(f.members) > 1]
    assert not family.root_decided and not lineage.edge("o/a", "o/b").direction.claimed
    kinds = {d.kind for d in lineage.discrepancies}
    assert kinds == {CANNOT_TELL} and not kinds & set(ACCUSATIONS)
    (entry,) = lineage.discrepancies
    assert "undecided" in entry.detail and "neither card is accused" in entry.detail


def test_a_copy_answers_for_what_its_group_derives_from() -> None:
    """A camouflaged copy of a fine-tune that claims to be trained from scratch: which of the two copies is the
    original cannot be told, but the group derives from the base by a decided link, so the claim is contradicted."""
    closeness = _tree_closeness({"o/ft": ("o/base", 0.4), "o/other": ("o/base", 0.45)})
    closeness |= {tuple(sorted(("x/copy", m))): closeness[tuple(sorted(("o/ft", m)))] for m in ("o/base", "o/other")}
    closeness[("o/ft", "x/copy")] = 1.0
    ranks = {"o/base": 40.0, "o/ft": 35.0, "x/copy": 35.0, "o/other": 34.0}
    models = [ModelInfo(m, **SHAPE, activation_rank=(ranks[m],) * 4, activation_scale=(50.0 / ranks[m],) * 4,
                        declared_base_models=("o/base",) if m == "o/ft" else (),
                        claims_from_scratch=m == "x/copy") for m in sorted(ranks)]
    found = {(d.model_id, d.kind, d.related_model) for d in _lineage(closeness, models).discrepancies}
    assert ("x/copy", "false_from_scratch", "o/base") in found


def test_a_declared_relation_the_weights_contradict_is_a_discrepancy() -> None:
    from scanner.declared.merge_config import MergeDeclaration, MergeSource

    base = ModelInfo("o/base", **SHAPE)
    upscaled = ModelInfo("o/up", **{**SHAPE, "n_layers": 6})
    # the small model declares the deeper one as its base, but the block map reads an up-scaling of the small one
    liar = ModelInfo("o/base", **SHAPE, declared_base_models=("o/up",), declared_relation="finetune")
    upscale = _map([(0, 0), (1, 1), (2, 2), (1, 3), (2, 4), (3, 5)])
    lineage = compute_lineage([liar, upscaled], [PairTest("o/base", "o/up", "match", -300.0, 4, closeness=0.9)],
                              block_maps={("o/base", "o/up"): upscale})
    kinds = {(d.model_id, d.kind) for d in lineage.discrepancies}
    assert ("o/base", "declared_direction_contradicted") in kinds
    # a passthrough config that stacks 7 blocks for a 6-block model
    declared = MergeDeclaration("passthrough", None, (MergeSource("o/base", (0, 4)), MergeSource("o/base", (1, 4))))
    stacked = ModelInfo("o/up", **{**SHAPE, "n_layers": 6}, declared_base_models=("o/base",),
                        declared_relation="merge", declared_merge=declared)
    lineage = compute_lineage([base, stacked], [PairTest("o/base", "o/up", "match", -300.0, 4, closeness=0.9)],
                              block_maps={("o/base", "o/up"): upscale})
    (found,) = [d for d in lineage.discrepancies if d.kind == "relation_contradicted"]
    assert "stacks 7 blocks" in found.detail and "has 6" in found.detail.replace("have", "has")


def test_a_child_of_near_copies_hangs_under_the_one_that_is_no_merge() -> None:
    """A base, three fine-tunes and a model-stock merge of them that stayed by the base (closeness 0.99): the
    fine-tunes hang under the base, not under the merge that sits between the base and each of them."""
    star = _tree_closeness({"a": ("base", 0.5), "b": ("base", 0.55), "c": ("base", 0.6)})
    closeness = _with_average(star, "stock", {"a": 0.05, "b": 0.05, "c": 0.05, "base": 0.85}, "base")
    assert closeness[("base", "stock")] >= 0.98
    ranks = {"base": 40.0, "a": 35.0, "b": 35.5, "c": 34.0, "stock": 41.0}
    models = [ModelInfo(m, **SHAPE, activation_rank=(ranks[m],) * 4) for m in sorted(ranks)]
    links = _links(_lineage(closeness, models))
    assert all(links[m][0] == ("base", "tree") for m in "abc")


def test_a_declared_merge_parent_without_a_distance_is_linked_all_the_same() -> None:
    """A frankenmerge whose config names a fine-tune and the base, its pair with the base left without a closeness
    (a depth-changed pair with no block map: lineage.whole_model_closeness mixes no by-index estimate with the
    mapped ones): it hangs under the fine-tune and is linked to the base as its merge parent, no KeyError."""
    closeness = _tree_closeness({"o/ft": ("o/base", 0.4), "o/ft-2": ("o/base", 0.45)})
    deep = {**SHAPE, "n_layers": 6}
    models = [ModelInfo(m, **SHAPE) for m in ("o/base", "o/ft", "o/ft-2")] + [
        ModelInfo("o/franken", **deep, declared_base_models=("o/base", "o/ft"), declared_relation="merge")]
    mapped = {("o/franken", "o/ft"): _map([(0, 0), (1, 1)], 1.0) + _map([(1, 2), (1, 3), (2, 4), (3, 5)], 0.55),
              ("o/franken", "o/ft-2"): _map([(0, 0), (1, 1), (2, 2), (1, 3), (2, 4), (3, 5)], 0.6)}
    tests = [PairTest(a, b, "match", -200.0, 4, closeness=c) for (a, b), c in closeness.items()]
    tests += [PairTest("o/base", "o/franken", "match", -200.0, 4, closeness=0.3),  # by index: misaligned blocks
              PairTest("o/franken", "o/ft", "match", -200.0, 4, closeness=0.9),
              PairTest("o/franken", "o/ft-2", "match", -200.0, 4, closeness=0.5)]
    lineage = compute_lineage(models, tests, block_maps=mapped)
    links = dict(_links(lineage)["o/franken"])
    assert links == {"o/ft": "tree", "o/base": "merge"}
    d = lineage.edge("o/base", "o/franken").direction
    assert (d.parent, d.child) == ("o/base", "o/franken") and d.confidence >= 0.5


@pytest.mark.parametrize("seed", range(200))
def test_no_family_shape_ends_the_lineage_in_a_traceback(seed: int) -> None:
    """Random families of every shape a hub holds: depth-changed members with and without block maps, pairs that
    test independent (no distance), declared bases and declared merges (of merges too, in circles too) naming members
    at random, an adapter declaring its base, copies and near copies, random weak votes. The lineage is built (a
    tree, or a link left undecided) and every link keeps the invariant: a parent, a child, a confidence of at least
    0.5 the way it is drawn. (Run over 5,000 seeds once; the 200 kept run in a second and a half.)"""
    draw = random.Random(1000 + seed)
    n = draw.randrange(3, 11)
    links = {f"m{k}": (f"m{draw.randrange(k)}", draw.uniform(0.0, 0.6)) for k in range(1, n)}
    closeness = _tree_closeness(links, shared=draw.choice((0.0, 0.3)))
    members = sorted({m for pair in closeness for m in pair})
    if draw.random() < 0.5:
        closeness = _with_average(closeness, "avg", {"m1": 0.5, "m0": 0.5}, "m0")
        members.append("avg")
    depth = {m: draw.choice((4, 4, 4, 5, 6)) for m in members}
    maps = {pair: _map([(i % 4, i) for i in range(max(depth[m] for m in pair))], draw.choice((0.7, 1.0)))
            for pair in closeness if depth[pair[0]] != depth[pair[1]] and draw.random() < 0.5}
    dropped = {pair for pair in closeness if draw.random() < 0.15}
    declared = {m: tuple(draw.sample([o for o in members if o != m], k=min(draw.choice((0, 0, 1, 2, 3)),
                                                                             len(members) - 1))) for m in members}
    models = [ModelInfo(m, n_layers=depth[m], hidden_size=64, intermediate_size=128,
                        declared_base_models=declared[m],
                        declared_relation=draw.choice((None, "merge", "adapter", "finetune")) if declared[m] else None,
                        activation_rank=(draw.uniform(20, 30),) * depth[m] if draw.random() < 0.8 else None,
                        activation_scale=(draw.uniform(0.5, 1.5),) * depth[m] if draw.random() < 0.8 else None)
              for m in members]
    tests = [PairTest(a, b, "match", -0.5 if (a, b) in dropped else -draw.uniform(5, 300), 4, closeness=c)
             for (a, b), c in closeness.items()]
    lineage = compute_lineage(models, tests, block_maps=maps)
    assert sorted(m for f in lineage.families for m in f.members) == sorted(members)
    for family in lineage.families:
        for parent, child, kind in family.tree_edges():
            d = lineage.edge(parent, child).direction
            assert (d.parent, d.child) == (parent, child), (kind, d)
            assert 0.5 <= d.confidence <= 1.0
