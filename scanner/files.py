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
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

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


def file_sha256(file: Path, block_bytes: int = 8 << 20) -> str:
    """Hex sha256 of a file's bytes, read in blocks (memory stays bounded); raises OSError when unreadable."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(block_bytes), b""):
            digest.update(block)
    return digest.hexdigest()
