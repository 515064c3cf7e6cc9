"""Where fingerprint files live: a location, not a folder.

A location is a local path (one node, or a filesystem every node mounts) or a URL that fsspec understands
(``s3://bucket/prefix`` through s3fs, and any other protocol an installed fsspec implementation adds). Object
stores take their endpoint and credentials from the standard AWS environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``), which botocore reads itself: nothing secret passes through
hubtrace's configuration or database.

Each fingerprint has one address, ``<location>/<model_id>/<revision>/<input_set>.safetensors``, recorded in
the database as written (an absolute path for local stores, a URL otherwise), so any node reads it back with
`read_fingerprint_at` whatever node wrote it. Writes are atomic on both kinds: local files are renamed into
place, and an object store shows an object only once its upload is complete.

The store's root holds one more file, ``hubtrace-database.json``: the id, path and host of the scan database it
belongs to (`StoreOwner`; jobs/ownership.py decides what a scan does with a store another database claimed).
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import fsspec
from fsspec.implementations.local import LocalFileSystem

from scanner.errors import FingerprintError, one_line
from scanner.fingerprints.cache import PartReader
from scanner.fingerprints.fingerprint import (
    Fingerprint,
    FingerprintMeta,
    read_fingerprint,
    read_fingerprint_block,
    read_fingerprint_meta,
    write_fingerprint,
)
from scanner.fingerprints.ranges import RangedFingerprint
from scanner.reading.activations import MLPActivations

FINGERPRINT_SUFFIX = ".safetensors"
OWNER_FILE = "hubtrace-database.json"


@dataclass(frozen=True)
class StoreOwner:
    """The scan database a fingerprint store belongs to: its id (None: a record that cannot be read), the path
    it had and the host whose scan claimed the store."""

    database_id: str | None
    database: str
    host: str


def is_url(location: str | Path) -> bool:
    """``scheme://…`` (any scheme but ``file``) rather than a path on this node's disk."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


class FingerprintStore:
    """Reads and writes fingerprint files at one location through fsspec."""

    def __init__(self, location: str | Path) -> None:
        text = str(location)
        if not is_url(text):
            text = str(Path(text.removeprefix("file://")).expanduser().resolve())
        self.location = text.rstrip("/") or "/"
        self.fs, self._root = fsspec.core.url_to_fs(self.location)

    @property
    def is_local(self) -> bool:
        """A path on the disk of the node that opened it (shared only if every node mounts it there)."""
        return isinstance(self.fs, LocalFileSystem)

    def address(self, model_id: str, revision: str, input_set: str) -> str:
        """The fingerprint's address: an absolute path for a local store, a URL for a remote one."""
        return self._address(self._key(model_id, revision, input_set))

    def write(self, fingerprint: Fingerprint, model_id: str, revision: str, *, scratch: Path | None = None
              ) -> tuple[str, str]:
        """Store one fingerprint atomically; returns its address and the file's sha256.

        A remote store gets a file written to node-local ``scratch`` first (safetensors writes files), then
        uploaded in one put and deleted.
        """
        key = self._key(model_id, revision, fingerprint.meta.input_set)
        if self.is_local:
            return key, write_fingerprint(fingerprint, key)
        with _scratch_file(scratch) as tmp:
            digest = write_fingerprint(fingerprint, tmp)
            self.fs.put_file(str(tmp), key)
        return self._address(key), digest

    def existing(self) -> set[str]:
        """Addresses of every fingerprint file in the store, from one listing (not one request per model)."""
        self.fs.invalidate_cache()
        if not self.fs.exists(self._root):
            return set()
        return {self._address(p) for p in self.fs.find(self._root) if p.endswith(FINGERPRINT_SUFFIX)}

    def prepare(self) -> None:
        """Create the location if it can be (a local folder), or check that this node can write to it (an object
        store, whose bucket must already exist): a missing bucket, an unreachable endpoint or refused credentials
        is then one error at start instead of one per model."""
        if self.is_local:
            Path(self._root).mkdir(parents=True, exist_ok=True)
            return
        probe = f"{self._root.rstrip('/')}/.hubtrace-write-check-{uuid.uuid4().hex}"
        try:
            self.fs.pipe_file(probe, b"")
            self.fs.rm_file(probe)
        except (*_storage_errors(), ValueError) as e:
            raise FingerprintError(f"fingerprint_store {self.location} cannot be written from this node "
                                   f"({one_line(e)}); check that the bucket exists and the AWS_* variables") from e

    def owner(self) -> StoreOwner | None:
        """The database this store's record names; None where no scan has claimed the store yet. A record that
        cannot be read names no database (its id None), so no database takes it for its own."""
        try:
            data = json.loads(self.fs.cat_file(self._owner_key()))
            return StoreOwner(str(data["database_id"]), str(data["database"]), str(data["host"]))
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError) as e:
            return StoreOwner(None, f"(unreadable {OWNER_FILE}: {one_line(e, 100)})", "?")
        except _storage_errors() as e:
            raise FingerprintError(f"fingerprint_store {self.location}: cannot read {OWNER_FILE}: {one_line(e)}") from e

    def set_owner(self, owner: StoreOwner) -> None:
        """Record the database this store belongs to (replaced whole: renamed into place, or one upload)."""
        data = json.dumps(asdict(owner)).encode()
        if not self.is_local:
            self.fs.pipe_file(self._owner_key(), data)
            return
        handle, tmp = tempfile.mkstemp(prefix=f".{OWNER_FILE}.", dir=self._root)
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(tmp, self._owner_key())

    def _owner_key(self) -> str:
        return f"{self._root.rstrip('/')}/{OWNER_FILE}"

    def _key(self, model_id: str, revision: str, input_set: str) -> str:
        return f"{self._root.rstrip('/')}/{model_id}/{revision}/{input_set}{FINGERPRINT_SUFFIX}"

    def _address(self, key: str) -> str:
        return key if self.is_local else self.fs.unstrip_protocol(key)


