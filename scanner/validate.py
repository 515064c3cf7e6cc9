"""Everything hubtrace checks before it trusts a model folder, in one call.

`open_checkpoint` checks the files it reads (config, safetensors headers, shards, pickle and remote code) and
`adapter_for` checks the config's dims against the tensor headers. A scan over strangers' uploads needs more before
it spends a forward pass: the folder must hold something, no link may lead out of it (a link to /dev/zero or to
another user's files is an attack or an accident, and a link loop must not hang anything), no file hubtrace opens may
be a FIFO or device (opening one blocks forever), and the weights must be finite, since a single NaN turns every
activation statistic into NaN. Every failure is a `HubtraceError` with a one-line reason.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import torch

from scanner.adapters import ArchitectureAdapter, adapter_for
from scanner.checkpoint import Checkpoint, open_checkpoint
from scanner.errors import CheckpointError, UnsafeCheckpointError

#: Bytes of one tensor held in memory at a time while its values are checked.
VALUE_CHUNK_BYTES = 16 << 20


def validate_checkpoint(
    path: str | Path, *, check_values: bool = True, chunk_bytes: int = VALUE_CHUNK_BYTES
) -> tuple[Checkpoint, ArchitectureAdapter]:
    """A model folder checked throughout, with its adapter; raises a `HubtraceError` subclass naming the problem.

    `check_values=False` skips the NaN/Inf scan, the only check that reads every weight (about as long as reading
    the model from disk once).
    """
    folder = _real_folder(Path(path))
    _check_entries(folder)
    checkpoint = open_checkpoint(folder)
    adapter = adapter_for(checkpoint)
    if check_values:
        check_finite(checkpoint, chunk_bytes)
    return checkpoint, adapter


def check_finite(checkpoint: Checkpoint, chunk_bytes: int = VALUE_CHUNK_BYTES) -> None:
    """Raise CheckpointError naming the first floating tensor (by name) that holds a NaN or an infinity.

    Tensors are read in chunks of `chunk_bytes`, so memory stays bounded whatever the tensor's size.
    """
    for name in checkpoint.tensor_names():
        if not _is_float(checkpoint, name):
            continue
        offset = 0
        for chunk in checkpoint.tensor_chunks(name, chunk_bytes):
            values = chunk.float() if chunk.element_size() == 1 else chunk  # torch has no isfinite for float8
            bad = ~torch.isfinite(values)
            if bad.any():
                first = int(bad.nonzero()[0, 0])
                kind = "NaN" if torch.isnan(values[first]) else "Inf"
                raise CheckpointError(
                    f"{checkpoint.path}: tensor {name} contains {kind} (first at flat index {offset + first} of "
                    f"shape {list(checkpoint.shape(name))}); hubtrace refuses weights that are not finite"
                )
            offset += values.numel()


def _is_float(checkpoint: Checkpoint, name: str) -> bool:
    return getattr(torch, checkpoint.dtype(name)).is_floating_point


def _real_folder(folder: Path) -> Path:
    """The folder with links resolved; a loop or a missing path is a one-line CheckpointError."""
    try:
        real = Path(os.path.realpath(folder, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CheckpointError(f"checkpoint folder {folder} is a symlink loop") from exc
        raise CheckpointError(f"cannot open checkpoint folder {folder}: {exc.strerror or exc}") from exc
    if not real.is_dir():
        raise CheckpointError(f"checkpoint path {folder} is not a directory")
    return real


def _check_entries(folder: Path) -> None:
    """Refuse an empty folder, link loops, links leading out of the folder, and special files at its top level.

    hubtrace reads only top-level files, so subfolders are not walked (a linked subfolder cannot make this loop).
    In a Hugging Face cache snapshot (``<repo>/snapshots/<rev>/``) every file is a link into ``<repo>/blobs/``,
    so that folder counts as inside too.
    """
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError as exc:
        raise CheckpointError(f"cannot list checkpoint folder {folder}: {exc.strerror or exc}") from exc
    if not entries:
        raise CheckpointError(f"{folder} is empty: no config.json and no weights")
    allowed = [folder]
    blobs = folder.parent.parent / "blobs"
    if folder.parent.name == "snapshots" and blobs.is_dir():
        allowed.append(blobs)
    for entry in entries:
        path = Path(entry.path)
        if entry.is_symlink():
            try:
                target = Path(os.path.realpath(path, strict=True))
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise CheckpointError(f"{path} is a symlink loop") from exc
                continue  # dangling: harmless unless hubtrace needs the file, and then opening it says so
            if not any(target.is_relative_to(root) for root in allowed):
                raise UnsafeCheckpointError(
                    f"symlink {path} points outside the model folder (to {target}); hubtrace never follows links "
                    "out of a model folder"
                )
        else:
            target = path
        try:
            mode = target.stat().st_mode
        except OSError as exc:
            raise CheckpointError(f"cannot stat {path}: {exc.strerror or exc}") from exc
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise CheckpointError(f"{path} is not a regular file (a FIFO, socket or device); hubtrace will not open it")
