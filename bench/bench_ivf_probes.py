"""How many close signature pairs the retrieval index's IVF finds against exhaustive search, by lists probed.

    PYTHONPATH=. python bench/bench_ivf_probes.py [--models 1000] [--sample 4000]

Entries of ``--models`` synthetic 7B-shaped models (bench_retrieval_scale.py's generator) go into the retrieval
index as a scan builds it (IVF, lists of ~128 vectors). For ``--sample`` query signatures drawn at random, the
exact answer is each query's 32 nearest indexed signatures of other models at cosine >= 0.6 (brute force); the
IVF's answer is scanner.retrieval.ivf_join's with 4, 8 and 16 lists probed among the leaves of 8 groups of the
coarse search, and with 4 lists among 4 and 6 groups. Prints the fraction of exact close pairs found, and the wall
time per query signature of a whole chunk of queries (what a rebuild pays).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))

from bench_retrieval_scale import synthetic_entries  # noqa: E402

from scanner.retrieval import ivf_join  # noqa: E402
from scanner.retrieval.collisions import split_id, vector_id  # noqa: E402
from scanner.retrieval.index import DEFAULT_SEARCH, RetrievalIndex, SearchParams  # noqa: E402


def exact_close_pairs(queries: np.ndarray, query_models: np.ndarray, indexed: np.ndarray, indexed_ids: np.ndarray,
                      k: int, threshold: float) -> set[tuple[int, int]]:
    """(query row, indexed id) of each query's k nearest indexed vectors of another model at cosine >= threshold."""
    found = set()
    other_model = split_id(indexed_ids)[0]
    for start in range(0, queries.shape[0], 200):
        sims = queries[start:start + 200] @ indexed.T
        sims[other_model[None, :] == query_models[start:start + 200, None]] = -1
        best = np.argpartition(-sims, k, axis=1)[:, :k]
        for row, columns in enumerate(best):
            found |= {(start + row, int(indexed_ids[c])) for c in columns if sims[row, c] >= threshold}
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=4000)
    args = parser.parse_args()
    entries, _, _ = synthetic_entries(args.models, 8)
    keyed = {(f"m{i:06d}", "r"): e for i, e in enumerate(entries)}
    index = RetrievalIndex(tempfile.mkdtemp(), "bench", search=SearchParams(kind="ivf"))
    index.sync({key: (lambda e=e: e) for key, e in keyed.items()})
    tree = index._centroid_tree()
    indexed = np.concatenate([e.vectors[e.indexed] for e in entries]).astype(np.float32)
    indexed_ids = np.concatenate([vector_id(i, np.flatnonzero(e.indexed)) for i, e in enumerate(entries)])
    queries = np.concatenate([e.vectors for e in entries]).astype(np.float32)
    query_models = np.concatenate([np.full(e.vectors.shape[0], i) for i, e in enumerate(entries)])
    rows = np.random.default_rng(0).choice(queries.shape[0], args.sample, replace=False)
    k, threshold = DEFAULT_SEARCH.neighbours, DEFAULT_SEARCH.threshold
    exact = exact_close_pairs(queries[rows], query_models[rows], indexed, indexed_ids, k, threshold)
    timed = queries[: ivf_join.query_chunk(index.index.nlist, 4)]
    print(f"{args.models} models, {index.kind}, {len(exact)} exact close pairs among {args.sample} query signatures")
    for groups, nprobe in ((8, 4), (8, 8), (8, 16), (6, 4), (4, 4)):
        tree.nprobe = groups
        got = set()
        for hit_rows, ids in ivf_join.close_hits(index.index, tree, queries[rows], nprobe, k, threshold):
            other = split_id(ids)[0] != query_models[rows][hit_rows]
            got |= set(zip(hit_rows[other].tolist(), ids[other].tolist()))
        started = time.perf_counter()
        for _ in ivf_join.close_hits(index.index, tree, timed, nprobe, k, threshold):
            pass
        per_query = (time.perf_counter() - started) / timed.shape[0] * 1e6
        print(f"groups {groups}, nprobe {nprobe:2d}: {len(got & exact) / len(exact):.3f} of exact close pairs, "
              f"{per_query:.1f} µs of wall per query signature ({timed.shape[0]} at once)")


if __name__ == "__main__":
    main()
