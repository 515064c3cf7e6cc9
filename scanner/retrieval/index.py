"""The persistent nearest-neighbour index of every current model's retrieval entry (faiss), and the entry files.

One index per canonical input set under ``<db>.retrieval/<hash of the input set>/``: ``index.faiss`` and
``manifest.json`` (the models and revisions it holds, the number each one's vector ids start from, the signature
params, the sha256 of the index file and the id of the database it belongs to). Both are replaced atomically,
index first; a manifest that does not describe the index file next to it (a driver killed between the two writes, a
file deleted or damaged) makes the next open rebuild the index from the entry files, which sit beside the
fingerprints (``*.retrieval.safetensors``) and are recomputed from a fingerprint when they are missing. Each entry
file records its database's id too: an index or entry of another database (one deleted and started again beside
the same folder) is rebuilt, never trusted (scanner.store.database_identity).

Index kind (``SearchParams.kind``, the scan's ``pairs.index``): ``auto`` builds an exact inner-product index (faiss
``IndexIDMap2`` over ``IndexFlatIP``) when a build starts with at most ``FLAT_LIMIT`` vectors and an inverted-file
index above (a faiss ``IndexIVFFlat`` whose lists hold about ``ivf_join.LIST_SIZE`` vectors, searched
``NPROBE`` lists per query by scanner.retrieval.ivf_join's two-level coarse search and list-major join, so the
work per query stays about constant as the hub grows); ``flat`` and ``ivf`` force one. Both take ids, so a
superseded revision's vectors are removed by id range. BENCHMARKS.md has the measurements behind the choice
(bench/bench_retrieval_index.py, bench/bench_retrieval_scale.py; HNSW was measured too, but faiss's HNSW cannot
remove vectors).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from scanner.errors import FingerprintError
from scanner.retrieval import ivf_join
from scanner.retrieval.collisions import ROW_BITS, close_pairs, cross_model_pairs, unique_id_pairs, vector_id
from scanner.retrieval.signatures import DEFAULT_PARAMS, RetrievalEntry, SignatureParams
from scanner.store.database_identity import DatabaseIdentity

FLAT_LIMIT = 16_384
"""A build with more indexed vectors than this makes an IVF (``kind="auto"``): at 49,664 vectors an IVF answered
5-10x faster than exact search and found all of its candidate pairs (bench/bench_retrieval_index.py)."""
NPROBE = 4
"""Lists probed per query signature: 83.5% of the close signature pairs an exhaustive search finds (16 probes: 91.4%)
at half the cost, and every planted pair still found at 1,000-10,000 models (bench/bench_ivf_probes.py)."""
RETRAIN_GROWTH = 4
"""How far an index may outgrow what it was built for before a sync trains a new one on everything it holds."""
ENTRY_SUFFIX = ".retrieval.safetensors"
SEARCH_CHUNK = 1 << 19
"""Query rows per exact search; an IVF takes ``ivf_join.query_chunk`` rows at a time."""
ADD_CHUNK = 1 << 18
"""Vectors added at once: a rebuild never holds a float32 copy of the whole hub besides the index's own."""

ModelKey = tuple[str, str]   # (model_id, revision)
INDEX_KINDS = ("auto", "flat", "ivf")


@dataclass(frozen=True)
class SearchParams:
    """How hits are found: ``neighbours`` per signature, counted when cosine >= ``threshold``."""

    neighbours: int = 32
    threshold: float = 0.6
    kind: str = "auto"     # the index a (re)build makes: "flat" (exact), "ivf", or "auto" (flat up to FLAT_LIMIT)

    def __post_init__(self) -> None:
        if self.kind not in INDEX_KINDS:
            raise ValueError(f"retrieval index kind must be one of {', '.join(INDEX_KINDS)}, not {self.kind!r}")


DEFAULT_SEARCH = SearchParams()


