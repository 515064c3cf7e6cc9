"""Candidate pairs: which pairs of a hub get a φ_MATCH test, chosen from the fingerprints without testing them.

A scan of N models tests every comparable pair today, N(N-1)/2 tests. Instead, every model's retrieval entry
(a few unit signatures per block, scanner.retrieval.signatures) goes into a nearest-neighbour index, and a pair
becomes a candidate when its units collide unusually often: at least ``min_score`` signatures of one model have a
signature of the other within cosine ``threshold`` (scanner.retrieval.collisions), in any blocks. Each new or
changed revision queries the index of everything scanned before, so the work grows like N log N. Declared pairs
(a card's base) and pairs sharing a byte-identical tensor are added by the scan whatever their score.

A selected pair's block map (which block of one model holds weights of which block of the other: what
depth-changed pairs are tested on, and what the family closure of scanner.retrieval.hub joins) is drawn from its
collisions and from its signature hits down to a lower cosine, ``MAP_THRESHOLD`` (0.5): a block pair with
``MAP_MIN_HITS`` such hits joins the map. Those hits never change a score; they count only for a pair already
selected on its collisions, and they are counted between the two entries compared in full (exact whatever the
index: an IVF loses many hits near 0.5), one small matrix product per selected pair. A merge that averaged a
donor's block with an unrelated one keeps units at cosine 0.45-0.55 to the donor's relatives: its selected parent
maps that block now, and the closure reaches the donor's family through it (BENCHMARKS.md, "Synthetic hub grown
from the zoo").

Why the φ_MATCH p-value of a selected pair stays valid
-------------------------------------------------------
The pairs that get a p-value are chosen by looking at the same fingerprints, so the question is whether
P(p <= a | selected) <= a still holds for independent models. The selection score is a function of the *sets*
of unit signatures of the two models: relabelling (permuting) either model's hidden units leaves the entries, and
so the score, the selection and the block map unchanged. Under the null of independence, the labels of a model's
hidden units carry no information (initialisation is invariant and training equivariant under permutations of
hidden units, the premise of every test of the paper): given the unordered set of units, each labelling is equally
likely. φ_MATCH's null distribution is exactly a statement about that labelling: it compares two matchings as
permutations of one model's unit labels, and its p-value is calibrated against a uniformly random relabelling.
Conditioning on selection conditions only on the unordered sets, which leaves the labelling uniform; the
conditional law of the φ_MATCH statistic given selection is therefore the one its p-value is calibrated for, and
P(p <= a | selected) <= a whenever the unconditional p-value is valid given the unit sets. A selection score that
looked at labels (say, how often unit i of one model resembles unit i of the other, or a φ statistic of one block)
would not have this property, and `tests/test_retrieval_validity.py` shows that such a selection does distort
the selected pairs' p-values while the collision count does not (KS against uniform over >= 200 selected
independent pairs). The rest of the selection is label-free too: block maps come from the same hits (at the
collision and the map threshold, counts over the two sets of signatures), and the family closure joins pairs by
those block maps, so a pair selected through its relatives is selected on unordered unit sets as well.

Depth-changed pairs are tested on the block pairs the collisions map (scanner.retrieval.collisions.block_map) as
well as by index, and report twice the smaller of the two p-values (Bonferroni over the two block pairings; the
map itself is chosen by the same label-free collision counts, so each pairing's p-value is valid).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
from threadpoolctl import threadpool_limits

from scanner.retrieval.collisions import PairCollisions, block_map, collisions_by_pair, map_counts
from scanner.retrieval.index import ModelKey, RetrievalIndex
from scanner.retrieval.signatures import RetrievalEntry

MIN_SCORE = 4
"""Collisions that make a candidate. Independent pairs usually score 2 or less, but this is no bound on them: on
one zoo build the long fine-tune's last-block units converged with those of a base trained on other text (score 5),
and one scale-bench run had a chance pair at 4 (BENCHMARKS.md). A candidate is therefore tested, never assumed
dependent."""
MAP_THRESHOLD = 0.5
"""Cosine down to which a selected pair's signature hits draw its block map (the scan's ``pairs.map_threshold``)."""
MAP_MIN_HITS = 2
"""Hits at the map threshold (``SearchParams.map_threshold``) that join a block pair to a selected pair's block map
when none of them reaches the collision threshold (one hit at 0.5 joined so many blocks on the synthetic hub that
family components passed the closure's cap and recall fell to 98%: BENCHMARKS.md)."""


@dataclass(frozen=True)
class CandidatePair:
    """A retrieved pair, (model_a, revision_a) < (model_b, revision_b), with its collision score, its rank (the
    better of the two models' ranks of each other, 1 = nearest) and the block map the collisions give."""

    model_a: str
    revision_a: str
    model_b: str
    revision_b: str
    score: int
    rank: int
    block_map: tuple[tuple[int, int], ...]

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.model_a, self.revision_a, self.model_b, self.revision_b)


