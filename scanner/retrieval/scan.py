"""The scan's candidate step: update the indexes beside the database, store what they retrieve in
``candidate_pairs``, and hand back the pairs to test with their block maps.

A pair is a candidate when retrieval scores it (``retrieval``), when the two hold blocks joined by a chain of
retrieved pairs' block maps (``family``: siblings and cousins of a retrieved derivative, scanner.retrieval.hub),
when it shares a byte-identical weight tensor (``identical_tensor``: a join on the store's ``model_tensors``
table, run for the revisions new to the index), or when a card declares it (``declared_base``; the planner tests
declared pairs whether retrieved or not).
Every pair is stored before the index that found it is saved, so a driver killed in between repeats the query
on the next run and loses nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from scanner.errors import FingerprintError, HubtraceError, one_line
from scanner.fingerprints.store import read_fingerprint_meta_at
from scanner.retrieval.candidates import MAP_THRESHOLD
from scanner.retrieval.hub import (
    UNINFORMATIVE_TENSOR_WORDS,
    IndexedModel,
    RetrievalRun,
    family_pairs,
    index_folder,
    update_indexes,
)
from scanner.retrieval.index import SearchParams, load_or_make_entry
from scanner.retrieval.signatures import DEFAULT_PARAMS
from scanner.store import CandidateRow, Store
from scanner.store.database_identity import DatabaseIdentity

PairKey = tuple[str, str, str, str]


class ScannedModel(Protocol):
    model_id: str
    revision: str
    input_set: str
    path: str
    declared_base_models: tuple[str, ...]


@dataclass
class Retrieved:
    """The candidates of a scan and what the retrieval did, for the run summary."""

    block_maps: dict[PairKey, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    by_source: dict[str, int] = field(default_factory=dict)
    queried: int = 0
    removed: int = 0
    min_score: int = 0
    rebuilt: dict[str, str] = field(default_factory=dict)

    def to_json_dict(self) -> dict:
        return {"candidates": len(self.block_maps), "by_source": self.by_source, "queried": self.queried,
                "removed": self.removed, "min_score": self.min_score, "rebuilt": self.rebuilt}


def unreadable_entries(db_path: str | Path, models: Sequence[ScannedModel],
                       owner: DatabaseIdentity) -> dict[tuple[str, str, str], str]:
    """(model_id, revision, input_set) -> why, for each model whose retrieval entry can be neither read nor made
    from its fingerprint (a damaged or vanished fingerprint file). Every other entry is left ready on disk, so the
    index update that follows reads each in 0.1 ms; a model listed here would stop it. Any other OSError (the
    entries folder unwritable, a store that does not answer) is raised: it says nothing about one fingerprint, and
    listing every model would have the whole hub fingerprinted again. An entry written for a database other than
