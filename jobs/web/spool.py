"""Downloads written whole to a temporary file before a byte is sent, so that a client that reads slowly holds
neither a lane nor a thread.

A download streamed as its client took it held its lane (a SQL-box process or a download reader) for as long as the
client took: two clients reading at 1 KB/s held both SQL lanes, and every other visitor's statement was turned
away. Now the lane writes the answer to a spool file at the speed of the database and of the writing, and is free
again; the file goes to waitress as its ``wsgi.file_wrapper``, which its main loop sends from the file as the client
takes it, with no thread of the app's. A table's download is kept once written, for every later download of it while
the server runs (the server holds the database open read-only, so no scan can change it meanwhile): clients that ask
for a big table again and again cost its lane once, not each time. The spool files together hold at most ``budget``
bytes (`ServeLimits.spool_bytes`): kept files nobody reads make room first, and a download that still would pass it
is turned away (503). A client that takes its file too slowly is cut off (jobs.web.channel), which frees it."""

from __future__ import annotations

import os
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
        self.lock = threading.RLock()
        self._kept: dict[tuple[str, ...], SpoolFile] = {}
        """Table downloads kept for later downloads of the same, oldest first."""

    def file(self) -> SpoolFile:
        return SpoolFile(self)

    def kept(self, key: tuple[str, ...]) -> SpoolReader | None:
        """A reader of the download kept under ``key``, if there is one."""
        with self.lock:
            file = self._kept.get(key)
            return file.reader() if file is not None else None

    def keep(self, key: tuple[str, ...], file: SpoolFile) -> None:
        with self.lock:
            file.kept = True
            self._kept[key] = file

    def reserve(self, size: int) -> None:
        with self.lock:
            while self.held + size > self.budget:
                idle = next((key for key, file in self._kept.items() if not file.readers), None)
                if idle is None:
                    raise SpoolFull(f"the downloads waiting for their readers hold the {self.budget >> 20:,} MB the "
                                    "server keeps for them (hubtrace serve --spool-mb); try again in a moment")
                file = self._kept.pop(idle)
                file.kept = False
                file.close()
            self.held += size

    def release(self, size: int) -> None:
        with self.lock:
            self.held -= size


class SpoolFile:
    """One download's spool file: written once (each write counted against the spool), then read by any number of
    `SpoolReader`s; closed, giving its bytes back, when the last reader is done and it is not kept."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._file = tempfile.TemporaryFile(dir=spool.folder)
        self.size = self.readers = 0
        self.kept = self.closed = False

    def write(self, data: bytes) -> None:
        self._spool.reserve(len(data))
        self.size += len(data)
        self._file.write(data)

    def reader(self) -> SpoolReader:
        with self._spool.lock:
            self._file.flush()
            self.readers += 1
            return SpoolReader(self, self._file.fileno())

    def done_reading(self) -> None:
        with self._spool.lock:
            self.readers -= 1
            if not self.readers and not self.kept:
                self.close()

    def close(self) -> None:
        with self._spool.lock:
            if not self.closed:
                self.closed = True
                self._file.close()
                self._spool.release(self.size)


class SpoolReader:
    """What waitress reads one download from (its ``wsgi.file_wrapper`` file): a place of its own in a shared spool
    file, which it tells is done when waitress closes it (the download sent, or its connection closed)."""

    def __init__(self, file: SpoolFile, descriptor: int) -> None:
        self._file, self._descriptor = file, descriptor
        self._position = 0
        self.closed = False

    @property
    def size(self) -> int:
        return self._file.size

    def read(self, size: int = -1) -> bytes:
        left = self._file.size - self._position
        data = os.pread(self._descriptor, left if size < 0 else min(size, left), self._position)
        self._position += len(data)
        return data

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._position = {os.SEEK_SET: 0, os.SEEK_CUR: self._position, os.SEEK_END: self._file.size}[whence] + offset
        return self._position

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._file.done_reading()

    def __del__(self) -> None:  # a response never sent (HEAD) is dropped without a close
        self.close()
