"""Models already in a local Hugging Face cache (``HF_HUB_CACHE``, or any ``cache_dir`` that
``hf_hub_download`` / `scanner.sources.materialize` filled), read with huggingface_hub's own cache scanner.

A cached repo can hold several snapshots; the scan wants the one a user would load, so each repo yields the
snapshot that ``refs/main`` points to, or else the most recently written one. Snapshots without a config or
weights (a tokenizer fetched on its own, say) are not models and are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from fnmatch import fnmatch
from pathlib import Path

from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound
from huggingface_hub.utils import CachedRepoInfo, CachedRevisionInfo

from scanner.declared.cards import adapter_card, read_card
from scanner.declared.merge_config import read_merge_config
from scanner.reading.checkpoint import PICKLE_WEIGHT_PATTERNS
from scanner.reading.formats.lora import ADAPTER_CONFIG
from scanner.reading.formats.lora_base import adapter_base
from scanner.sources.records import WHOLE_SOURCE, ModelRecord, SourceFailure, record_from_card

_MODEL_FILE_PATTERNS = ("config.json", ADAPTER_CONFIG, "*.safetensors", "*.safetensors.index.json",
                        *PICKLE_WEIGHT_PATTERNS)
_REPO_FOLDER = re.compile(r"models--([^/\\'\"\s]+?)--([^/\\'\"\s]+)")


def discover_hf_cache(cache_dir: Path | None = None) -> Iterator[ModelRecord | SourceFailure]:
    """One record per cached model repo (revision = the snapshot's commit hash, location = its folder)."""
    try:
        info = scan_cache_dir(cache_dir)
    except (CacheNotFound, OSError) as e:
        yield SourceFailure(WHOLE_SOURCE, str(cache_dir or "HF_HUB_CACHE"), f"Hugging Face cache unreadable: {e}")
        return
    for warning in info.warnings:
        match = _REPO_FOLDER.search(str(warning))
        model_id = f"{match.group(1)}/{match.group(2)}" if match else WHOLE_SOURCE
        yield SourceFailure(model_id, str(info.cache_dir or cache_dir), f"corrupted cache entry: {warning}")
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        revision = _chosen_revision(repo)
        if revision is None:
            continue
        card = read_card(revision.snapshot_path)
        base = adapter_base(revision.snapshot_path)
        yield record_from_card(
            repo.repo_id,
            revision.commit_hash,
            "hf_cache",
            str(revision.snapshot_path),
            card if base is None else adapter_card(card, base.model_id),
            last_modified=datetime.fromtimestamp(revision.last_modified, tz=UTC),
            merge=read_merge_config(revision.snapshot_path),
        )


def _chosen_revision(repo: CachedRepoInfo) -> CachedRevisionInfo | None:
    models = [r for r in repo.revisions if any(_is_model_file(f.file_name) for f in r.files)]
    if not models:
        return None
    return max(models, key=lambda r: ("main" in r.refs, r.last_modified, r.commit_hash))


def _is_model_file(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in _MODEL_FILE_PATTERNS)
