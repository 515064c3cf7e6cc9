"""Close signature pairs of many queries at once, inverted list by inverted list, with a two-level coarse search.

faiss answers an inverted-file (IVF) search one query at a time: it scores every coarse centroid, then scans the
probed lists vector by vector. With centroids scored exhaustively, the best number of lists grows like sqrt(N)
and so does the work per query; at hub scale that is the whole cost (measured on 2 cores: 240 µs per query
signature at 1,000 7B-shaped models, about 2 hours of CPU for a 10,000-model rebuild; BENCHMARKS.md). Here:

* the lists' centroids (leaves) are grouped by a second, small k-means (the groups); a query scores the groups,
  then only the leaves of its ``GROUPS_PROBED`` best groups, and probes its ``nprobe`` best leaves among those:
  coarse work ~ (groups + GROUPS_PROBED * leaves per group) instead of all leaves, so lists can stay short
  (``LIST_SIZE`` vectors) as the index grows and the work per query stays about constant;
* every probed list is scanned once for all the queries that probe it, as one matrix product (BLAS), instead of
  once per query.

Same answer as a faiss IVF search with these probes: for each query, the (at most) ``k`` most similar indexed
vectors at cosine >= ``threshold`` among the probed lists. Approximate like any IVF: a neighbour in a list the
query does not probe is missed (bench/bench_retrieval_index.py measures how many close pairs that costs).
Pure numpy + faiss's own storage; the index file format is a plain faiss ``IndexIVFFlat``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

LIST_SIZE = 128
"""Indexed vectors per inverted list the training aims at."""
GROUPS_PROBED = 8
QUERY_CHUNK = 1 << 17
_SEED = 20261123


@dataclass(frozen=True)
class CentroidTree:
    """The leaves (list centroids) in groups: ``groups`` (g, d) group centroids, ``members[i]`` the leaf numbers
    of group i, ``leaves`` (nlist, d)."""

    leaves: np.ndarray
    groups: np.ndarray
    members: tuple[np.ndarray, ...]


def list_count(vectors: int) -> int:
    """Lists for an index built over ``vectors``: a power of two near vectors / LIST_SIZE (at least 64)."""
    return int(2 ** max(6, round(np.log2(max(vectors, 1) / LIST_SIZE))))


def train_leaves(sample: np.ndarray, nlist: int) -> np.ndarray:
    """``nlist`` list centroids from ``sample`` by hierarchical k-means (sqrt(nlist) top clusters, each split
    in proportion to its share of the sample): far cheaper than one k-means over all leaves."""
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    top = max(1, int(round(np.sqrt(nlist))))
    top_centroids = _kmeans(sample, top)
    cell = _nearest(sample, top_centroids)
    sizes = np.bincount(cell, minlength=top)
    shares = np.maximum(1, np.round(nlist * sizes / sizes.sum()).astype(int)) * (sizes > 0)
    leaves = [_kmeans(sample[cell == c], int(min(shares[c], sizes[c])))
              for c in range(top) if sizes[c]]
    return np.ascontiguousarray(np.concatenate(leaves), dtype=np.float32)


def centroid_tree(leaves: np.ndarray) -> CentroidTree:
    """Group ``leaves`` (the index's list centroids) for the two-level coarse search. Seeded, and rebuilt in each
    process from the saved centroids: a tree differing in the last bits only moves a vector to a neighbouring list."""
    count = max(1, int(round(np.sqrt(leaves.shape[0]))))
    groups = _kmeans(leaves, count)
    group_of = _nearest(leaves, groups)
    members = tuple(np.flatnonzero(group_of == g) for g in range(count))
    keep = [g for g in range(count) if members[g].size]
    return CentroidTree(leaves, groups[keep], tuple(members[g] for g in keep))


def probe(tree: CentroidTree, queries: np.ndarray, nprobe: int) -> np.ndarray:
    """(q, nprobe) leaf numbers of each query's best leaves among its GROUPS_PROBED best groups, best first
    (-1 where fewer leaves were scored). Kept as a running best per query, group by group: memory ~ q * nprobe."""
    n, nprobe = queries.shape[0], min(nprobe, tree.leaves.shape[0])
    best_groups = _top(queries @ tree.groups.T, min(GROUPS_PROBED, tree.groups.shape[0]))
    best_scores = np.full((n, nprobe), -np.inf, dtype=np.float32)
    best_leaves = np.full((n, nprobe), -1, dtype=np.int64)
    for g, members in enumerate(tree.members):
        rows = np.nonzero(best_groups == g)[0]
        if not rows.size:
            continue
        scores = np.concatenate([best_scores[rows], queries[rows] @ tree.leaves[members].T], axis=1)
        leaves = np.concatenate([best_leaves[rows], np.broadcast_to(members, (rows.size, members.size))], axis=1)
        top = _top(scores, nprobe)
        best_scores[rows] = np.take_along_axis(scores, top, axis=1)
        best_leaves[rows] = np.take_along_axis(leaves, top, axis=1)
    return best_leaves


def close_hits(ivf, tree: CentroidTree, queries: np.ndarray, nprobe: int, k: int,  # noqa: ANN001 - faiss IVF
               threshold: float) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """For successive chunks of ``queries``: (query row, indexed id) of each query's at most ``k`` most similar
    indexed vectors at cosine >= threshold in its probed lists. Chunks run on one thread per core (numpy's
    products, sorts and selections release the GIL)."""
    starts = range(0, queries.shape[0], QUERY_CHUNK)
    with ThreadPoolExecutor(max_workers=min(len(starts), os.cpu_count() or 1) or 1) as pool:
        yield from pool.map(lambda start: _chunk_hits(ivf, tree, queries, start, nprobe, k, threshold), starts)


def _chunk_hits(ivf, tree: CentroidTree, queries: np.ndarray, start: int, nprobe: int, k: int,  # noqa: ANN001
                threshold: float) -> tuple[np.ndarray, np.ndarray]:
    chunk = np.ascontiguousarray(queries[start:start + QUERY_CHUNK], dtype=np.float32)
    probed = probe(tree, chunk, nprobe)
    leaves, query_of = probed.ravel(), np.repeat(np.arange(chunk.shape[0]), probed.shape[1])
    order = np.argsort(leaves, kind="stable")
    leaves, query_of = leaves[order], query_of[order]
    bounds = np.flatnonzero(np.r_[True, leaves[1:] != leaves[:-1], True])
    rows, ids, sims = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if leaves[lo] < 0:
            continue
        vectors, list_ids = _list_contents(ivf, int(leaves[lo]))
        if not list_ids.size:
            continue
        asking = query_of[lo:hi]
        similarity = chunk[asking] @ vectors.T
        q, v = np.nonzero(similarity >= threshold)
        rows.append(asking[q])
        ids.append(list_ids[v])
        sims.append(similarity[q, v])
    return _best_k(np.concatenate(rows) + start, np.concatenate(ids), np.concatenate(sims), k)


def _best_k(rows: np.ndarray, ids: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The hits of each row with the k largest similarities."""
    order = np.lexsort((-sims, rows))
    rows, ids = rows[order], ids[order]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]]) if rows.size else np.zeros(0, np.int64)
    rank = np.arange(rows.size) - np.repeat(first, np.diff(np.r_[first, rows.size]))
    return rows[rank < k], ids[rank < k]


