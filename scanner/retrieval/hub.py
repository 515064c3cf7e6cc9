"""Candidate retrieval for a scan: bring the persistent index up to the current revisions, query it with the new
ones, and turn the answers (plus families and byte-identical tensors) into the pairs worth a test.

I/O and orchestration only; the signatures, collision counts and the validity argument live in the pure modules
next to this one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from scanner.errors import RetrievalIndexError
from scanner.retrieval.candidates import MAP_THRESHOLD, CandidatePair, scored_pairs, with_wide_block_maps
from scanner.retrieval.index import DEFAULT_SEARCH, ModelKey, RetrievalIndex, SearchParams, load_or_make_entry
from scanner.retrieval.signatures import DEFAULT_PARAMS, RetrievalEntry, SignatureParams
from scanner.store.database_identity import DatabaseIdentity

MAX_FAMILY = 64
"""Most models in one connected component of retrieved blocks whose every pair becomes a candidate."""
#: Weight tensors whose byte-identity says nothing (a freshly initialised norm is all ones in every model).
UNINFORMATIVE_TENSOR_WORDS = ("norm", "bias", "rotary", "inv_freq")


@dataclass(frozen=True)
class IndexedModel:
    """A current model revision with its fingerprint file on one input set."""

    model_id: str
    revision: str
    input_set: str
    fingerprint_path: str

    @property
    def key(self) -> ModelKey:
        return (self.model_id, self.revision)


@dataclass
class RetrievalRun:
    """What one update of the indexes did: new candidate pairs, and counts for the run summary."""

    pairs: list[tuple[str, CandidatePair]] = field(default_factory=list)   # (input set, pair)
    queried: int = 0
    removed: int = 0
    added: set[ModelKey] = field(default_factory=set)                      # revisions that queried, any set
    rebuilt: dict[str, str] = field(default_factory=dict)                  # input set -> why it was rebuilt


class EntriesOnDemand(Mapping[ModelKey, RetrievalEntry]):
    """The entries of ``keys``, each loaded when it is asked for and not kept: the queries of a rebuild then hold
    one chunk of entries at a time, not every entry of the hub."""

    def __init__(self, keys: Iterable[ModelKey], load: Callable[[ModelKey], RetrievalEntry]) -> None:
        self._keys, self._load = list(keys), load
        self._known = set(self._keys)

    def __getitem__(self, key: ModelKey) -> RetrievalEntry:
        if key not in self._known:
            raise KeyError(key)
        return self._load(key)

    def __iter__(self) -> Iterator[ModelKey]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def index_folder(db_path: str | Path) -> Path:
    """``<db>.retrieval/``: beside the database, so a copy of both moves together."""
    path = Path(db_path)
    return path.with_name(path.name + ".retrieval")


def update_indexes(folder: str | Path, models: Iterable[IndexedModel], *, min_score: int,
                   params: SignatureParams = DEFAULT_PARAMS, search: SearchParams = DEFAULT_SEARCH,
                   map_threshold: float = MAP_THRESHOLD, before_save=None,
                   owner: DatabaseIdentity | None = None) -> RetrievalRun:
    """For each input set: drop superseded or vanished revisions from its index, add and query the new ones,
    return the pairs scoring at least ``min_score`` with block maps drawn down to ``map_threshold``
    (scanner.retrieval.candidates). ``before_save(run)`` is called before an index is written (the scan stores
    the pairs there first, so a crash in between only repeats the query next time). ``owner``: the database the
    folder belongs to; an index or entry written for another is rebuilt."""
    run = RetrievalRun()
    by_set: dict[str, dict[ModelKey, IndexedModel]] = {}
    for model in models:
        by_set.setdefault(model.input_set, {})[model.key] = model
    for input_set, members in sorted(by_set.items()):
        index = RetrievalIndex(folder, input_set, params, search, owner)

        def load(key: ModelKey, members: dict = members) -> RetrievalEntry:
            return load_or_make_entry(folder, members[key].fingerprint_path, params, owner)

        removed, added = index.sync({key: partial(load, key) for key in members})
        if index.rebuilt_because and index.rebuilt_because != "no index yet":
            run.rebuilt[input_set] = index.rebuilt_because
        run.removed += len(removed)
        run.queried += len(added)
        run.added |= set(added)
        selected = scored_pairs(index, EntriesOnDemand(added, load), min_score)
        run.pairs += [(input_set, pair) for pair in with_wide_block_maps(
            selected, load, threshold=search.threshold, map_threshold=map_threshold, depth_of=index.depth)]
        if before_save is not None:
            before_save(run)
        index.save()
    return run


def similar_models(folder: str | Path, model: IndexedModel, *, params: SignatureParams = DEFAULT_PARAMS,
                   limit: int = 20, owner: DatabaseIdentity | None = None) -> list[CandidatePair]:
    """The models nearest to ``model`` by collision score (any score above zero), best first; reads the index,
    never writes it (one of a database other than ``owner`` is refused)."""
    index = RetrievalIndex(folder, model.input_set, params, owner=owner)
    if index.index is None and index.rebuilt_because not in (None, "no index yet"):
        raise RetrievalIndexError(f"the retrieval index of {model.input_set} in {folder} cannot be used "
                                  f"({index.rebuilt_because}); the next scan rebuilds it")
    if model.key not in index.models:
        return []
    entry = load_or_make_entry(folder, model.fingerprint_path, params, owner)
    pairs = scored_pairs(index, {model.key: entry})
    return sorted(pairs, key=lambda p: (-p.score, p.key))[:limit]


def family_pairs(edges: Iterable[tuple[ModelKey, ModelKey, Sequence[tuple[int, int]]]],
                 max_component: int = MAX_FAMILY) -> set[tuple[ModelKey, ModelKey]]:
    """Pairs of models that hold the same weights through a chain of retrieved pairs: the closure runs over
    *blocks*, not models. Each retrieved pair (a, b, block map) joins block x of a with block y of b for every
    (x, y) its collisions map; two models become a pair when some block of one and some block of the other end
    in one connected component. A sibling or cousin of a retrieved derivative (dependent too, but perhaps too far
    drifted to collide directly) is reached through the blocks they share; a model that holds blocks of two
    families (an MLP retrained from another model, a merge across families) joins each family only through
    the blocks that came from it, so it does not chain whole families together (a model-level closure did:
    bench/bench_retrieval_recall.py, BENCHMARKS.md).

    A component of more than ``max_component`` models (its full closure would cost quadratically) adds only the
    pairs of models whose blocks meet at one block: both mapped to it, or one holding it (``_meeting_pairs``).
    Such components come from merges whose blocks mix parents of two families: the merged block is mapped to
    both parents' blocks and so joins the two families' components into one. Dropping that component's closure
    altogether lost the pairs of every model in it, the merge's pairs with its minority parent's family among
    them (BENCHMARKS.md, "Candidate retrieval"); the pairs that meet at a block keep the merge with the models
    that collide with its parents' blocks."""
    parent: dict[tuple[ModelKey, int], tuple[ModelKey, int]] = {}

    def root(x: tuple[ModelKey, int]) -> tuple[ModelKey, int]:
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = list(edges)
    for a, b, blocks in edges:
        for x, y in blocks:
            parent[root((a, x))] = root((b, y))
    components: dict[tuple[ModelKey, int], set[ModelKey]] = {}
    for node in list(parent):
        components.setdefault(root(node), set()).add(node[0])
    pairs = set()
    for models in components.values():
        if len(models) <= max_component:
            pairs |= _all_pairs(models)
    oversized = {node for node in parent if len(components[root(node)]) > max_component}
    return pairs | _meeting_pairs(edges, oversized) if oversized else pairs


def _all_pairs(models: Iterable[ModelKey]) -> set[tuple[ModelKey, ModelKey]]:
    ordered = sorted(models)
    return {(x, y) for i, x in enumerate(ordered) for y in ordered[i + 1:]}


def _meeting_pairs(edges: Sequence[tuple[ModelKey, ModelKey, Sequence[tuple[int, int]]]],
                   blocks: set[tuple[ModelKey, int]]) -> set[tuple[ModelKey, ModelKey]]:
    """Pairs of models whose blocks meet at one of ``blocks``: the models of each block and of every block it is
    mapped to, pairwise (two steps in the graph of mapped blocks). Costs the sum over blocks of their number of
    mapped blocks squared, not the square of the component."""
    met: dict[tuple[ModelKey, int], set[ModelKey]] = {}
    for a, b, mapped in edges:
        for x, y in mapped:
            if (a, x) in blocks:
                met.setdefault((a, x), {a}).add(b)
                met.setdefault((b, y), {b}).add(a)
    return set().union(*(_all_pairs(models) for models in met.values()))
