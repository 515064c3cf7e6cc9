"""Any-order block maps of related models whose depths differ, as the lineage reads them: which stored maps a lineage
uses, and what a map says.

A map (scanner.pairs.block_map) gives which block of the shallower model each block of the deeper one comes from,
each deep block mapped to its best shallow block independently. A depth prune and a depth up-scaling differ only in
which model is the parent, and block counts cannot say which: a pruned model's blocks each map to a different block
of its parent, and some of the parent's blocks map to nothing (they were dropped; blocks of one model are
initialised independently, so a dropped block resembles no kept one), while an up-scaled model's blocks all map to
its parent's and some of them map to the same parent block (the run of blocks it repeats). The map also gives a
depth-changed pair a closeness over the deeper model's blocks, each with its own source, where comparing blocks by
index would pair misaligned ones.

Pure selection and reading here: the scan's pair workers make each related depth-changed pair's map with its test
(scanner.pairs.worker) and the store keeps it; `lineage_graph.persist` reads the ones `wanted` picks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from lineage_graph.evidence import ModelInfo, PairTest
from scanner.pairs.block_map import MAP_LOG10_P, BlockMap, one_width

MAPS_PER_MODEL = 4
"""A deeper model is mapped onto at most its this many nearest shallower relatives (by the pair test's closeness)."""


def wanted(models: Mapping[str, ModelInfo], tests: Iterable[PairTest]) -> list[tuple[str, str]]:
    """The (model_a, model_b) pairs whose maps the lineage reads: related (log10 p at most MAP_LOG10_P), of one width
    (hidden size, MLP units, experts) and different depths (the pairs the workers map, scanner.pairs.block_map); each
    deeper model with its MAPS_PER_MODEL nearest shallower relatives."""
    by_deep: dict[str, list[tuple[float, tuple[str, str]]]] = {}
    for t in tests:
        a, b = models.get(t.model_a), models.get(t.model_b)
        if a is None or b is None or t.log10_p > MAP_LOG10_P or not one_width(a, b):
            continue
        if a.n_layers is None or b.n_layers is None or a.n_layers == b.n_layers:
            continue
        deep = a if a.n_layers > b.n_layers else b
        by_deep.setdefault(deep.model_id, []).append((-(t.closeness or 0.0), (t.model_a, t.model_b)))
    return sorted(pair for found in by_deep.values() for _, pair in sorted(found)[:MAPS_PER_MODEL])


def map_closeness(links: BlockMap, deep_blocks: int) -> float:
    """The mean closeness over the deeper model's blocks, each to its mapped block (an unmapped block counts 0): how
    near a depth-changed pair is, block by block with each block's own source."""
    return sum(link.closeness or 0.0 for link in links) / max(deep_blocks, 1)


def copied_sources(block_maps: Mapping[tuple[str, str], BlockMap], models: Mapping[str, ModelInfo],
                   copy_closeness: float) -> dict[str, set[str]]:
    """Deeper model -> the shallower relatives it holds at least one block of verbatim (a mapped block pair at
    ``copy_closeness`` or more): a passthrough merge stacks its sources' blocks unchanged, so a copied block names a
    parent, as a declaration would; two or more name a stack (a frankenmerge) of them."""
    out: dict[str, set[str]] = {}
    for (a, b), links in block_maps.items():
        if any((link.closeness or 0.0) >= copy_closeness for link in links):
            deep, shallow = (a, b) if (models[a].n_layers or 0) > (models[b].n_layers or 0) else (b, a)
            out.setdefault(deep, set()).add(shallow)
    return out


def reading(links: BlockMap, shallow_blocks: int, deep_blocks: int) -> str | None:
    """What the map says about the depth change: "upscale" (every deep block maps, some shallow block twice or more:
    the shallower model is the parent), "prune" (each shallow block maps once, some deep blocks map to nothing: the
    deeper model is the parent), or None (neither pattern)."""
    targets = Counter(link.shallow for link in links)
    mapped = {link.deep for link in links}
    if len(mapped) == deep_blocks and any(n >= 2 for n in targets.values()):
        return "upscale"
    if all(n == 1 for n in targets.values()) and len(targets) == shallow_blocks and len(mapped) < deep_blocks:
        return "prune"
    return None
