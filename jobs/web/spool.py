"""Downloads written whole to a temporary file before a byte is sent, so that a client that reads slowly holds
neither a lane nor a thread.

A download streamed as its client took it held its lane (a SQL-box process or a download reader) for as long as the
client took: two clients reading at 1 KB/s held both SQL lanes, and every other visitor's statement was turned
away. Now the lane writes the answer to a spool file at the speed of the database and of the writing, and is free
again; the file goes to waitress as its ``wsgi.file_wrapper``, which its main loop sends from the file as the client
takes it, with no thread of the app's. The spool files of all downloads together hold at most ``budget`` bytes
(`ServeLimits.spool_bytes`); a download that would pass it is turned away (503). A client that takes them too slowly
is cut off (jobs.web.channel), which frees its file."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path


class SpoolFull(Exception):
    """The downloads waiting for their clients hold the whole spool budget."""


class Spool:
    """The server's spool files and their bytes, at most ``budget`` together, in ``folder`` (a private folder of the
    server's; each file is removed from it as it is made, so it goes when it is closed, or with the process)."""

    def __init__(self, budget: int, folder: Path) -> None:
        self.budget, self.folder = budget, folder
        self.held = 0
        self._lock = threading.Lock()

    def file(self) -> SpoolFile:
        return SpoolFile(self)

    def reserve(self, size: int) -> None:
        with self._lock:
            if self.held + size > self.budget:
                raise SpoolFull(f"the downloads waiting for their readers hold the {self.budget >> 20:,} MB the "
                                "server keeps for them (hubtrace serve --spool-mb); try again in a moment")
            self.held += size

    def release(self, size: int) -> None:
        with self._lock:
            self.held -= size


class SpoolFile:
    """One download's spool file: written once (each write counted against the spool), then read by waitress,
    which closes it when it is sent or its connection closes; closing it gives its bytes back."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._file = tempfile.TemporaryFile(dir=spool.folder)
        self.size = 0
        self.closed = False

    def write(self, data: bytes) -> None:
        self._spool.reserve(len(data))
        self.size += len(data)
        self._file.write(data)

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._file.seek(offset, whence)

    def tell(self) -> int:
        return self._file.tell()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.close()
            self._spool.release(self.size)

    def __del__(self) -> None:  # a response never sent (HEAD) is dropped without a close
        self.close()