def scored_pairs(index: RetrievalIndex, entries: Mapping[ModelKey, RetrievalEntry],
                 min_score: int = 1) -> list[CandidatePair]:
    """Every pair scoring at least ``min_score`` between a queried model (``entries``, all held by the index) and
    any held model, scored, ranked (among all the pairs with a collision) and block-mapped. Only those pairs'
    maps are drawn: at 10,000 models, 35,000 selected pairs against 400,000 with a chance collision or two."""
    numbers = index.key_of()
    pairs = []
    for (x, y), collisions in collisions_by_pair(index.search(entries), index.blocks).items():
        swapped = numbers[x] > numbers[y]
        key_x, key_y = (numbers[y], numbers[x]) if swapped else (numbers[x], numbers[y])
        pairs.append((key_x, key_y, collisions, swapped))
    ranks: dict[tuple[ModelKey, ModelKey], int] = {}
    by_model: dict[ModelKey, list[tuple[int, ModelKey]]] = {}
    for key_x, key_y, collisions, _ in pairs:
        by_model.setdefault(key_x, []).append((collisions.score, key_y))
        by_model.setdefault(key_y, []).append((collisions.score, key_x))
    for model, neighbours in by_model.items():
        for rank, (_, other) in enumerate(sorted(neighbours, key=lambda n: (-n[0], n[1])), start=1):
            pair = (min(model, other), max(model, other))
            ranks[pair] = min(ranks.get(pair, rank), rank)

    def oriented_map(collisions: PairCollisions, swapped: bool) -> tuple[tuple[int, int], ...]:
        counts = collisions.block_counts
        return tuple(block_map({(b, a): n for (a, b), n in counts.items()} if swapped else counts))

    return sorted((CandidatePair(x[0], x[1], y[0], y[1], c.score, ranks[(x, y)], oriented_map(c, swapped))
                   for x, y, c, swapped in pairs if c.score >= min_score), key=lambda c: (-c.score, c.key))


def pair_block_counts(a: RetrievalEntry, b: RetrievalEntry, threshold: float, map_threshold: float,
                      min_hits: int = MAP_MIN_HITS) -> dict[tuple[int, int], int]:
    """The block-pair counts of two entries compared in full (every signature of one against every signature
    of the other, at least one of them indexed, as the index compares them): the block pairs with a hit at
    ``threshold``, and those with ``min_hits`` hits at ``map_threshold`` (``map_counts``). Exact whatever the
    index (an IVF misses hits near the lower cosine), and a function of the two signature sets.

    Two products cover those pairs once each (a's indexed rows against all of b, a's other rows against b's
    indexed ones: 44% of the full product at 16 of 64 indexed), and the hits, a few per row, are counted sparsely."""
    indexed_a, rest_a, indexed_b = (np.flatnonzero(m) for m in (a.indexed, ~a.indexed, b.indexed))
    vectors_a, vectors_b = (np.asarray(e.vectors, dtype=np.float32) for e in (a, b))   # numpy has no float16 BLAS
    rows_a, rows_b, cosines = [], [], []
    for picked_a, picked_b in ((indexed_a, np.arange(b.blocks.size)), (rest_a, indexed_b)):
        product = vectors_a[picked_a] @ vectors_b[picked_b].T
        i, j = np.nonzero(product >= map_threshold)
        rows_a.append(picked_a[i])
        rows_b.append(picked_b[j])
        cosines.append(product[i, j])
    blocks_a = a.blocks[np.concatenate(rows_a)].astype(np.int64)
    blocks_b = b.blocks[np.concatenate(rows_b)].astype(np.int64)
    strong = np.concatenate(cosines) >= threshold
    width = int(b.blocks.max(initial=0)) + 1

    def per_block(keep: np.ndarray) -> dict[tuple[int, int], int]:
        keys, counts = np.unique(blocks_a[keep] * width + blocks_b[keep], return_counts=True)
        return {(int(k // width), int(k % width)): int(n) for k, n in zip(keys, counts)}

    return map_counts(per_block(strong), per_block(np.ones_like(strong)), min_hits)


def with_wide_block_maps(pairs: Iterable[CandidatePair], entry_of: Callable[[ModelKey], RetrievalEntry], *,
                         threshold: float, map_threshold: float = MAP_THRESHOLD,
                         depth_of: Callable[[ModelKey], int] | None = None) -> list[CandidatePair]:
    """Selected pairs with their block maps widened: the blocks their collision map leaves unpaired are compared
    in full down to ``map_threshold`` (``pair_block_counts``), and the block pairs found there join the map.
    A map that already pairs every block of the shallower model is kept as it is (a one-to-one map cannot
    grow), so most fine-tunes cost nothing here and a retrained MLP costs the quarter of the product its
    unpaired blocks span; ``depth_of(key)``, the blocks a model's entry covers (``RetrievalIndex.depth``), tells
    that without loading the entries (default: counted from them). Pairs are widened on one thread per core
    (``entry_of`` must allow that). Unchanged when ``map_threshold`` is the collision ``threshold``. Scores and
    ranks stay those of the search."""
    if map_threshold >= threshold:
        return list(pairs)
    depth_of = depth_of or (lambda key: int(np.unique(entry_of(key).blocks).size))

    def widened(pair: CandidatePair) -> CandidatePair:
        key_a, key_b = (pair.model_a, pair.revision_a), (pair.model_b, pair.revision_b)
        if len(pair.block_map) >= min(depth_of(key_a), depth_of(key_b)):
            return pair
        a, b = entry_of(key_a), entry_of(key_b)
        paired_a, paired_b = {x for x, _ in pair.block_map}, {y for _, y in pair.block_map}
        extra = block_map(pair_block_counts(_without_blocks(a, paired_a), _without_blocks(b, paired_b),
                                            threshold, map_threshold))
        return replace(pair, block_map=tuple(sorted((*pair.block_map, *extra))))

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool, threadpool_limits(limits=1, user_api="blas"):
        return list(pool.map(widened, pairs))


def _without_blocks(entry: RetrievalEntry, blocks: set[int]) -> RetrievalEntry:
    keep = ~np.isin(entry.blocks, np.fromiter(blocks, dtype=np.int64, count=len(blocks)))
    return replace(entry, vectors=entry.vectors[keep], blocks=entry.blocks[keep], indexed=entry.indexed[keep])
