"""The Hugging Face Hub as a source: list models with their declared lineage, then fetch only what a
fingerprint reads, pinned to the listed commit.

Listing asks for the fields a scan needs in one pass (``expand``), so no per-model call is made until a model
is fetched. Fetching first reads the file list at the exact revision and refuses a repo whose only weights are
pickles before a single weight byte moves; then it downloads the config, the card, the tokenizer files and the
safetensors weights (the single file, or the index and exactly the shards it names) into a Hugging Face cache.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import TypeVar

import httpx2
from huggingface_hub import HfApi, ModelInfo, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    HFValidationError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    XetDownloadError,
)
from huggingface_hub.repocard_data import CardData
from huggingface_hub.utils import validate_repo_id

from scanner.declared.cards import (
    FROM_SCRATCH_TAG,
    HUB_RELATION_VALUES,
    card_from_metadata,
    declared_by_tags,
    kept_bases,
    kept_tags,
)
from scanner.errors import CheckpointError, UnsafeCheckpointError, one_line
from scanner.reading.checkpoint import (
    PICKLE_WEIGHT_PATTERNS,
    SHARD_INDEX,
    SINGLE_WEIGHTS,
    TOKENIZER_FILES,
    read_json_file,
)
from scanner.reading.formats.lora import ADAPTER_CONFIG, ADAPTER_PICKLE, ADAPTER_WEIGHTS, read_adapter_config
from scanner.sources.records import WHOLE_SOURCE, ModelRecord, SourceFailure, SourceFetchError
from scanner.sources.retry import RetryPolicy, call_with_retries

T = TypeVar("T")
# What a scan reads from a listing. The Hub refuses baseModels when listing (only model_info accepts it), so
# declared parents come from cardData and the base_model:… tags the Hub derives from the card.
LIST_EXPAND = ["sha", "createdAt", "lastModified", "tags", "cardData", "safetensors", "siblings"]
API_TIMEOUT_S = 60.0  # huggingface_hub sets none for model_info; a stalled server must not stall a worker
CONFIG = "config.json"
CARD = "README.md"
_FETCH_ERRORS = (HfHubHTTPError, EntryNotFoundError, httpx2.HTTPError, XetDownloadError, OSError)


def discover_hub(*, endpoint: str | None = None, token: str | None = None, author: str | None = None,
                 search: str | None = None, filter: str | None = None, limit: int | None = None
                 ) -> Iterator[ModelRecord | SourceFailure]:
    """Records for the models the Hub lists for these filters (at most ``limit``), in the Hub's order.

    A listing that fails after the client's own retries ends the iteration with one `SourceFailure` for the whole
    source; a listed model without a usable id or sha becomes a `SourceFailure` of its own.
    """
    api = HfApi(endpoint=endpoint.rstrip("/") if endpoint else None, token=token)
    models = iter(api.list_models(author=author, search=search, filter=filter, limit=limit, expand=LIST_EXPAND))
    while True:
        try:
            info = next(models)
        except StopIteration:
            return
        except (HfHubHTTPError, httpx2.HTTPError, ValueError, TypeError, KeyError) as e:
            yield SourceFailure(
                WHOLE_SOURCE, f"{api.endpoint}/api/models", f"listing models failed: {one_line(e, 300)}"
            )
            return
        yield hub_record(info, api.endpoint)


def hub_record(info: ModelInfo, endpoint: str) -> ModelRecord | SourceFailure:
    """The record for one listed model: its sha, dates, tags and the lineage its card (or the Hub) declares."""
    location = f"{endpoint}/{info.id}"
    try:
        validate_repo_id(info.id)
    except HFValidationError as e:
        return SourceFailure(str(info.id), location, f"not a valid repo id: {one_line(e, 300)}")
    if "/" not in info.id:
        return SourceFailure(info.id, location, "repo id has no organisation (expected org/name)")
    if not info.sha:
        return SourceFailure(info.id, location, "the Hub listed no commit sha for this model")
    card_data = info.card_data.to_dict() if isinstance(info.card_data, CardData) else info.card_data
    card = card_from_metadata(card_data)
    hub_tags = tuple(t for t in info.tags or () if isinstance(t, str))
    tag_bases, tag_relation = declared_by_tags(hub_tags)
    listed_bases, listed_relation = _declared_by_base_models(getattr(info, "base_models", None))
    notes = list(card.notes)
    tags = kept_tags(tuple(dict.fromkeys(hub_tags + card.tags)), notes)  # linear, however many tags repeat
    license_tags = [t.removeprefix("license:") for t in hub_tags if t.startswith("license:")]
    return ModelRecord(
        model_id=info.id,
        revision=info.sha,
        source="hub",
        location=location,
        base_models=kept_bases(card.base_model or listed_bases or tag_bases, notes),
        base_model_relation=card.base_model_relation or listed_relation or tag_relation,
        claims_from_scratch=FROM_SCRATCH_TAG in tags,
        license=card.license or (license_tags[0] if license_tags else None),
        tags=tags,
        created_at=info.created_at,
        last_modified=info.last_modified,
        notes=tuple(notes),
    )


def materialize(record: ModelRecord, cache_dir: Path, *, token: str | None = None,
                retry: RetryPolicy = RetryPolicy()) -> Path:
    """A local folder holding what fingerprints read of ``record`` at exactly ``record.revision``.

    Local and cached records are already folders and come back as they are. Hub records are fetched into the
    Hugging Face cache at ``cache_dir`` (so `discover_hf_cache(cache_dir)` sees them) and the snapshot folder is
    returned. Raises `UnsafeCheckpointError` for pickle-only repos and `CheckpointError` for repos without
    safetensors weights or config (both before any weight is downloaded), `SourceFetchError` when the Hub keeps
    failing or the revision is gone.
    """
    if record.source != "hub":
        return Path(record.location)
    endpoint = record.location.removesuffix(f"/{record.model_id}")
    if endpoint == record.location:
        raise SourceFetchError(f"{record.model_id}: location {record.location!r} is not <endpoint>/<model id>")
    api = HfApi(endpoint=endpoint, token=token)
    where = f"{record.model_id}@{record.revision[:12]}"
    info = _fetching(where, "model info", retry,
                     lambda: api.model_info(record.model_id, revision=record.revision, expand=["sha", "siblings"],
                                            timeout=API_TIMEOUT_S))
    if info.sha != record.revision:
        raise SourceFetchError(f"{where}: the Hub answered for commit {info.sha}, not the requested one")
    files = {s.rfilename for s in info.siblings or ()}

    def fetch(name: str) -> Path:
        return Path(_fetching(where, name, retry, lambda: hf_hub_download(
            record.model_id, name, revision=record.revision, cache_dir=cache_dir, endpoint=endpoint, token=token)))

    if CONFIG not in files and ADAPTER_CONFIG in files:
        return _materialize_adapter(where, files, fetch, api, cache_dir, token, retry)
    weights = _weight_plan(where, files)
    snapshot = fetch(CONFIG).parent
    for name in sorted(files & {CARD, *TOKENIZER_FILES}):
        fetch(name)
    for name in weights:
        fetch(name)
    if SHARD_INDEX in weights:
        for name in _shards(where, snapshot / SHARD_INDEX, files):
            fetch(name)
    return snapshot


def _materialize_adapter(where: str, files: set[str], fetch: Callable[[str], Path], api: HfApi, cache_dir: Path,
                         token: str | None, retry: RetryPolicy) -> Path:
    """A PEFT adapter repo (adapter_config.json, adapter_model.safetensors, card, tokenizer), and its base fetched
    into the same cache at the revision the adapter names (else the base's current one), where the fingerprint
    looks for it (`scanner.reading.formats.lora_base`). A pickle-only adapter is refused before anything is
    downloaded."""
    if ADAPTER_WEIGHTS not in files:
        if ADAPTER_PICKLE in files:
            raise UnsafeCheckpointError(f"{where}: repo has only pickle adapter weights ({ADAPTER_PICKLE}); hubtrace "
                                        "never unpickles, so nothing was downloaded")
        raise CheckpointError(f"{where}: repo has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}")
    snapshot = fetch(ADAPTER_CONFIG).parent
    spec = read_adapter_config(snapshot)  # an adapter hubtrace does not read is refused before its weights move
    for name in sorted(files & {CARD, *TOKENIZER_FILES}):
        fetch(name)
    fetch(ADAPTER_WEIGHTS)
    try:
        validate_repo_id(spec.base)
    except HFValidationError:
        return snapshot  # a local path of whoever trained it: nothing to fetch (and never followed)
    base_where = f"{spec.base} (the base of {where})"
    info = _fetching(base_where, "model info", retry, lambda: api.model_info(
        spec.base, revision=spec.base_revision, expand=["sha"], timeout=API_TIMEOUT_S))
    base = ModelRecord(model_id=spec.base, revision=str(info.sha), source="hub", location=f"{api.endpoint}/{spec.base}",
                       base_models=(), base_model_relation=None, claims_from_scratch=False, license=None, tags=(),
                       created_at=None, last_modified=None)
    materialize(base, cache_dir, token=token, retry=retry)
    return snapshot


def _weight_plan(where: str, files: set[str]) -> list[str]:
    """The single weights file, or the shard index; refuses pickle-only and weightless repos up front."""
    if CONFIG not in files:
        raise CheckpointError(f"{where}: repo has no {CONFIG}")
    if SINGLE_WEIGHTS in files:
        return [SINGLE_WEIGHTS]
    if SHARD_INDEX in files:
        return [SHARD_INDEX]
    pickles = sorted(f for f in files if "/" not in f and any(fnmatch(f, p) for p in PICKLE_WEIGHT_PATTERNS))
    if pickles:
        raise UnsafeCheckpointError(
            f"{where}: repo has only pickle weights ({', '.join(pickles)}); hubtrace never unpickles, "
            "so nothing was downloaded"
        )
    raise CheckpointError(f"{where}: repo has no {SINGLE_WEIGHTS} or {SHARD_INDEX}")


def _shards(where: str, index: Path, files: set[str]) -> list[str]:
    """The shard files a downloaded index names, each a top-level safetensors file present in the repo."""
    data = read_json_file(index)  # bounded, a regular file; a CheckpointError names the file otherwise
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: {SHARD_INDEX} is not a JSON object")
    weight_map = data.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{where}: {SHARD_INDEX} has no weight_map")
    shards = sorted({str(v) for v in weight_map.values()})
    bad = [s for s in shards if "/" in s or not s.endswith(".safetensors") or s not in files]
    if bad:
        raise CheckpointError(f"{where}: {SHARD_INDEX} names shards that are not top-level files of the repo: "
                              f"{', '.join(bad[:5])}")
    return shards


def _fetching(where: str, what: str, retry: RetryPolicy, fn: Callable[[], T]) -> T:
    """``fn()`` with retries; Hub failures that remain become `SourceFetchError` with a one-line reason."""
    try:
        return call_with_retries(fn, retry)
    except RevisionNotFoundError as e:
        raise SourceFetchError(f"{where}: revision no longer on the Hub ({what})") from e
    except RepositoryNotFoundError as e:
        raise SourceFetchError(f"{where}: repo not found or not accessible ({what})") from e
    except _FETCH_ERRORS as e:
        status = getattr(getattr(e, "response", None), "status_code", None)
        detail = f"HTTP {status}" if status else type(e).__name__
        raise SourceFetchError(f"{where}: fetching {what} failed ({detail}): {one_line(e, 300)}") from e


def _declared_by_base_models(value: object) -> tuple[tuple[str, ...], str | None]:
    """Parents and relation from model_info's ``baseModels`` ({"relation": ..., "models": [{"id": ...}]})."""
    if not isinstance(value, dict):
        return (), None
    models = value.get("models")
    ids = tuple(m["id"] for m in models if isinstance(m, dict) and isinstance(m.get("id"), str)) \
        if isinstance(models, list) else ()
    relation = value.get("relation")
    return ids, relation if isinstance(relation, str) and relation in HUB_RELATION_VALUES else None
