"""File-system checks and digests shared by discovery, validation, checkpoints and fingerprints.

Discovery (`sources/local.py`) and validation (`validate.py`) both follow links in folders that strangers
uploaded, and must refuse the same things: a link loop, a link whose target is gone, a link that leads out of
the folder. `resolve_inside` is that one check; each caller turns a `PathRefused` into its own error type and
wording.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO, Literal

RefusalKind = Literal["loop", "unreadable", "outside"]


class PathRefused(Exception):
    """Why a path could not be resolved safely: a link ``loop``, an ``unreadable`` path (missing, dangling,
    no permission: ``error`` says which), or a target ``outside`` every allowed root (``target`` says where)."""

    def __init__(
        self, path: Path, kind: RefusalKind, *, error: OSError | None = None, target: Path | None = None
    ) -> None:
        reason = {"loop": "symlink loop", "outside": f"points outside the allowed folders (to {target})"}.get(
            kind, (error.strerror if error is not None else None) or str(error)
        )
        super().__init__(f"{path}: {reason}")
        self.path, self.kind, self.error, self.target = path, kind, error, target


def resolve_inside(path: Path, roots: Sequence[Path] = ()) -> Path:
    """``path`` with every link resolved; raises `PathRefused` for a loop, an unreadable path, or (when ``roots``
    are given) a target that is neither a root nor inside one. Roots must already be resolved."""
    try:
        real = Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        kind: RefusalKind = "loop" if exc.errno == errno.ELOOP else "unreadable"
        raise PathRefused(path, kind, error=exc) from exc
    if roots and not any(real.is_relative_to(root) for root in roots):
        raise PathRefused(path, "outside", target=real)
    return real


class NotRegularFileError(OSError):
    """The path opened to something other than a regular file: a folder (``is_dir``), a FIFO, socket or device."""

    def __init__(self, file: Path, mode: int) -> None:
        super().__init__(f"{file}: not a regular file")
        self.is_dir = stat.S_ISDIR(mode)


def open_regular_file(file: Path) -> BinaryIO:
    """file opened for reading, then checked on the open descriptor (fstat): what is checked is what is read, with
    no window between a check of the path and its open in which a FIFO could be swapped in. O_NONBLOCK: opening a
    FIFO with no writer would otherwise wait forever. Raises OSError (`NotRegularFileError` for anything but a
    regular file)."""
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(Path(file), mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_sha256(file: Path, block_bytes: int = 8 << 20) -> str:
    """Hex sha256 of a file's bytes, read in blocks (memory stays bounded); raises OSError when unreadable."""
    with open(file, "rb") as handle:
        return stream_sha256(handle, block_bytes)


def stream_sha256(handle: BinaryIO, block_bytes: int = 8 << 20) -> str:
    """Hex sha256 of what is left to read in an open file, read in blocks."""
    digest = hashlib.sha256()
    for block in iter(lambda: handle.read(block_bytes), b""):
        digest.update(block)
    return digest.hexdigest()


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (one we may not signal counts): leftovers of the dead are removed."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
