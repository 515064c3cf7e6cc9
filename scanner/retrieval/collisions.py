"""From nearest-neighbour hits to candidate pairs: unit collisions counted per pair of models, and block maps.

Pure: arrays in, pairs out; the index (scanner.retrieval.index) finds the hits.

A collision is a pair of signatures (one of each model) at cosine >= ``threshold``. A pair's score is the smaller
of the two numbers of distinct signatures involved on either side, summed over all blocks: a count that does not
change when either model's hidden units are relabelled (signatures form a set, see scanner.retrieval.signatures).
The smaller side, because a copied unit has one counterpart: a derivative's collisions pair its units one to one
with its parent's (the zoo's pairs: 9 and 10 units, 11 and 11), while units that many models learn alike make a few
units of one model collide with many of the other (2 units of an unrelated base against 5 of a fine-tune, a
chance link that the family closure then spread over both families: bench/bench_retrieval_recall.py). The same
hits also say which block of one model collides with which block of the other: the block map that depth-changed
pairs are tested on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linear_sum_assignment

ROW_BITS = 24
"""A vector's index id is (model number << ROW_BITS) | row within the model's entry."""


@dataclass
class PairCollisions:
    """Collisions between two models (numbers ``a`` < ``b``): rows involved on each side, per block pair."""

    rows_a: int = 0      # distinct signatures of a that collide with one of b
    rows_b: int = 0
    block_counts: dict[tuple[int, int], int] = field(default_factory=dict)   # (block of a, block of b) -> hits

    @property
    def score(self) -> int:
        """Units that can have a counterpart: the smaller side (see the module docstring)."""
        return min(self.rows_a, self.rows_b)


def vector_id(model_number: int, row: int | np.ndarray) -> np.ndarray:
    return (np.int64(model_number) << ROW_BITS) | np.asarray(row, dtype=np.int64)


def split_id(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, dtype=np.int64)
    return ids >> ROW_BITS, ids & ((1 << ROW_BITS) - 1)


def close_pairs(query_ids: np.ndarray, similarities: np.ndarray, neighbour_ids: np.ndarray,
                threshold: float) -> np.ndarray:
    """The (id, id) pairs, smaller id first, of signatures of two different models at cosine >= threshold;
    each pair once. ``similarities`` and ``neighbour_ids`` are faiss's (queries, k) answers (-1 = none)."""
    q = np.broadcast_to(np.asarray(query_ids, dtype=np.int64)[:, None], neighbour_ids.shape)
    keep = (similarities >= threshold) & (neighbour_ids >= 0)
    return cross_model_pairs(q[keep], neighbour_ids[keep])


def cross_model_pairs(ids_x: np.ndarray, ids_y: np.ndarray) -> np.ndarray:
    """The distinct (id, id) pairs, smaller id first, among the hits (ids_x[i], ids_y[i]) that join two models."""
    ids_x, ids_y = np.asarray(ids_x, dtype=np.int64), np.asarray(ids_y, dtype=np.int64)
    other = split_id(ids_x)[0] != split_id(ids_y)[0]
    ids_x, ids_y = ids_x[other], ids_y[other]
    return unique_id_pairs(np.stack([np.minimum(ids_x, ids_y), np.maximum(ids_x, ids_y)], axis=1))


def unique_id_pairs(pairs: np.ndarray) -> np.ndarray:
    """The distinct rows of an (n, 2) table of vector ids, sorted. Sorted as (model, row, model, row), whose
    values need far fewer bits than two whole ids, so that ``unique_rows`` can pack them into one key."""
    models_x, rows_x = split_id(pairs[:, 0])
    models_y, rows_y = split_id(pairs[:, 1])
    table = unique_rows(np.stack([models_x, rows_x, models_y, rows_y], axis=1))[0]
    return np.stack([vector_id(table[:, 0], table[:, 1]), vector_id(table[:, 2], table[:, 3])], axis=1)


