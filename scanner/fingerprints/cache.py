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

Who may write it: the cache trusts its parts' digests, so only this user may write the folder. The default is
private to the user (``<system temp>/hubtrace-<uid>/fingerprint-cache``, mode 0700, never a shared path another
user could create first), and any folder that is not a real directory owned by this user, or that others may write,
turns the cache off for the process (`FingerprintCache.disabled` says why): parts are then fetched, never cached.
Parts are opened as regular files only (a FIFO planted under a part's name cannot block a read).

Budget and concurrency: after each write the least recently used parts (by modification time, refreshed on every
hit) are deleted until the folder holds at most ``max_bytes``; eviction runs under a file lock (given up after
`LOCK_TIMEOUT_S`: the next write evicts) so two processes do not both evict, while reads and writes need no lock
(rename is atomic, and a file deleted while another process reads it stays readable to that process).
fsspec's ``filecache``/``blockcache`` were considered and not used: they key by path and ETag/mtime (not by a
recorded sha256), keep one JSON index that concurrent processes overwrite, do not check cached bytes, and have no
byte budget.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from scanner.files import open_regular_file, process_alive

DEFAULT_CACHE_BYTES = 10 << 30
"""10 GiB: ~200 screened 7B-shaped fingerprints (header + 4 of 32 blocks, ~46 MB each), or 28 whole ones."""
_DIGEST = hashlib.sha256().digest_size
_TEMP_PREFIX = ".tmp-"
_LOCK_NAME = ".evict.lock"

Fetch = Callable[[], bytes]
PartReader = Callable[[str, Fetch], bytes]
"""``read(part, fetch)``: a part's bytes, from the cache or from ``fetch()`` (scanner.fingerprints.ranges)."""


#: Seconds a process waits for the eviction lock before leaving eviction to the next write.
LOCK_TIMEOUT_S = 30.0


def default_cache_dir() -> Path:
    """``<system temp>/hubtrace-<uid>/fingerprint-cache`` of the node the process runs on: private to the user."""
    return Path(tempfile.gettempdir()) / f"hubtrace-{os.getuid()}" / "fingerprint-cache"


def unsafe_folder(folder: Path) -> str | None:
    """Why ``folder`` cannot hold trusted parts (None when it can): not a directory of its own (a link, a file), not
    this user's, or writable by group or others."""
    try:
        info = os.lstat(folder)
    except OSError as exc:
        return f"cannot inspect {folder}: {exc.strerror or exc}"
    if not stat.S_ISDIR(info.st_mode):
        return f"{folder} is not a directory (a link or a file)"
    if info.st_uid != os.getuid():
        return f"{folder} belongs to user {info.st_uid}, not to this user ({os.getuid()})"
    if info.st_mode & 0o022:
        return f"{folder} is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


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
        try:
            if folder is None:
                self.folder.parent.mkdir(mode=0o700, exist_ok=True)
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            pass  # said by unsafe_folder below
        #: Why this process caches nothing (None: it caches); see the module docstring.
        self.disabled = unsafe_folder(self.folder) or (unsafe_folder(self.folder.parent) if folder is None else None)

    def reader(self, address: str, file_sha256: str) -> PartReader:
        """The part reader of one fingerprint at one recorded sha256."""
        return lambda part, fetch: self.get(address, file_sha256, part, fetch)

    def get(self, address: str, file_sha256: str, part: str, fetch: Fetch) -> bytes:
        """The part's bytes from disk when present and intact, else ``fetch()``'s (then stored for the next)."""
        if self.disabled:
            self.counts.misses += 1
            return fetch()
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
            with open_regular_file(path) as handle:
                data = handle.read()
        except FileNotFoundError:
            return None
        except OSError:  # not a regular file (a FIFO, a folder): not a part
            self.counts.damaged += 1
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
        try:
            lock = FileLock(self.folder / _LOCK_NAME, timeout=LOCK_TIMEOUT_S)
            lock.acquire()
        except Timeout:
            return  # another process evicts (or hangs holding the lock); the next write tries again
        try:
            _remove_orphan_temps(self.folder)
            parts = sorted(self._parts())
            total = sum(size for _, _, size in parts)
            for _, path, size in parts:
                if total <= self.max_bytes:
                    break
                if path != keep:
                    path.unlink(missing_ok=True)
                    total -= size
        finally:
            lock.release()

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