def _list_contents(ivf, leaf: int) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001 - faiss IVF (Flat codes)
    import faiss  # lazily, as scanner.retrieval.index does: config loading must not pay for it

    lists = ivf.invlists
    size = lists.list_size(leaf)
    if not size:
        return np.zeros((0, ivf.d), np.float32), np.zeros(0, np.int64)
    codes = faiss.rev_swig_ptr(lists.get_codes(leaf), size * lists.code_size)
    ids = faiss.rev_swig_ptr(lists.get_ids(leaf), size)
    return codes.view(np.float32).reshape(size, ivf.d), ids


def _kmeans(points: np.ndarray, k: int) -> np.ndarray:
    if k >= points.shape[0]:
        return np.ascontiguousarray(points, dtype=np.float32)
    import faiss

    kmeans = faiss.Kmeans(points.shape[1], k, niter=10, seed=_SEED, spherical=True, verbose=False,
                          max_points_per_centroid=256, min_points_per_centroid=1)
    kmeans.train(np.ascontiguousarray(points, dtype=np.float32))
    return kmeans.centroids


def _nearest(points: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    out = np.empty(points.shape[0], dtype=np.int64)
    for start in range(0, points.shape[0], QUERY_CHUNK):
        out[start:start + QUERY_CHUNK] = np.argmax(points[start:start + QUERY_CHUNK] @ centroids.T, axis=1)
    return out


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of each row's k largest scores, largest first."""
    if k >= scores.shape[1]:
        return np.argsort(-scores, axis=1)
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return np.take_along_axis(part, np.argsort(-np.take_along_axis(scores, part, axis=1), axis=1), axis=1)