def unique_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(table, axis=0, return_counts=True)`` for a table of non-negative integers. The columns are
    packed into one int64 key when their values fit in 63 bits together (a 1-D sort: on 6 million id pairs 20x
    faster than numpy's row-wise unique, which sorts a structured view with generic comparisons), else sorted
    with lexsort."""
    table = np.asarray(table, dtype=np.int64)
    widths = [int(column.max(initial=0)).bit_length() for column in table.T]
    if sum(widths) <= 63:
        key = np.zeros(len(table), dtype=np.int64)
        for column, width in zip(table.T, widths):
            key = (key << width) | column
        key, counts = np.unique(key, return_counts=True)
        out = np.empty((key.size, table.shape[1]), dtype=np.int64)
        for i, width in reversed(list(enumerate(widths))):
            out[:, i], key = key & ((1 << width) - 1), key >> width
        return out, counts
    table = table[np.lexsort(table.T[::-1])]
    first = np.flatnonzero(np.r_[True, (table[1:] != table[:-1]).any(axis=1)]) if len(table) else np.zeros(0, int)
    return table[first], np.diff(np.r_[first, len(table)])


def collisions_by_pair(pairs: np.ndarray, blocks: Mapping[int, np.ndarray]) -> dict[tuple[int, int], PairCollisions]:
    """Group close signature pairs by model pair; ``blocks[model number]`` is that entry's block per row."""
    out: dict[tuple[int, int], PairCollisions] = {}
    if not pairs.size:
        return out
    models_x, rows_x = split_id(pairs[:, 0])
    models_y, rows_y = split_id(pairs[:, 1])
    for side, rows in (("rows_a", rows_x), ("rows_b", rows_y)):
        model_pairs, counts = unique_rows(unique_rows(np.stack([models_x, models_y, rows], axis=1))[0][:, :2])
        for (x, y), count in zip(model_pairs.tolist(), counts.tolist()):
            setattr(out.setdefault((x, y), PairCollisions()), side, count)
    bx, by = _blocks_of(models_x, rows_x, blocks), _blocks_of(models_y, rows_y, blocks)
    quadruples, counts = unique_rows(np.stack([models_x, models_y, bx, by], axis=1))
    for (x, y, a, b), count in zip(quadruples.tolist(), counts.tolist()):
        out[(x, y)].block_counts[(a, b)] = count
    return out


def _blocks_of(models: np.ndarray, rows: np.ndarray, blocks: Mapping[int, np.ndarray]) -> np.ndarray:
    """The block of each (model, row), gathered one model at a time."""
    out = np.empty_like(rows)
    order = np.argsort(models, kind="stable")
    sorted_models = models[order]
    starts = np.flatnonzero(np.r_[True, sorted_models[1:] != sorted_models[:-1]])
    for start, end in zip(starts, np.r_[starts[1:], sorted_models.size]):
        picked = order[start:end]
        out[picked] = blocks[int(sorted_models[start])][rows[picked]]
    return out


def map_counts(strong: Mapping[tuple[int, int], int], loose: Mapping[tuple[int, int], int],
               min_loose_hits: int) -> dict[tuple[int, int], int]:
    """The block-pair counts a selected pair's block map is drawn from: every block pair with a collision
    (``strong``, cosine >= the collision threshold), and every block pair with at least ``min_loose_hits`` hits at
    the lower map threshold (``loose``, which includes the strong hits), counted at the lower threshold. Blocks
    that a derivative moved further (a merge averaging a donor's block with an unrelated one) join the map, and so
    the family closure, through the pair that was selected on its other blocks."""
    return {pair: max(n, strong.get(pair, 0)) for pair, n in loose.items() if n >= min_loose_hits or pair in strong}


def block_map(block_counts: Mapping[tuple[int, int], int]) -> list[tuple[int, int]]:
    """One-to-one (block of a, block of b) pairs with the most collisions in total (maximum-weight assignment),
    ordered by a's block; only block pairs that collide at all."""
    if not block_counts:
        return []
    depth_a = 1 + max(a for a, _ in block_counts)
    depth_b = 1 + max(b for _, b in block_counts)
    counts = np.zeros((depth_a, depth_b))
    for (a, b), n in block_counts.items():
        counts[a, b] = n
    rows, cols = linear_sum_assignment(counts, maximize=True)
    return sorted((int(a), int(b)) for a, b in zip(rows, cols) if counts[a, b] > 0)
