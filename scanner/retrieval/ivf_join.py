"""Close signature pairs of many queries at once, inverted list by inverted list, with a two-level coarse search.

faiss answers an inverted-file (IVF) search one query at a time: it scores every coarse centroid, then scans the
probed lists vector by vector. With centroids scored exhaustively, the best number of lists grows like sqrt(N)
and so does the work per query; at hub scale that is the whole cost (measured on 2 idle cores: 218 µs per query
signature at 1,000 7B-shaped models, and growing like sqrt(N) beyond; BENCHMARKS.md, "Candidate retrieval"). Here:

* the lists' centroids (leaves) are grouped by a second k-means into groups of about ``LEAVES_PER_GROUP``; the
  coarse search is itself a small faiss IVF over the leaves whose lists are those groups: a query scores the
  groups, then only the leaves of its ``GROUPS_PROBED`` best groups, and probes its ``nprobe`` best leaves among
  those. Coarse work ~ (groups + GROUPS_PROBED * LEAVES_PER_GROUP) instead of all leaves, so lists stay short
  (``LIST_SIZE`` vectors) as the index grows; the group scores are one matrix product and the leaf scan is
  faiss's compiled loop (3x faster than the same selection in numpy, measured);
* every probed list is scanned once for all the queries that probe it, as one matrix product (BLAS), instead of
  once per query; the lists are shared out over one thread per core.

Same answer as a faiss IVF search with these probes: for each query, the (at most) ``k`` most similar indexed
vectors at cosine >= ``threshold`` among the probed lists. Approximate like any IVF: a neighbour in a list the
query does not probe is missed (bench/bench_retrieval_index.py measures how many close pairs that costs).
Pure numpy + faiss's own storage; the index file format is a plain faiss ``IndexIVFFlat``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
from threadpoolctl import threadpool_limits

LIST_SIZE = 128
"""Indexed vectors per inverted list the training aims at."""
LEAVES_PER_GROUP = 64
"""Leaves per group of the coarse search."""
GROUPS_PROBED = 8
"""Groups whose leaves a query scores (4: 8% fewer close pairs, 25% less query time at 2,000 models; BENCHMARKS.md)."""
QUERIES_PER_LIST = 128
"""Queries a probed list is scanned for at once, on average (``query_chunk``)."""
QUERY_CHUNK = 1 << 17
"""The fewest queries joined at once (and the rows of one product in ``_nearest``)."""
_SEED = 20261123


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


def centroid_tree(leaves: np.ndarray):  # noqa: ANN201 - a faiss IVF over the leaves
    """The two-level coarse search over ``leaves`` (the index's list centroids): a faiss IVF whose vectors are the
    leaves, numbered as in the index, and whose lists are groups of about LEAVES_PER_GROUP leaves (seeded k-means,
    every leaf in its nearest group's list). The leaves are held as float16: half the memory to scan (32,768
    leaves: 4 MB), 19% faster, and the same probes for 99.95% of queries (measured); a probe only has to be
    near. Rebuilt in each process from the saved centroids: a grouping differing in the last bits only moves a
    vector to a neighbouring list."""
    import faiss

    leaves = np.ascontiguousarray(leaves, dtype=np.float32)
    groups = _kmeans(leaves, max(1, leaves.shape[0] // LEAVES_PER_GROUP))
    group_of = _nearest(leaves, groups)
    quantizer = faiss.IndexFlatIP(leaves.shape[1])
    quantizer.add(groups)
    tree = faiss.IndexIVFScalarQuantizer(quantizer, leaves.shape[1], groups.shape[0], faiss.ScalarQuantizer.QT_fp16,
                                         faiss.METRIC_INNER_PRODUCT, False)
    tree.is_trained = True   # float16 codes need no training; the groups are the coarse centroids
    numbers = np.arange(leaves.shape[0], dtype=np.int64)
    tree.add_core(leaves.shape[0], faiss.swig_ptr(leaves), faiss.swig_ptr(numbers), faiss.swig_ptr(group_of))
    tree.nprobe = min(GROUPS_PROBED, groups.shape[0])
    return tree


def probe(tree, queries: np.ndarray, nprobe: int) -> np.ndarray:  # noqa: ANN001 - centroid_tree's index
    """(q, nprobe) leaf numbers of each query's best leaves among its GROUPS_PROBED best groups, best first
    (-1 where fewer leaves were scored)."""
    return tree.search(np.ascontiguousarray(queries, dtype=np.float32), min(nprobe, tree.ntotal))[1]


def query_chunk(nlist: int, nprobe: int) -> int:
    """Queries joined at once: enough that each probed list is scanned for ~QUERIES_PER_LIST of them. Each list
    visit costs ~30 µs of Python and faiss calls besides its product; with a fixed chunk the visits grew like
    nlist x chunks, N^2 (measured: 1.7x the work per query from 1,000 to 2,000 7B-shaped models)."""
    return max(QUERY_CHUNK, QUERIES_PER_LIST * nlist // max(nprobe, 1))


def close_hits(ivf, tree, queries: np.ndarray, nprobe: int, k: int,  # noqa: ANN001 - faiss IVFs
               threshold: float) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """For successive chunks of ``queries`` (``query_chunk``): (query row, indexed id) of each query's at most
    ``k`` most similar indexed vectors at cosine >= threshold in its probed lists. faiss probes a chunk on every
    core; the probed lists are then shared out over one thread per core (numpy's products and selections release
    the GIL), each with one BLAS thread (more only spin: 1.5x the CPU, measured)."""
    workers, size = os.cpu_count() or 1, query_chunk(ivf.nlist, nprobe)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, queries.shape[0], size):
            chunk = np.ascontiguousarray(queries[start:start + size], dtype=np.float32)
            probed = probe(tree, chunk, nprobe)
            leaves, query_of = probed.ravel(), np.repeat(np.arange(chunk.shape[0]), probed.shape[1])
            order = np.argsort(leaves, kind="stable")
            leaves, query_of = leaves[order], query_of[order]
            bounds = np.flatnonzero(np.r_[True, leaves[1:] != leaves[:-1], True])
            if leaves.size and leaves[0] < 0:   # probes that found no leaf
                bounds = bounds[1:]
            shares = [share for share in np.array_split(np.arange(bounds.size - 1), workers) if share.size]
            with threadpool_limits(limits=1, user_api="blas"):   # the threads share the cores, not BLAS
                found = list(pool.map(partial(_scan_lists, ivf, chunk, leaves, query_of, bounds, threshold), shares))
            rows, ids, sims = (np.concatenate([f[i] for f in found] or [np.zeros(0)]) for i in range(3))
            rows, ids = _best_k(rows.astype(np.int64), ids.astype(np.int64), sims, k)
            yield rows + start, ids


def _scan_lists(ivf, chunk: np.ndarray, leaves: np.ndarray, query_of: np.ndarray,  # noqa: ANN001 - faiss IVF
                bounds: np.ndarray, threshold: float, share: np.ndarray) -> tuple[np.ndarray, ...]:
    """(query row, indexed id, cosine) of the hits at ``threshold`` in the lists numbered ``share`` of the
    probed runs ``bounds`` (query_of sorted by leaf)."""
    rows, ids, sims = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float32)]
    for lo, hi in zip(bounds[share], bounds[share + 1]):
        vectors, list_ids = _list_contents(ivf, int(leaves[lo]))
        if not list_ids.size:
            continue
        asking = query_of[lo:hi]
        similarity = (chunk[asking] @ vectors.T).ravel()
        hit = np.flatnonzero(similarity >= threshold)   # flat: 2-D nonzero costs twice the product
        rows.append(asking[hit // vectors.shape[0]])
        ids.append(list_ids[hit % vectors.shape[0]])
        sims.append(similarity[hit])
    return np.concatenate(rows), np.concatenate(ids), np.concatenate(sims)


def _best_k(rows: np.ndarray, ids: np.ndarray, sims: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The hits of each row with the k largest similarities (all of them when no row has more than k)."""
    if not rows.size or np.bincount(rows).max() <= k:
        return rows, ids
    order = np.lexsort((-sims, rows))
    rows, ids = rows[order], ids[order]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
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

