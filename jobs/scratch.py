"""Node-local scratch for Hub downloads: one folder per model being fingerprinted, deleted once it is done.

A worker holds one model at a time, so a node's disk never holds more checkpoints than it runs workers (and the
scan never has more than ``max_in_flight`` models in flight). A worker killed mid-download (OOM, SIGKILL)
cannot delete its folder; the folder is named after the process, and the next worker on that node removes
the folders of processes that are gone.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from scanner.files import process_alive

PREFIX = "hubtrace-download-"


def default_scratch() -> Path:
    """``<system temp>/hubtrace-scratch`` of the node the worker runs on."""
    return Path(tempfile.gettempdir()) / "hubtrace-scratch"


@contextmanager
def download_folder(scratch: Path) -> Iterator[Path]:
    """A fresh folder under ``scratch`` for one model's files, removed with everything in it on exit."""
    scratch.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=scratch))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def remove_orphans(scratch: Path) -> list[Path]:
    """Delete download folders left by processes that no longer run on this node; returns what was removed."""
    removed = []
    if not scratch.is_dir():
        return removed
    for folder in scratch.glob(f"{PREFIX}*"):
        pid = folder.name.removeprefix(PREFIX).split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed

