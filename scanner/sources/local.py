"""Models in a local folder tree laid out like the Hub: ``<root>/<org>/<name>/`` (or a GGUF file ``<name>.gguf``).

Every ``org/name`` directory is a candidate model, including ones that turn out broken (no config, pickle only,
empty): they get a record so that the scan can record why they failed. What discovery itself cannot do safely is
a `SourceFailure` instead: a symlink loop, a link that leaves the root, an unreadable directory. The revision is a
hash over the files' relative paths, sizes and modification times, so an edited model gets a new revision
without reading any weights.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from scanner.declared.cards import Card, adapter_card, read_card
from scanner.declared.merge_config import read_merge_config
from scanner.files import PathRefused, resolve_inside
from scanner.reading.formats.gguf import GGUF_SUFFIX
from scanner.reading.formats.lora_base import adapter_base
from scanner.sources.records import WHOLE_SOURCE, ModelRecord, SourceFailure, record_from_card

# Bounds that keep a hostile tree from making discovery slow; real model folders are far below them.
MAX_FILES = 10_000
MAX_DEPTH = 8


class _Unsafe(Exception):
    """A path discovery refuses to follow; the message becomes a SourceFailure reason."""


def discover_local(root: Path, *, follow_links: bool = False) -> Iterator[ModelRecord | SourceFailure]:
    """One record (or SourceFailure) per ``org/name`` directory under ``root``, in sorted order.

    Links that leave ``root`` are refused (right for a tree someone else made) unless ``follow_links``: a person's
    own tree of linked downloads. Loops and dangling links are refused either way."""
    try:
        real_root = resolve_inside(root)
    except PathRefused as e:
        yield SourceFailure(WHOLE_SOURCE, str(root), f"local model root unreadable: {_describe(e.error or e)}")
        return
    if not real_root.is_dir():
        yield SourceFailure(WHOLE_SOURCE, str(root), "local model root is not a directory")
        return
    try:
        orgs = _children(real_root)
    except OSError as e:
        yield SourceFailure(WHOLE_SOURCE, str(root), f"local model root unreadable: {_describe(e)}")
        return
    for org in orgs:
        try:
            org_dir = _inside(real_root, org, follow_links)
            if not org_dir.is_dir():
                continue  # loose files next to the org folders (e.g. a manifest) are not models
            names = _children(org_dir)
        except (_Unsafe, OSError) as e:
            yield SourceFailure(org.name, str(org), _describe(e))
            continue
        for entry in names:
            model_id = f"{org.name}/{entry.name}"
            try:
                model_dir = _inside(real_root, entry, follow_links)
                if model_dir.is_file() and entry.name.endswith(GGUF_SUFFIX):
                    yield _gguf_file_record(model_id, model_dir)
                    continue
                if not model_dir.is_dir():
                    continue
                yield _record(real_root, model_id, model_dir, follow_links)
            except (_Unsafe, OSError) as e:
                yield SourceFailure(model_id, str(entry), _describe(e))


def _record(real_root: Path, model_id: str, model_dir: Path, follow_links: bool) -> ModelRecord:
    files = _file_stats(real_root, model_dir, follow_links)
    digest = hashlib.sha256()
    for rel, size, mtime_ns in files:
        digest.update(f"{rel}\0{size}\0{mtime_ns}\n".encode())
    newest = max((mtime_ns for _, _, mtime_ns in files), default=None)
    card = read_card(model_dir)
    base = adapter_base(model_dir, outside_paths=follow_links)
    if base is not None:  # a LoRA adapter is the model its base and it make: a changed or added base changes it too
        digest.update(f"base\0{base.model_id}\0{base.folder}\n".encode())
        for rel, size, mtime_ns in _file_stats(real_root, base.folder, True) if base.folder else ():
            digest.update(f"base/{rel}\0{size}\0{mtime_ns}\n".encode())
        card = adapter_card(card, base.model_id)
    record = record_from_card(
        model_id,
        digest.hexdigest(),
        "local",
        str(model_dir),
        card,
        last_modified=datetime.fromtimestamp(newest / 1e9, tz=UTC) if newest is not None else None,
        merge=read_merge_config(model_dir),
    )
    return replace(record, follow_links=follow_links)


def _gguf_file_record(model_id: str, file: Path) -> ModelRecord:
    """A lone ``<org>/<name>.gguf`` (how llama.cpp builds are often kept): the id keeps the file name, the
    revision hashes its size and modification time, and there is no card to read."""
    st = os.stat(file)
    revision = hashlib.sha256(f"{file.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode()).hexdigest()
    card = Card(notes=("a lone GGUF file: no model card",))
    return record_from_card(model_id, revision, "local", str(file), card,
                            last_modified=datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=UTC))


def _file_stats(real_root: Path, model_dir: Path, follow_links: bool) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of the folder's files, sorted; links are checked, never followed out."""
    out: list[tuple[str, int, int]] = []
    pending: list[tuple[Path, int]] = [(model_dir, 0)]
    while pending:
        folder, depth = pending.pop()
        for entry in _children(folder):
            rel = entry.relative_to(model_dir).as_posix()
            target = _inside(real_root, entry, follow_links) if entry.is_symlink() else entry
            st = os.stat(target)
            if stat.S_ISDIR(st.st_mode):
                if entry.is_symlink():
                    out.append((rel, -1, 0))  # a linked folder inside the root: named, not descended (no cycles)
                elif depth + 1 > MAX_DEPTH:
                    raise _Unsafe(f"{rel}: folders nested deeper than {MAX_DEPTH} levels")
                else:
                    pending.append((entry, depth + 1))
            elif stat.S_ISREG(st.st_mode):
                out.append((rel, st.st_size, st.st_mtime_ns))
            if len(out) > MAX_FILES:
                raise _Unsafe(f"more than {MAX_FILES} files in the model folder")
    return sorted(out)


def _children(folder: Path) -> list[Path]:
    """Visible entries, sorted (hidden ones such as .cache/ or .git/ are tool state, not the model)."""
    return sorted(folder / name for name in os.listdir(folder) if not name.startswith("."))


def _inside(real_root: Path, path: Path, follow_links: bool = False) -> Path:
    """``path`` with links resolved, refusing loops, dangling links and (unless follow_links) anything outside
    the root."""
    try:
        return resolve_inside(path, () if follow_links else [real_root])
    except PathRefused as e:
        if e.kind == "outside":
            raise _Unsafe(f"{path.name}: symlink points outside the model root (to {e.target}); set follow_links: "
                          f"true on the source to follow links out of it") from e
        if e.kind == "loop":
            raise _Unsafe(f"{path.name}: symlink loop") from e
        raise _Unsafe(f"{path.name}: {_describe(e.error or e)}") from e


def _describe(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return f"{error.strerror} ({error.filename})" if error.filename else error.strerror
    return str(error)
