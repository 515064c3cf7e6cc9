"""The list-major IVF join (scanner.retrieval.ivf_join) against exact search, and the retrieval index built on it."""

from __future__ import annotations

import dataclasses

import faiss
import numpy as np

from scanner.retrieval import ivf_join
from scanner.retrieval.collisions import vector_id
from scanner.retrieval.index import RetrievalIndex, SearchParams
from scanner.retrieval.signatures import RetrievalEntry, SignatureParams


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _clustered(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    """Unit vectors around 40 centres, so that lists differ and close pairs exist."""
    centres = _unit(rng.standard_normal((40, dim)))
    return _unit(centres[rng.integers(0, 40, n)] + 0.35 * rng.standard_normal((n, dim)).astype(np.float32))


def _ivf(points: np.ndarray, nlist: int) -> tuple[faiss.IndexIVFFlat, faiss.IndexIVFFlat]:
    leaves = ivf_join.train_leaves(points, nlist)
    quantizer = faiss.IndexFlatIP(points.shape[1])
    quantizer.add(leaves)
    index = faiss.IndexIVFFlat(quantizer, points.shape[1], leaves.shape[0], faiss.METRIC_INNER_PRODUCT)
    index.is_trained = True
    tree = ivf_join.centroid_tree(leaves)
    lists = np.ascontiguousarray(ivf_join.probe(tree, points, 1)[:, 0])
    ids = np.arange(points.shape[0], dtype=np.int64) + 1000
    index.add_core(points.shape[0], faiss.swig_ptr(points), faiss.swig_ptr(ids), faiss.swig_ptr(lists))
    return index, tree


def test_probing_every_list_gives_exactly_the_exhaustive_top_k_above_the_threshold(monkeypatch) -> None:
    monkeypatch.setattr(ivf_join, "LEAVES_PER_GROUP", 8)   # 4 groups of the 32 leaves, all probed
    monkeypatch.setattr(ivf_join, "QUERY_CHUNK", 64)       # and the 700 queries joined 64 at a time
    monkeypatch.setattr(ivf_join, "QUERIES_PER_LIST", 1)
    rng = np.random.default_rng(0)
    points, queries = _clustered(rng, 3000), _clustered(rng, 700)
    index, tree = _ivf(points, 32)
    assert index.ntotal == 3000 and tree.nlist > 1
    everything = index.nlist
    got = set()
    for rows, ids in ivf_join.close_hits(index, tree, queries, everything, 5, 0.7):
        got |= set(zip(rows.tolist(), ids.tolist()))
    sims = queries @ points.T
    want, clear_rows = set(), set()
    for row in range(queries.shape[0]):
        ranked = np.sort(sims[row])[::-1]
        # a row is compared only where no rounding can decide: its 5th and 6th best and its hits near 0.7 apart
        if ranked[4] - ranked[5] > 1e-4 and not (np.abs(ranked[:5] - 0.7) < 1e-4).any():
            clear_rows.add(row)
            best = np.argsort(-sims[row])[:5]
            want |= {(row, int(j) + 1000) for j in best if sims[row, j] >= 0.7}
    assert len(clear_rows) > 600 and len(want) > 500, "the data must have close pairs for this test to mean anything"
    assert {hit for hit in got if hit[0] in clear_rows} == want


def test_few_probes_find_most_close_pairs_and_nothing_below_the_threshold() -> None:
    rng = np.random.default_rng(1)
    points, queries = _clustered(rng, 4000), _clustered(rng, 500)
    index, tree = _ivf(points, 64)
    hits = [(rows, ids) for rows, ids in ivf_join.close_hits(index, tree, queries, 8, 10_000, 0.8)]
    rows, ids = np.concatenate([h[0] for h in hits]), np.concatenate([h[1] for h in hits])
    sims = np.einsum("ij,ij->i", queries[rows], points[ids - 1000])
    assert (sims >= 0.8 - 1e-6).all()
    exact = int((queries @ points.T >= 0.8).sum())
    assert rows.size >= 0.8 * exact   # 8 of ~64 lists probed; typically 0.95-1.0 here (fixed seed)


def test_the_probed_list_of_a_leaf_centroid_is_its_own(monkeypatch) -> None:
    monkeypatch.setattr(ivf_join, "LEAVES_PER_GROUP", 8)
    rng = np.random.default_rng(2)
    leaves = ivf_join.train_leaves(_clustered(rng, 2000), 50)
    tree = ivf_join.centroid_tree(leaves)
    grouped = [faiss.rev_swig_ptr(tree.invlists.get_ids(g), tree.invlists.list_size(g)).copy()
               for g in range(tree.nlist)]
    assert tree.nlist > 1 and sorted(np.concatenate(grouped).tolist()) == list(range(leaves.shape[0]))
    assert (ivf_join.probe(tree, leaves, 1)[:, 0] == np.arange(leaves.shape[0])).all()


def _entry(vectors: np.ndarray, params: SignatureParams) -> RetrievalEntry:
    blocks = np.zeros(vectors.shape[0], dtype=np.int32)
    return RetrievalEntry(vectors, blocks, np.ones(vectors.shape[0], bool), 1, "set", params)


def test_an_ivf_retrieval_index_survives_removal_and_reload_with_the_same_answers(tmp_path) -> None:
    params = SignatureParams(dim=8)
    rng = np.random.default_rng(3)
    base = _clustered(rng, 400, dim=16)
    entries = {(f"m{i}", "r"): _entry(_unit(base + 0.05 * rng.standard_normal(base.shape)), params)
               for i in range(3)}
    entries[("lone", "r")] = _entry(_clustered(rng, 400, dim=16), params)
    index = RetrievalIndex(tmp_path, "set", params, SearchParams(kind="ivf"))
    index.sync({key: (lambda e=e: e) for key, e in entries.items()})
    assert index.kind.startswith("ivf")
    before = index.search(entries)
    pairs_of = {tuple(sorted((int(a), int(b)))) for a, b in (before >> 24).tolist()}
    assert {(0, 1), (0, 2), (1, 2)} <= pairs_of
    index.save()
    reloaded = RetrievalIndex(tmp_path, "set", params, SearchParams(kind="ivf"))
    assert reloaded.rebuilt_because is None
    np.testing.assert_array_equal(reloaded.search(entries), before)
    gone = ("m1", "r")
    reloaded.sync({key: (lambda e=e: e) for key, e in entries.items() if key != gone})
    remaining = {k: e for k, e in entries.items() if k != gone}
    after = reloaded.search(remaining)
    number = index.number_of(gone)
    assert not ((after >> 24) == number).any()
    assert reloaded.ntotal == 3 * 400
    assert vector_id(number, 0) not in set(after.ravel().tolist())


def test_an_index_the_hub_outgrew_is_trained_anew_and_only_new_models_are_returned(tmp_path, monkeypatch) -> None:
    from scanner.retrieval import index as index_module

    monkeypatch.setattr(index_module, "FLAT_LIMIT", 1000)   # auto: exact up to 1,000 vectors, rebuilt past 4,000
    params = SignatureParams(dim=8)
    rng = np.random.default_rng(4)
    base = _clustered(rng, 400, dim=16)
    family = {(f"fam{i}", "r"): _entry(_unit(base + 0.05 * rng.standard_normal(base.shape)), params) for i in range(2)}
    strangers = {(f"s{i:02d}", "r"): _entry(_clustered(rng, 400, dim=16), params) for i in range(12)}
    index = RetrievalIndex(tmp_path, "set", params, SearchParams(kind="auto"))
    index.sync({key: (lambda e=e: e) for key, e in family.items()})
    assert index.kind == "flat" and index.ntotal == 800

    grown = {**family, **dict(list(strangers.items())[:2])}   # 1,600 vectors: still within 4 x 1,000
    assert index.sync({key: (lambda e=e: e) for key, e in grown.items()})[1] == sorted(grown)[2:]
    assert index.kind == "flat" and index.rebuilt_because is not None and "outgrew" not in index.rebuilt_because

    grown = {**family, **strangers}                           # 5,600 vectors: an IVF, trained on all of them
    removed, added = index.sync({key: (lambda e=e: e) for key, e in grown.items()})
    assert removed == [] and added == sorted(strangers)[2:]
    assert index.kind.startswith("ivf") and "outgrew its flat index" in index.rebuilt_because
    assert index.ntotal == 5600 and set(index.models) == set(grown)
    nlist = index.index.nlist
    pairs = {tuple(sorted((int(a), int(b)))) for a, b in (index.search(family) >> 24).tolist()}
    assert (index.number_of(("fam0", "r")), index.number_of(("fam1", "r"))) in pairs

    beyond = 4 * nlist * ivf_join.LIST_SIZE // 400              # the IVF's lists would hold 4 x their trained size
    many = {(f"t{i:03d}", "r"): _entry(_clustered(rng, 400, dim=16), params) for i in range(beyond)}
    index.sync({key: (lambda e=e: e) for key, e in {**grown, **many}.items()})
    assert "outgrew its ivf" in index.rebuilt_because and index.index.nlist > nlist
    assert index.ntotal == 400 * (len(grown) + len(many))


def test_a_training_sample_streamed_from_the_entries_equals_one_taken_from_their_stack(tmp_path) -> None:
    """A rebuild trains an IVF on a sample of every indexed vector, gathered one entry at a time so that the
    hub's entries are never all held: the rows, and their order (k-means starts from it), must be those of
    indexing the stacked vectors, and the index then holds every model and reports each one's depth."""
    from scanner.retrieval.index import _sample_rows

    params = SignatureParams(dim=8)
    rng = np.random.default_rng(7)
    entries = []
    for rows in (40, 1, 0, 75, 33):
        entry = _entry(_clustered(rng, max(rows, 1), dim=16), params)
        indexed = np.zeros(entry.indexed.shape, bool)
        indexed[rng.permutation(indexed.size)[:rows]] = True
        entries.append(dataclasses.replace(entry, indexed=indexed, blocks=np.arange(indexed.size, dtype=np.int32) % 3))
    stacked = np.concatenate([e.vectors[e.indexed] for e in entries])
    positions = rng.choice(stacked.shape[0], 100, replace=False)
    np.testing.assert_array_equal(_sample_rows(iter(entries), positions), stacked[positions])

    loads = []
    current = {(f"m{i}", "r"): (lambda i=i, e=e: loads.append(i) or e) for i, e in enumerate(entries)}
    index = RetrievalIndex(tmp_path, "set", params, SearchParams(kind="ivf"))
    index.sync(current)
    assert index.ntotal == stacked.shape[0] and set(index.models) == set(current)
    assert max(loads.count(i) for i in range(len(entries))) == 3    # checked, sampled, added; never kept
    assert index.depth(("m3", "r")) == 3 and index.depth(("m1", "r")) == 1