@contextmanager
def local_copy(address: str | Path, *, scratch: Path | None = None) -> Iterator[Path]:
    """A path on this node holding the fingerprint at ``address``: the file itself when it is local, else a
    downloaded copy in ``scratch`` that is deleted on exit."""
    if not is_url(address):
        yield Path(str(address).removeprefix("file://"))
        return
    with _scratch_file(scratch) as tmp:
        with _remote(address) as (fs, key):
            fs.get_file(key, str(tmp))
        yield tmp


def read_fingerprint_at(address: str | Path, *, scratch: Path | None = None) -> Fingerprint:
    """`read_fingerprint` for any address a `FingerprintStore` gave (local path or URL), checked the same way."""
    with local_copy(address, scratch=scratch) as path:
        try:
            return read_fingerprint(path)
        except FingerprintError as e:  # name the address, not the temporary copy
            raise FingerprintError(str(e).replace(str(path), str(address))) from e


def read_fingerprint_meta_at(address: str | Path) -> FingerprintMeta:
    """Only the header of the fingerprint at ``address``; from an object store, only the header's bytes are
    fetched (scanner.fingerprints.ranges), not the activations."""
    if not is_url(address):
        return read_fingerprint_meta(str(address).removeprefix("file://"))
    with _remote(address) as (fs, key):
        return RangedFingerprint(fs, key, str(address)).meta


def read_fingerprint_block_at(address: str | Path, layer: int) -> tuple[FingerprintMeta, list[MLPActivations]]:
    """The header and block ``layer``'s activations (per expert) of the fingerprint at ``address``, fetching only
    that block's bytes from an object store. Checked like a whole read except for the whole-file sha256."""
    if not is_url(address):
        return read_fingerprint_block(str(address).removeprefix("file://"), layer)
    with _remote(address) as (fs, key):
        ranged = RangedFingerprint(fs, key, str(address))
        return ranged.meta, ranged.block(layer)


def open_fingerprint_at(address: str, *, parts: PartReader | None = None,
                        place: Callable[[list[MLPActivations]], list[MLPActivations]] | None = None) -> Fingerprint:
    """The fingerprint at an object store URL with only its header fetched now: each block is fetched when a test
    first reads it (`LazyBlocks`), so a sequential test reads the header and its screening blocks, not the file.

    ``parts`` serves the header and blocks (a node's disk cache, scanner.fingerprints.cache); ``place`` moves each
    fetched block where the test runs (a GPU). Blocks are checked as `read_fingerprint_block_at` checks them."""
    with _remote(address) as (fs, key):
        ranged = RangedFingerprint(fs, key, address, parts)
    return Fingerprint(ranged.meta, LazyBlocks(ranged, place))


class LazyBlocks(Sequence[list[MLPActivations]]):
    """A remote fingerprint's blocks, each fetched (through its part reader) on first access and then kept."""

    def __init__(self, ranged: RangedFingerprint,
                 place: Callable[[list[MLPActivations]], list[MLPActivations]] | None = None) -> None:
        self._ranged, self._place = ranged, place or (lambda block: block)
        self._loaded: dict[int, list[MLPActivations]] = {}

    def __len__(self) -> int:
        return self._ranged.meta.n_layers

    def __getitem__(self, layer):  # noqa: ANN001 - an index (slices are not needed by any reader)
        if not isinstance(layer, int) or not 0 <= layer < len(self):
            raise IndexError(f"block {layer} of {len(self)}")
        if layer not in self._loaded:
            with _remote(self._ranged.address):
                self._loaded[layer] = self._place(self._ranged.block(layer))
        return self._loaded[layer]

    def fetched(self) -> list[list[MLPActivations]]:
        """The blocks fetched so far (what the fingerprint holds in memory)."""
        return list(self._loaded.values())


def fingerprint_side(side: str | Path) -> Fingerprint | Path:
    """One side of a command (`hubtrace test`, `localize`): a URL is a fingerprint in an object store, read here and
    checked like a local file; anything else is a local path (model folder, GGUF or fingerprint file)."""
    return read_fingerprint_at(str(side)) if is_url(side) else Path(str(side).removeprefix("file://"))


@contextmanager
def _remote(address: str | Path) -> Iterator[tuple[fsspec.AbstractFileSystem, str]]:
    """The filesystem and key of a URL, with every way the object can be unreachable turned into one
    FingerprintError line: missing, unknown protocol, refused request, unreachable endpoint, no credentials."""
    try:
        yield fsspec.core.url_to_fs(str(address))
    except FileNotFoundError as e:
        raise FingerprintError(f"fingerprint {address} does not exist") from e
    except (*_storage_errors(), ValueError, ImportError) as e:
        raise FingerprintError(f"cannot read fingerprint {address}: {one_line(e)}") from e


def _storage_errors() -> tuple[type[Exception], ...]:
    """What a filesystem library raises when a location cannot be reached: OSError, and botocore's own errors (an
    unreachable endpoint, missing credentials) that s3fs lets through."""
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:
        return (OSError,)
    return (OSError, BotoCoreError)


@contextmanager
def _scratch_file(scratch: Path | None) -> Iterator[Path]:
    folder = Path(scratch) if scratch is not None else Path(tempfile.gettempdir())
    folder.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix="hubtrace-fp-", suffix=FINGERPRINT_SUFFIX, dir=folder)
    os.close(handle)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)
