"""Where a LoRA adapter's base model is: the scanned hub, the Hugging Face cache, or a local folder.

adapter_config.json names the base as PEFT was given it: a Hub id (``org/name``) or a local path. hubtrace looks,
in order, in the hub folder the adapter itself sits in (``<root>/<org>/<name>/``, a local scan's layout), in
Hugging Face caches (the one a cached or downloaded adapter lives in, then ``HF_HUB_CACHE``), and, for an adapter
that is a folder of the user's own (not a cached download, whose config came from a stranger), at the path it names
when that path lies inside the hub root. A path that leads out of the hub (``../../../outside/secret``,
``/home/someone/model``) is never looked at, so the refusal is the same whether or not something is there; the
operator lets an adapter of their own name a folder elsewhere with the option that lets links lead out
(``--follow-links``, ``follow_links: true``). Nothing is downloaded here (a Hub scan fetches an adapter's base with
the adapter: `scanner.sources.hub`). A base found nowhere is one `MissingBaseError` naming it and every place
looked at.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import scan_cache_dir, try_to_load_from_cache
from huggingface_hub.errors import CacheNotFound, HFValidationError
from huggingface_hub.utils import validate_repo_id

from scanner.errors import CheckpointError, MissingBaseError
from scanner.files import PathRefused, resolve_inside
from scanner.reading.formats.lora import LoraSpec, is_adapter_folder, read_adapter_config

_SNAPSHOTS = "snapshots"
_REPO_FOLDER_PREFIX = "models--"


@dataclass(frozen=True)
class BaseLocator:
    """Where an adapter's base is looked for: hub roots (``<root>/<org>/<name>``), Hugging Face caches (None: the
    default ``HF_HUB_CACHE``), whether a base named by a local path is followed (inside a hub root), and whether such
    a path may also lead out of every hub root (the operator's choice, never a default)."""

    hub_roots: tuple[Path, ...] = ()
    hf_caches: tuple[Path | None, ...] = (None,)
    local_paths: bool = True
    outside_paths: bool = False

    @classmethod
    def around(cls, adapter_folder: Path, *, outside_paths: bool = False) -> BaseLocator:
        """Where to look for the base of the adapter in this folder: a cache snapshot's own cache (then the default
        one), no local paths; a plain folder's hub root (``<root>/<org>/<name>`` puts it two levels up), the
        default cache and local paths inside that root (anywhere with ``outside_paths``)."""
        cache = snapshot_cache(adapter_folder)
        if cache is not None:
            return cls(hf_caches=(cache, None), local_paths=False)
        return cls(hub_roots=(adapter_folder.parent.parent,), outside_paths=outside_paths)


def snapshot_cache(folder: Path) -> Path | None:
    """The Hugging Face cache a snapshot folder (``<cache>/models--org--name/snapshots/<rev>``) belongs to, or None."""
    if folder.parent.name == _SNAPSHOTS and folder.parent.parent.name.startswith(_REPO_FOLDER_PREFIX):
        return folder.parent.parent.parent
    return None


def locate_base(adapter_folder: Path, spec: LoraSpec, locator: BaseLocator) -> Path:
    """The base model's folder; MissingBaseError naming the base and where it was looked for (a path outside the
    hub is not looked at, and the error says so without saying whether anything is there)."""
    looked: list[str] = []
    if _is_repo_id(spec.base):
        for root in locator.hub_roots:
            found = _inside(root, root / spec.base)
            looked.append(str(root / spec.base))
            if found is not None:
                return found
        for cache in locator.hf_caches:
            found = _cached_snapshot(spec.base, spec.base_revision, cache)
            looked.append(f"the Hugging Face cache {cache or '(HF_HUB_CACHE)'}"
                          + (f" at revision {spec.base_revision}" if spec.base_revision else ""))
            if found is not None:
                return found
    outside = False
    if locator.local_paths:
        try:
            path = Path(spec.base).expanduser()
        except RuntimeError:  # ~user of a user this machine does not have
            path = Path(spec.base)
        candidate = path if path.is_absolute() else adapter_folder / path
        root = next((r for r in locator.hub_roots if _lexically_inside(candidate, r)), None)
        if root is not None or locator.outside_paths:
            looked.append(_shown(str(candidate)))
            found = _inside(root, candidate) if root is not None else _folder(candidate)
            if found is not None:
                return found
        else:
            outside = True
    name = _shown(spec.base)
    if outside:
        raise MissingBaseError(
            f"{adapter_folder}: a LoRA adapter of {name!r}, a path outside the scanned hub "
            f"({', '.join(map(str, locator.hub_roots))}); hubtrace reads an adapter's base only from inside the hub, "
            "the Hugging Face cache or the Hub by id, and never looks outside unless asked (--follow-links, or "
            "follow_links: true on a local source, for adapters of your own)")
    where = "; ".join(looked) or "nowhere: a path named by a downloaded adapter is never followed"
    raise MissingBaseError(
        f"{adapter_folder}: a LoRA adapter of {name!r}, which is not in the scanned hub, a local folder or the "
        f"Hugging Face cache (looked at {where}); put the base model there and scan again"
    )


@dataclass(frozen=True)
class AdapterBase:
    """What discovery knows about an adapter folder's base: its id for the models table (``org/name`` inside the
    adapter's hub root when found there, else the name adapter_config.json gives) and its folder, if found."""

    model_id: str
    folder: Path | None


def adapter_base(adapter_folder: Path, *, outside_paths: bool = False) -> AdapterBase | None:
    """The base of the adapter in this folder, for discovery; None when the folder is no adapter or its config is
    unreadable (fingerprinting it then reports why, as one error row). ``outside_paths``: a base path may lead out
    of the hub (`BaseLocator`)."""
    if not is_adapter_folder(adapter_folder):
        return None
    try:
        spec = read_adapter_config(adapter_folder)
    except CheckpointError:
        return None
    try:
        found = locate_base(adapter_folder, spec, BaseLocator.around(adapter_folder, outside_paths=outside_paths))
    except MissingBaseError:
        return AdapterBase(spec.base, None)
    root = adapter_folder.parent.parent
    try:
        relative = found.resolve().relative_to(root.resolve())
    except (OSError, ValueError):
        relative = None
    inside = relative is not None and len(relative.parts) == 2
    return AdapterBase(relative.as_posix() if inside else spec.base, found)


def _is_repo_id(name: str) -> bool:
    if name.count("/") != 1 or name.startswith(("/", ".", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _inside(root: Path, candidate: Path) -> Path | None:
    """The candidate folder if it exists and no link takes it out of the root."""
    try:
        real = resolve_inside(candidate, [resolve_inside(root)])
    except PathRefused:
        return None
    return _folder(real)


def _folder(path: Path) -> Path | None:
    """The path if it is a folder; None for anything else, a name too long for the file system included."""
    try:
        return path if path.is_dir() else None
    except OSError:  # ENAMETOOLONG: Path.is_dir swallows only a few errnos
        return None


def _lexically_inside(candidate: Path, root: Path) -> bool:
    """Whether the path, read as written (``..`` applied, nothing on disk looked at), lies inside the root as
    written or as resolved; links along it are checked when it is opened (`_inside`)."""
    written = Path(os.path.normpath(candidate.absolute()))
    return any(written.is_relative_to(r) for r in (Path(os.path.normpath(root.absolute())),
                                                       Path(os.path.realpath(root))))


def _shown(name: str, limit: int = 200) -> str:
    """A name from a stranger's config as an error may quote it: at most ``limit`` characters, the rest counted."""
    return name if len(name) <= limit else f"{name[:limit]}... ({len(name):,} characters)"


def _cached_snapshot(repo_id: str, revision: str | None, cache: Path | None) -> Path | None:
    """The snapshot folder of a cached model repo at this revision; with none given, its main ref, else its newest
    snapshot (a download pinned to a commit writes no ref)."""
    try:
        config = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=revision or "main")
        if isinstance(config, str):
            return Path(config).parent
        if revision is not None:
            return None
        repo = next((r for r in scan_cache_dir(cache).repos if r.repo_id == repo_id and r.repo_type == "model"), None)
    except (HFValidationError, CacheNotFound, OSError):
        return None
    snapshots = [r for r in (repo.revisions if repo else ()) if any(f.file_name == "config.json" for f in r.files)]
    return max(snapshots, key=lambda r: r.last_modified).snapshot_path if snapshots else None