``owner`` is made anew from its fingerprint."""
    folder = index_folder(db_path)
    unreadable = {}
    for model in models:
        try:
            load_or_make_entry(folder, model.path, DEFAULT_PARAMS, owner)
        except (HubtraceError, FileNotFoundError) as exc:
            unreadable[(model.model_id, model.revision, model.input_set)] = one_line(exc)
    return unreadable


def retrieve_candidates(store: Store, db_path: str | Path, models: Sequence[ScannedModel], run_id: str, *,
                        min_score: int, index_kind: str = "auto",
                        map_threshold: float = MAP_THRESHOLD) -> Retrieved:
    indexed = [IndexedModel(m.model_id, m.revision, m.input_set, m.path) for m in models]

    def store_retrieved(run: RetrievalRun) -> None:
        store.put_candidate_pairs([CandidateRow(*pair.key, input_set, pair.score, pair.rank, "retrieval",
                                                pair.block_map) for input_set, pair in run.pairs], run_id)

    run = update_indexes(index_folder(db_path), indexed, min_score=min_score,
                         search=SearchParams(kind=index_kind), map_threshold=map_threshold,
                         before_save=store_retrieved, owner=store.identity())
    out = Retrieved(queried=run.queried, removed=run.removed, min_score=min_score, rebuilt=run.rebuilt)
    by_set: dict[str, list[ScannedModel]] = {}
    for model in models:
        by_set.setdefault(model.input_set, []).append(model)
    for input_set, members in by_set.items():
        current = {(m.model_id, m.revision) for m in members}
        stored = [r for r in store.current_candidate_pairs(input_set) if r.source == "retrieval"
                  and (r.model_a, r.revision_a) in current and (r.model_b, r.revision_b) in current]
        known = {r.key for r in stored}
        extra = [CandidateRow(a[0], a[1], b[0], b[1], input_set, None, None, "family")
                 for a, b in family_pairs(((r.model_a, r.revision_a), (r.model_b, r.revision_b), r.block_map)
                                          for r in stored)
                 if (*a, *b) not in known]
        known |= {r.key for r in extra}
        new = {key for key in current if key in run.added} | backfill_tensor_hashes(store, members)
        extra += [CandidateRow(a[0], a[1], b[0], b[1], input_set, None, None, "identical_tensor")
                  for a, b in store.shared_tensor_pairs(new, UNINFORMATIVE_TENSOR_WORDS)
                  if a in current and b in current and (*a, *b) not in known]
        store.put_candidate_pairs(extra, run_id)
        by_id = {m.model_id: m for m in members}
        declared = [CandidateRow(m.model_id, m.revision, base.model_id, base.revision, input_set, None, None,
                                 "declared_base")
                    for m in members for base in (by_id.get(b) for b in m.declared_base_models)
                    if base is not None and base.model_id != m.model_id]
        store.put_candidate_pairs([r for r in declared if r.key not in known], run_id)
        for row in store.current_candidate_pairs(input_set):
            if (row.model_a, row.revision_a) in current and (row.model_b, row.revision_b) in current:
                out.block_maps[row.key] = row.block_map
                out.by_source[row.source] = out.by_source.get(row.source, 0) + 1
    return out


def backfill_tensor_hashes(store: Store, models: Sequence[ScannedModel]) -> set[tuple[str, str]]:
    """Store the tensor hashes of models fingerprinted before ``model_tensors`` existed (a scan stores them with
    the model since); returns the revisions filled in. Each header is read once: a fingerprint that holds no hashes
    is recorded as such in the store and not read again."""
    known = store.revisions_with_known_tensor_hashes()
    filled = set()
    for model in models:
        key = (model.model_id, model.revision)
        if key in known:
            continue
        try:
            hashes = read_fingerprint_meta_at(model.path).tensor_hashes
        except FingerprintError:
            continue   # a damaged file fails its pair tests with a clear error; here it only has no hashes
        store.put_tensor_hashes(model.model_id, model.revision, hashes or {})
        if hashes:
            filled.add(key)
    return filled


def similar(store: Store, db_path: str | Path, model_id: str, *, limit: int = 20):  # noqa: ANN201 - polars frame
    """``hubtrace query --similar``: ``model_id``'s nearest models by collision score, from the index beside the
    database, without testing anything; each row says whether the pair was tested and its log10 p."""
    import polars as pl

    from scanner.retrieval.hub import similar_models
    from scanner.store import StoreError, queries

    fingerprints = queries.current_fingerprints(store, model_id)
    if fingerprints.is_empty():
        raise StoreError(f"no current fingerprinted revision of {model_id!r} in {db_path}")
    rows = []
    for revision, input_set, path in fingerprints.select("revision", "input_set", "path").iter_rows():
        for pair in similar_models(index_folder(db_path), IndexedModel(model_id, revision, input_set, path),
                                   limit=limit, owner=store.identity()):
            other, other_revision = ((pair.model_b, pair.revision_b) if pair.model_a == model_id
                                     else (pair.model_a, pair.revision_a))
            rows.append({"model_id": other, "revision": other_revision, "score": pair.score, "rank": pair.rank,
                         "blocks": ", ".join(f"{a}-{b}" for a, b in pair.block_map), "input_set": input_set})
    return pl.DataFrame(rows, schema={"model_id": pl.String, "revision": pl.String, "score": pl.Int64,
                                      "rank": pl.Int64, "blocks": pl.String, "input_set": pl.String})
