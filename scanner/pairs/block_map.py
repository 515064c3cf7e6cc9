"""The any-order block map of a related pair whose depths differ, made by the pair worker as part of the pair's test.

Which block of the shallower model each block of the deeper one comes from: phi_MATCH on every block pair
(scanner.pairs.localize), each deep block mapped to its best shallow block independently, so several deep blocks may map
to one shallow block (a depth up-scaling repeats blocks) and some shallow blocks to none (a depth prune drops them).
The lineage reads the maps (lineage_graph.block_maps: which model is the parent, a closeness block by block); the
pair workers make them with the test, with the test's matching rule and on the fingerprints the test has just read,
so the scan's driver matches nothing.

Only pairs the test found related get one (log10 p at most MAP_LOG10_P: a map costs L_A * L_B screened block
tests), of one width (hidden size, MLP units, experts: what a map, like an average, needs).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Protocol

from scanner.fingerprints.fingerprint import Fingerprint
from scanner.pairs.localize import localize
from scanner.stats.matching import MatchingRule

MAP_LOG10_P = -3.0
"""Pairs whose test reaches at most this log10 p get a block map (related beyond doubt at any FDR level a hub uses)."""


@dataclass(frozen=True)
class BlockLink:
    """One block of the deeper model of a pair mapped to its best block of the shallower one (any order: several
    deep blocks may map to one shallow block), with that block pair's log10 p and closeness."""

    shallow: int
    deep: int
    log10_p: float
    closeness: float | None = None


BlockMap = tuple[BlockLink, ...]
"""The any-order block map of a pair whose depths differ: only the mapped deep blocks."""


class Shape(Protocol):
    """What a map needs to know of a model: a fingerprint's metadata, or the store's row of it."""

    n_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    n_experts: int | None


def one_width(a: Shape, b: Shape) -> bool:
    """Same hidden size, MLP units and experts: what a block map (and an average) needs."""
    return (a.hidden_size, a.intermediate_size, a.n_experts or 1) == (b.hidden_size, b.intermediate_size,
                                                                      b.n_experts or 1)


def needs_block_map(a: Shape, b: Shape, log10_p: float | None) -> bool:
    """Whether a tested pair gets a block map: related (log10 p at most MAP_LOG10_P), of one width, depths differ."""
    return (log10_p is not None and log10_p <= MAP_LOG10_P and one_width(a, b)
            and a.n_layers is not None and b.n_layers is not None and a.n_layers != b.n_layers)


def any_order_map(a: Fingerprint, b: Fingerprint, *, device: str = "cpu", rule: MatchingRule = "screened") -> BlockMap:
    """The block map of two fingerprints of different depths: each block of the deeper one with its best block of the
    shallower one, where that pair's Bonferroni-corrected p reaches localize's default threshold."""
    shallow, deep = (a, b) if len(a.blocks) < len(b.blocks) else (b, a)
    result = localize(shallow, deep, monotone=False, device=device, rule=rule)
    tests = {(p.layer_a, p.layer_b): p for p in result.pairs}
    return tuple(BlockLink(i, j, tests[(i, j)].log10_p, tests[(i, j)].closeness) for i, j in result.map)


def encoded(links: BlockMap) -> str:
    """A map as the store keeps it (JSON)."""
    return json.dumps([asdict(link) for link in links])


def decoded(text: str) -> BlockMap:
    return tuple(BlockLink(**link) for link in json.loads(text))