def entry_path(folder: str | Path, fingerprint_address: str | Path) -> Path:
    """Where the retrieval entry of the fingerprint at ``fingerprint_address`` (a local path or a store URL) is
    kept: in the index folder beside the database, so a remote fingerprint store needs no extra files."""
    digest = hashlib.sha256(str(fingerprint_address).encode()).hexdigest()[:32]
    return Path(folder) / "entries" / f"{digest}{ENTRY_SUFFIX}"


def write_entry(entry: RetrievalEntry, path: str | Path) -> None:
    """Atomically write an entry (float16 vectors: the index compares them at far coarser resolution)."""
    meta = {"params": json.dumps(entry.params.to_json_dict()), "input_set": entry.input_set,
            "n_layers": str(entry.n_layers)}
    if entry.database_id is not None:
        meta["database_id"] = entry.database_id
    tensors = {"vectors": entry.vectors.astype(np.float16), "blocks": entry.blocks.astype(np.int32),
               "indexed": entry.indexed.astype(np.uint8)}
    _atomic(Path(path), lambda tmp: save_file(tensors, tmp, metadata=meta))


def read_entry(path: str | Path) -> RetrievalEntry:
    """An entry as its file stores it, float16 vectors: a rebuild holds every entry of the hub at once, and the
    products that use them (index adds, queries, block maps) convert a chunk at a time."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
        tensors = load_file(str(path))
        params = SignatureParams.from_json_dict(json.loads(meta["params"]))
        return RetrievalEntry(tensors["vectors"], tensors["blocks"], tensors["indexed"].astype(bool),
                              int(meta["n_layers"]), meta["input_set"], params, meta.get("database_id"))
    except (OSError, SafetensorError, KeyError, TypeError, ValueError) as exc:
        raise FingerprintError(f"{path}: not a readable retrieval entry: {exc}") from exc


def load_or_make_entry(folder: str | Path, fingerprint_address: str | Path, params: SignatureParams,
                       owner: DatabaseIdentity | None = None) -> RetrievalEntry:
    """The entry of a fingerprint kept in ``folder``; computed from the fingerprint (read from wherever the
    fingerprint store keeps it) and written when missing, damaged, made with other params or, given the ``owner``
    database, written for another one. Either way it is returned as the file holds it (``read_entry``), so a first
    scan and a rebuild from the files compare the same float16 vectors and retrieve the same pairs."""
    from scanner.fingerprints.store import read_fingerprint_at
    from scanner.retrieval.signatures import retrieval_entry

    path = entry_path(folder, fingerprint_address)
    if path.is_file():
        try:
            entry = read_entry(path)
            if entry.params == params and (owner is None or owner.owns(entry.database_id)):
                return entry
        except FingerprintError:
            pass
    entry = replace(retrieval_entry(read_fingerprint_at(fingerprint_address), params),
                    database_id=None if owner is None else owner.database_id)
    write_entry(entry, path)
    return replace(entry, vectors=entry.vectors.astype(np.float16))


class RetrievalIndex:
    """The index of one input set's current models. ``sync`` brings it to a set of models; ``search`` finds the
    close signature pairs of some of them against everything held."""

    def __init__(self, folder: str | Path, input_set: str, params: SignatureParams = DEFAULT_PARAMS,
                 search: SearchParams = DEFAULT_SEARCH, owner: DatabaseIdentity | None = None) -> None:
        """``owner``: the database the index belongs to; an index on disk written for another is not loaded."""
        import faiss

        self.folder = Path(folder) / hashlib.sha256(input_set.encode()).hexdigest()[:16]
        self.input_set, self.params, self.search_params, self.owner = input_set, params, search, owner
        self._faiss = faiss
        self.models: dict[ModelKey, dict] = {}       # key -> {"number", "rows", "n_layers"}
        self.blocks: dict[int, np.ndarray] = {}      # model number -> block of each row
        self.next_number = 0
        self.index = None
        self._tree = None   # ivf_join.centroid_tree of an IVF's centroids, made on first use
        self.rebuilt_because: str | None = None
        self._load()

    # persistence ----------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return 2 * self.params.dim

    def _load(self) -> None:
        manifest, index_file = self.folder / "manifest.json", self.folder / "index.faiss"
        if not manifest.is_file() or not index_file.is_file():
            self.rebuilt_because = "no index yet" if not manifest.exists() else "index file missing"
            return
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            if data.get("params") != self.params.to_json_dict() or data.get("input_set") != self.input_set:
                self.rebuilt_because = "signature params or input set changed"
                return
            if self.owner is not None and not self.owner.owns(data.get("database_id")):
                self.rebuilt_because = f"index {self.owner.stranger(data.get('database_id'))}"
                return
            if data.get("index_sha256") != _sha256(index_file):
                self.rebuilt_because = "index file does not match its manifest"
                return
            index = self._faiss.read_index(str(index_file))
            unusable = self._unusable(index)
            if unusable:
                self.rebuilt_because = unusable
                return
            models = {(m["model_id"], m["revision"]): m for m in data["models"]}
            if index.ntotal != sum(m["rows"] for m in models.values()):
                self.rebuilt_because = "index holds another number of vectors than its manifest says"
                return
            self.blocks = {int(k): np.asarray(v, dtype=np.int32) for k, v in data["blocks"].items()}
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            self.rebuilt_because = f"unreadable index or manifest ({' '.join(str(exc).split())[:200]})"
            return
        self.index, self.models, self.next_number = index, models, int(data["next_number"])

    def _unusable(self, index) -> str | None:  # noqa: ANN001 - a faiss index
        """Why an index read from disk cannot serve these signatures (None when it can): another dimension, or a
        kind this module never writes (an ID map over an inner-product flat index, or an inner-product IVF)."""
        faiss = self._faiss
        if index.d != self.dim:
            return f"index of dimension {index.d}, the signatures have {self.dim}"
        if not isinstance(index, faiss.IndexIDMap2 | faiss.IndexIVFFlat) or \
                index.metric_type != faiss.METRIC_INNER_PRODUCT:
            return f"index of kind {type(index).__name__} (metric {index.metric_type}), not one hubtrace writes"
        return None

    def save(self) -> None:
        """Index first, then the manifest naming its sha256: a crash in between leaves a mismatch, never a lie."""
        self.folder.mkdir(parents=True, exist_ok=True)
        index_file = self.folder / "index.faiss"
        _atomic(index_file, lambda tmp: self._faiss.write_index(self._index(), tmp))
        manifest = {
            "input_set": self.input_set, "params": self.params.to_json_dict(), "kind": self.kind,
            "database_id": None if self.owner is None else self.owner.database_id,
            "next_number": self.next_number, "index_sha256": _sha256(index_file),
            "models": sorted(self.models.values(), key=lambda m: m["number"]),
            "blocks": {str(n): b.tolist() for n, b in self.blocks.items()},
        }
        _atomic(self.folder / "manifest.json",
                lambda tmp: Path(tmp).write_text(json.dumps(manifest), encoding="utf-8"))

    # contents -------------------------------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        return "flat" if self.index is None or not hasattr(self.index, "nprobe") else f"ivf{self.index.nlist}"

    @property
    def ntotal(self) -> int:
        return 0 if self.index is None else int(self.index.ntotal)

    def _index(self):  # noqa: ANN202 - a faiss index
        if self.index is None:
            self.index = self._faiss.IndexIDMap2(self._faiss.IndexFlatIP(self.dim))
        return self.index

    def sync(self, current: Mapping[ModelKey, Callable[[], RetrievalEntry]]) -> tuple[list[ModelKey], list[ModelKey]]:
        """Hold exactly the ``current`` models: remove the others (superseded revisions, models gone), add the
        missing ones (each value loads its entry). A rebuild (no valid index on disk) adds everything at once,
        as an IVF when that is more than FLAT_LIMIT vectors; so does a sync that would leave the index outgrown
        (``_outgrown``: it then adds every held model again too). Returns (removed, added): added are the models
        new to the index, the ones to query.

        Entries are loaded when needed and not kept: each is loaded once to be checked and counted, once more to
        be added, and once more when an IVF is trained on a sample, so a rebuild holds the index and one chunk of
        vectors, never every entry of the hub."""
        removed = [key for key in self.models if key not in current]
        for key in removed:
            number = self.models.pop(key)["number"]
            self.blocks.pop(number, None)
            self._index().remove_ids(self._faiss.IDSelectorRange(int(vector_id(number, 0)),
                                                                 int(vector_id(number + 1, 0))))
        added = [key for key in sorted(current) if key not in self.models]
        new_vectors = sum(self._indexed_count(key, current[key]()) for key in added)
        keys = added
        if self._outgrown(self.ntotal + new_vectors):
            self.rebuilt_because = (f"the hub outgrew its {self.kind} index ({self.ntotal + new_vectors} vectors): "
                                    "trained anew on all of them")
            keys = sorted(self.models) + added
            new_vectors += self.ntotal
            self.index, self._tree, self.models, self.blocks = None, None, {}, {}
        kind = self.search_params.kind
        if self.index is None and new_vectors and (kind == "ivf" or (kind == "auto" and new_vectors > FLAT_LIMIT)):
            self.index = self._trained_ivf(keys, current, new_vectors)
        vectors, ids, pending = [], [], 0
        for position, key in enumerate(keys):
            entry = current[key]()
            number = self.next_number
            self.next_number += 1
            rows = np.flatnonzero(entry.indexed)
            vectors.append(entry.vectors[rows])
            ids.append(vector_id(number, rows))
            self.models[key] = {"model_id": key[0], "revision": key[1], "number": number,
                                "rows": int(rows.size), "n_layers": entry.n_layers}
            self.blocks[number] = entry.blocks.astype(np.int32)
            pending += rows.size
            if pending >= ADD_CHUNK or position == len(keys) - 1:
                self._add(np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32), np.concatenate(ids))
                vectors, ids, pending = [], [], 0
        return removed, added

    def _indexed_count(self, key: ModelKey, entry: RetrievalEntry) -> int:
        """The vectors ``entry`` puts into the index, once it is checked to belong here."""
        if entry.input_set != self.input_set or entry.params != self.params:
            raise ValueError(f"a retrieval entry of {entry.input_set} cannot join the index of {self.input_set}")
        if entry.vectors.shape[0] >= 1 << ROW_BITS:
            raise ValueError(f"{key[0]}: a retrieval entry holds at most {1 << ROW_BITS} vectors")
        return int(entry.indexed.sum())

    def _outgrown(self, vectors: int) -> bool:
        """Whether holding ``vectors`` needs a new index: an IVF's lists, trained for ~LIST_SIZE vectors each, would
        hold RETRAIN_GROWTH times that (every query would scan that much more), or an ``auto`` index that started
        exact would hold RETRAIN_GROWTH x FLAT_LIMIT vectors (exact search grows like N per query)."""
        if self.index is None:
            return False
        if hasattr(self.index, "nprobe"):
            return vectors > RETRAIN_GROWTH * ivf_join.LIST_SIZE * self.index.nlist
        return self.search_params.kind == "auto" and vectors > RETRAIN_GROWTH * FLAT_LIMIT

    def _trained_ivf(self, keys: list[ModelKey], current: Mapping[ModelKey, Callable[[], RetrievalEntry]],
                     total: int):  # noqa: ANN202 - a faiss index
        """An empty IVF whose list centroids are trained on a random sample of the ``total`` indexed vectors of
        the ``keys`` models, gathered one entry at a time (``_sample_rows``)."""
        nlist = min(ivf_join.list_count(total), total)
        positions = np.random.default_rng(0).choice(total, min(total, 64 * nlist), replace=False)
        leaves = ivf_join.train_leaves(_sample_rows((current[key]() for key in keys), positions), nlist)
        quantizer = self._faiss.IndexFlatIP(self.dim)
        quantizer.add(leaves)
        index = self._faiss.IndexIVFFlat(quantizer, self.dim, leaves.shape[0], self._faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True
        index.nprobe = NPROBE
        return index

    def _centroid_tree(self):  # noqa: ANN202 - a faiss index over the list centroids
        if self._tree is None:
            quantizer = self.index.quantizer
            self._tree = ivf_join.centroid_tree(quantizer.reconstruct_n(0, quantizer.ntotal))
        return self._tree

    def _add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Add to the index; into an IVF's lists by the same two-level coarse search the queries use."""
        index = self._index()
        if not hasattr(index, "nprobe"):
            index.add_with_ids(vectors, ids)
            return
        lists = np.ascontiguousarray(ivf_join.probe(self._centroid_tree(), vectors, 1)[:, 0])
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        index.add_core(vectors.shape[0], self._faiss.swig_ptr(vectors), self._faiss.swig_ptr(ids),
                       self._faiss.swig_ptr(lists))

    def number_of(self, key: ModelKey) -> int:
        return int(self.models[key]["number"])

    def depth(self, key: ModelKey) -> int:
        """How many blocks a held model's entry has signatures in, without loading the entry."""
        return int(np.unique(self.blocks[self.number_of(key)]).size)

    def key_of(self) -> dict[int, ModelKey]:
        return {m["number"]: key for key, m in self.models.items()}

    # search ---------------------------------------------------------------------------------------------------
    def search(self, entries: Mapping[ModelKey, RetrievalEntry]) -> np.ndarray:
        """Close signature pairs (id, id) of the given held models' query signatures against everything held."""
        k = min(self.search_params.neighbours, max(self.ntotal, 1))
        threshold = self.search_params.threshold
        found = [np.zeros((0, 2), dtype=np.int64)]
        ivf = hasattr(self._index(), "nprobe")
        for queries, ids in self._query_chunks(entries, ivf_join.query_chunk(self.index.nlist, NPROBE) if ivf
                                               else SEARCH_CHUNK):
            if ivf:
                found += [cross_model_pairs(ids[rows], neighbours) for rows, neighbours in
                          ivf_join.close_hits(self.index, self._centroid_tree(), queries, NPROBE,
                                              k, threshold)]
            else:
                similarities, neighbours = self.index.search(queries, k)
                found.append(close_pairs(ids, similarities, neighbours, threshold))
        return unique_id_pairs(np.concatenate(found))

    def _query_chunks(self, entries: Mapping[ModelKey, RetrievalEntry],
                      chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(float32 query signatures, their ids) of the entries, whole entries up to ``chunk`` rows at a time (one
        piece for ivf_join): a hub's queries never sit in memory twice."""
        queries, ids, rows = [], [], 0
        for key, entry in entries.items():
            if rows and rows + entry.vectors.shape[0] > chunk:
                yield np.concatenate(queries).astype(np.float32), np.concatenate(ids)
                queries, ids, rows = [], [], 0
            queries.append(entry.vectors)
            ids.append(vector_id(self.number_of(key), np.arange(entry.vectors.shape[0])))
            rows += entry.vectors.shape[0]
        if rows:
            yield np.concatenate(queries).astype(np.float32), np.concatenate(ids)


def _sample_rows(entries: Iterable[RetrievalEntry], positions: np.ndarray) -> np.ndarray:
    """Rows ``positions`` (distinct, in that order) of the entries' indexed vectors stacked, taken as the entries
    stream past: the same rows as indexing the whole stack, without ever holding it."""
    wanted = np.sort(positions)
    parts, start = [], 0
    for entry in entries:
        rows = entry.vectors[entry.indexed]
        low, high = np.searchsorted(wanted, [start, start + rows.shape[0]])
        parts.append(rows[wanted[low:high] - start])
        start += rows.shape[0]
    return np.concatenate(parts)[np.searchsorted(wanted, positions)]


def _sha256(file: Path) -> str:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(8 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic(target: Path, write: Callable[[str], object]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    try:
        write(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
