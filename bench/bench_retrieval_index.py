"""Index kinds for candidate retrieval, measured on the same entries: exact (flat), faiss's own IVF search, the
retrieval index's IVF (two-level coarse search, list-major join: scanner.retrieval.ivf_join), HNSW.

    PYTHONPATH=. python bench/bench_retrieval_index.py [--models 100] [--family 8]

Entries are bench_retrieval_scale's synthetic 7B-shaped ones (32 blocks, 16 indexed and 64 query signatures per
block, planted families). For each kind: build time (training included), query time of every model's signatures
(wall and CPU seconds of this process), bytes of the serialised index, recall of the close signature pairs that
exact search finds (cosine >= the threshold), and recall of the planted dependent pairs among the retrieved pairs
(score >= MIN_SCORE, before any family closure). HNSW is measured for comparison only: faiss's HNSW indexes
cannot remove vectors, which a superseded revision needs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_retrieval_scale import synthetic_entries  # noqa: E402


def main() -> None:
    import faiss

    from scanner.retrieval.candidates import MIN_SCORE
    from scanner.retrieval.collisions import close_pairs, collisions_by_pair, vector_id
    from scanner.retrieval.index import DEFAULT_SEARCH, NPROBE, RetrievalIndex, SearchParams

    parser = argparse.ArgumentParser()
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--family", type=int, default=8)
    args = parser.parse_args()
    entries, families, _ = synthetic_entries(args.models, args.family)
    indexed = np.concatenate([e.vectors[e.indexed] for e in entries]).astype(np.float32)
    indexed_ids = np.concatenate([vector_id(i, np.flatnonzero(e.indexed)) for i, e in enumerate(entries)])
    queries = np.concatenate([e.vectors for e in entries]).astype(np.float32)
    query_ids = np.concatenate([vector_id(i, np.arange(e.vectors.shape[0])) for i, e in enumerate(entries)])
    blocks = {i: e.blocks for i, e in enumerate(entries)}
    dim, k, threshold = indexed.shape[1], DEFAULT_SEARCH.neighbours, DEFAULT_SEARCH.threshold
    nlist = int(2 ** round(np.log2(4 * np.sqrt(indexed.shape[0]))))
    planted = {(i, j) for i in range(args.models) for j in range(i + 1, args.models) if families[i] == families[j]}
    print(f"{args.models} models, {indexed.shape[0]} indexed and {queries.shape[0]} query vectors of {dim} dims, "
          f"k = {k}, threshold {threshold}, {len(planted)} planted dependent pairs")

    def ivf(nprobe: int):  # noqa: ANN202
        index = faiss.index_factory(dim, f"IVF{nlist},Flat", faiss.METRIC_INNER_PRODUCT)
        rng = np.random.default_rng(0)
        index.train(indexed[rng.choice(indexed.shape[0], min(indexed.shape[0], 64 * nlist), replace=False)])
        index.nprobe = nprobe
        return index

    def hnsw(ef: int):  # noqa: ANN202
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = ef
        return faiss.IndexIDMap2(index)

    def faiss_search(make):  # noqa: ANN001, ANN202
        index = make()
        index.add_with_ids(indexed, indexed_ids)
        yield index
        found = []
        for start in range(0, queries.shape[0], 65_536):
            sims, ids = index.search(queries[start:start + 65_536], k)
            found.append(close_pairs(query_ids[start:start + 65_536], sims, ids, threshold))
        yield np.unique(np.concatenate(found), axis=0)

    def retrieval_index():  # noqa: ANN202
        with tempfile.TemporaryDirectory() as folder:
            keyed = {(f"m{i:06d}", "r"): e for i, e in enumerate(entries)}
            index = RetrievalIndex(folder, entries[0].input_set, search=SearchParams(kind="ivf"))
            index.sync({key: (lambda e=e: e) for key, e in keyed.items()})
            yield index.index
            yield index.search(keyed)

    kinds = {"flat": lambda: faiss_search(lambda: faiss.IndexIDMap2(faiss.IndexFlatIP(dim))),
             f"faiss ivf{nlist} nprobe {NPROBE}": lambda: faiss_search(lambda: ivf(NPROBE)),
             f"faiss ivf{nlist} nprobe 16": lambda: faiss_search(lambda: ivf(16)),
             "retrieval index (ivf)": retrieval_index, "hnsw32 ef 64": lambda: faiss_search(lambda: hnsw(64))}
    exact = None
    for name, make in kinds.items():
        started, cpu = time.perf_counter(), time.process_time()
        steps = make()
        index = next(steps)
        built, built_cpu = time.perf_counter(), time.process_time()
        pairs = next(steps)
        searched, searched_cpu = time.perf_counter(), time.process_time()
        size = faiss.serialize_index(index).nbytes
        name = f"{name} ({index.nlist} lists)" if hasattr(index, "nlist") and "retrieval" in name else name
        retrieved = {key for key, c in collisions_by_pair(pairs, blocks).items() if c.score >= MIN_SCORE}
        as_set = {tuple(p) for p in pairs.tolist()}
        exact = as_set if exact is None else exact
        print(f"{name:22s} build {built - started:6.1f} s ({built_cpu - cpu:6.1f} CPU)  query "
              f"{searched - built:6.1f} s ({searched_cpu - built_cpu:6.1f} CPU)  "
              f"index {size / 2**20:6.1f} MiB  close pairs {len(as_set):8d} (recall of exact "
              f"{len(as_set & exact) / max(len(exact), 1):.4f})  planted pairs retrieved "
              f"{len(retrieved & planted) / len(planted):.4f}, others retrieved {len(retrieved - planted)}", flush=True)


if __name__ == "__main__":
    main()
