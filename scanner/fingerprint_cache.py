"""A node-local disk cache of the fingerprint bytes a node read from a remote store, shared by its processes.

Why: a scan's pair tasks are separate processes (and, on a CPU node, a fresh `PairWorker` each), so without a disk
cache every task on a node downloads again the fingerprints its batch needs, though the same models appear in
batch after batch. The cache holds *parts* of fingerprints, the header and single blocks, because the sequential
design compares only a few screening blocks of most pairs (scanner.stats.sequential): caching whole files would
download the blocks no test reads.

Keys and staleness: a part is stored under the fingerprint's address *and* the ``file_sha256`` the database
records for it, so a re-fingerprinted revision (a new sha256) never finds the old bytes.

Integrity: each file is the sha256 of its payload followed by the payload, written to a temporary name in the
same folder and renamed into place, so other processes see a part whole or not at all; every read checks the
digest, so a damaged or truncated file (a disk error, a hand edit) is deleted and fetched again, never trusted.

Budget and concurrency: after each write the least recently used parts (by modification time, refreshed on every
hit) are deleted until the folder holds at most ``max_bytes``; eviction runs under a file lock so two processes do
not both evict, while reads and writes need no lock (rename is atomic, and a file deleted while another process
reads it stays readable to that process). fsspec's ``filecache``/``blockcache`` were considered and not used: they
key by path and ETag/mtime (not by a recorded sha256), keep one JSON index that concurrent processes overwrite,
do not check cached bytes, and have no byte budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from scanner.files import process_alive

DEFAULT_CACHE_BYTES = 10 << 30
"""10 GiB: ~200 screened 7B-shaped fingerprints (header + 4 of 32 blocks, ~46 MB each), or 28 whole ones."""
_DIGEST = hashlib.sha256().digest_size
_TEMP_PREFIX = ".tmp-"
_LOCK_NAME = ".evict.lock"

Fetch = Callable[[], bytes]
PartReader = Callable[[str, Fetch], bytes]
"""``read(part, fetch)``: a part's bytes, from the cache or from ``fetch()`` (scanner.fingerprint_ranges)."""


def default_cache_dir() -> Path:
    """``<system temp>/hubtrace-scratch/fingerprint-cache`` of the node the process runs on."""
    return Path(tempfile.gettempdir()) / "hubtrace-scratch" / "fingerprint-cache"


@dataclass
class CacheCounts:
    """What this process's cache object did: parts served from disk, fetched, and found damaged (refetched)."""

    hits: int = 0
    misses: int = 0
    damaged: int = 0


class FingerprintCache:
    """Parts of remote fingerprints on this node's disk, keyed by address and recorded sha256, within a budget."""

    def __init__(self, folder: str | Path | None = None, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.folder = Path(folder) if folder is not None else default_cache_dir()
        self.max_bytes = max_bytes
        self.counts = CacheCounts()
        self.folder.mkdir(parents=True, exist_ok=True)

    def reader(self, address: str, file_sha256: str) -> PartReader:
        """The part reader of one fingerprint at one recorded sha256."""
        return lambda part, fetch: self.get(address, file_sha256, part, fetch)

    def get(self, address: str, file_sha256: str, part: str, fetch: Fetch) -> bytes:
        """The part's bytes from disk when present and intact, else ``fetch()``'s (then stored for the next)."""
        path = self.path(address, file_sha256, part)
        payload = self._load(path)
        if payload is not None:
            self.counts.hits += 1
            return payload
        payload = fetch()
        self.counts.misses += 1
        self._store(path, payload)
        return payload

    def path(self, address: str, file_sha256: str, part: str) -> Path:
        """Where a part lives: a hash of (address, sha256) and the part's name, safe as a file name."""
        key = hashlib.sha256(f"{address}\0{file_sha256}".encode()).hexdigest()[:40]
        return self.folder / f"{key}.{part}"

    def size(self) -> int:
        """Bytes the cached parts take on disk now."""
        return sum(size for _, _, size in self._parts())

    def _load(self, path: Path) -> bytes | None:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        payload = data[_DIGEST:]
        if len(data) < _DIGEST or hashlib.sha256(payload).digest() != data[:_DIGEST]:
            self.counts.damaged += 1
            path.unlink(missing_ok=True)
            return None
        _touch(path)
        return payload

    def _store(self, path: Path, payload: bytes) -> None:
        if _DIGEST + len(payload) > self.max_bytes:
            return  # would not fit even alone: served, not kept
        temp = self.folder / f"{_TEMP_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        try:
            with open(temp, "wb") as out:
                out.write(hashlib.sha256(payload).digest())
                out.write(payload)
            os.replace(temp, path)
            _touch(path)
        except OSError:  # a full or read-only disk costs the cache, not the pair test
            temp.unlink(missing_ok=True)
            return
        self._evict(keep=path)

    def _evict(self, keep: Path) -> None:
        with FileLock(self.folder / _LOCK_NAME):
            _remove_orphan_temps(self.folder)
            parts = sorted(self._parts())
            total = sum(size for _, _, size in parts)
            for _, path, size in parts:
                if total <= self.max_bytes:
                    break
                if path != keep:
                    path.unlink(missing_ok=True)
                    total -= size

    def _parts(self) -> list[tuple[float, Path, int]]:
        """(last use, path, bytes) of every cached part; temporary files and the lock are not parts."""
        parts = []
        for entry in os.scandir(self.folder):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            with contextlib.suppress(FileNotFoundError):
                stat = entry.stat()
                parts.append((stat.st_mtime, Path(entry.path), stat.st_size))
        return parts


def _touch(path: Path) -> None:
    """Mark a part most recently used, to the nanosecond (the file system's own clock ticks every few ms)."""
    now = time.time_ns()
    with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: the bytes already read are still right
        os.utime(path, ns=(now, now))


def _remove_orphan_temps(folder: Path) -> None:
    """Delete temporary files of processes that died mid-write (they would hold disk outside the budget)."""
    for temp in folder.glob(f"{_TEMP_PREFIX}*"):
        pid = temp.name.removeprefix(_TEMP_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            temp.unlink(missing_ok=True)

