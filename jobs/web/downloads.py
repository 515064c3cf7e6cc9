"""Downloads (``/sql.csv``, ``/sql.json``, ``/tables/NAME.csv``, ``/tables/NAME.json``) made on a lane within
bounds, then sent from a spool file.

A download's rows come from DuckDB a few megabytes at a time (a SQL lane's process, or `Store.stream_as_text` on a
download lane), are written as CSV or JSON by the download's own request thread, giving way before each row while a
page is being made (jobs.web.priority), and go to a spool file a megabyte at a time, so a download's memory does not
grow with its size; the lane is then free, and waitress sends the file as the client takes it (jobs.web.spool); a
client that stops reading, or reads too slowly, is cut off (jobs.web.channel). The writing holds the interpreter's
lock, so it is not done at the lane's lower CPU priority: a thread that holds the lock and that the system runs last
holds up every page waiting for the lock. A
download ends before the row that would take it past its byte cap (`ServeLimits.download_bytes`, the SQL box's
downloads), a JSON one still a whole array. Values polars cannot hold (a date past year 262143 or 9999, DuckDB's
``test_all_types()``) make the whole answer DuckDB's text, as on the SQL page: the first frame decides, before the
response starts; a later frame that still cannot be written ends the download with an error, before any of it is
sent.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import polars as pl
from flask import Response, abort, request
from werkzeug.wsgi import wrap_file

from jobs.exports import FORMATS
from jobs.web.bounds import AnyLane, Gate
from jobs.web.spool import Spool, SpoolFull, SpoolReader
from jobs.web.statement_process import ProcessAnswer
from scanner.store.store import AnswerStream

Answer = AnswerStream | ProcessAnswer
"""An answer read a frame at a time: from the server's own reader (a table), or from a SQL lane's process."""

CHUNK_BYTES = 1 << 20
"""Bytes handed to waitress at a time."""
MIMETYPES = {"csv": "text/csv", "json": "application/json"}
RENDERING_ERRORS = (pl.exceptions.PolarsError, pl.exceptions.PanicException, ValueError, OverflowError)
"""What turning DuckDB's values into Python values and text can raise (polars' PanicException, which it raises on a
date past its range, derives from BaseException, so it is named here)."""


class Download:
    """One download: its first frame read and written before the response starts (so a refusal is still a 400), the
    rest as the client takes them, each read on the lane under the gate's watchdog (DuckDB's time counted against
    ``seconds``, default the query limit). ``held`` (the lane) is released however it ends.
    ``stream_of(as_text)`` opens the answer, run on the lane."""

    def __init__(self, gate: Gate, lane: AnyLane, held: ExitStack, stream_of: Callable[[bool], Answer],
                 fmt: str, *, seconds: float | None = None, max_bytes: int | None = None) -> None:
        self.gate, self.lane, self._held, self._fmt = gate, lane, held, fmt
        self.max_bytes = max_bytes
        self._seconds = gate.limits.query_seconds if seconds is None else seconds
        try:
            try:
                self._first = self._start(stream_of, as_text=False)
            except RENDERING_ERRORS:
                self._first = self._start(stream_of, as_text=True)
        except BaseException:
            held.close()
            raise

    def _start(self, stream_of: Callable[[bool], Answer], *, as_text: bool) -> list[bytes]:
        self.text, self.sent, self.cut = FORMATS[self._fmt](), 0, False
        self.seconds_left = self._seconds  # a try as text is a statement of its own
        self.stream = self.lane.run(lambda: stream_of(as_text))
        self._frames = iter(self.stream)
        try:
            first = self._next()
            return self._written(first, opening=True) if first is not None else []
        except BaseException:
            self.stream.close()
            raise

    def _next(self) -> pl.DataFrame | None:
        """The next frame (None after the last), read under the watchdog."""
        started = time.monotonic()
        try:
            return self.gate.run(self.lane, lambda: next(self._frames, None), self.stream.interrupt,
                                 max(self.seconds_left, 0.0))
        finally:
            self.seconds_left -= time.monotonic() - started

    def _written(self, frame: pl.DataFrame, *, opening: bool = False) -> list[bytes]:
        """The frame's rows as encoded chunks, short of the byte cap (``cut`` says so); the thread makes no page
        meanwhile, and gives way to those that do."""
        def work() -> list[bytes]:
            chunks, part, size = [], [], 0
            closing = len(self.text.closing.encode())
            for text in itertools.chain([self.text.opening(frame.columns)] if opening else [], self.text.rows(frame)):
                self.lane.pages.give_way()
                data = text.encode()
                if self.max_bytes is not None and self.sent + len(data) + closing > self.max_bytes:
                    self.cut = True
                    break
                part.append(data)
                size, self.sent = size + len(data), self.sent + len(data)
                if size >= CHUNK_BYTES:
                    chunks.append(b"".join(part))
                    part, size = [], 0
            return chunks + [b"".join(part)] if part else chunks

        with self.lane.pages.aside():
            return work()

    def response(self, filename: str, spool: Spool, headers: dict[str, str] | None = None,
                 keep: tuple[str, ...] | None = None) -> Response:
        """The download written whole to a spool file, its lane then free, and sent from the file by waitress's main
        loop as the client takes it (jobs.web.spool), saved under ``filename`` (a name the app made); kept in the
        spool under ``keep`` for later downloads of the same. A statement stopped midway raises here, before the
        response starts; a spool without room for it is a 503."""
        file = spool.file()
        try:
            for chunk in self.chunks():
                file.write(chunk)
        except SpoolFull as exc:
            file.close()
            abort(503, description=str(exc))
        except RENDERING_ERRORS as exc:  # a later frame than the one that decided how the answer is written
            file.close()
            abort(400, description=f"a value past the answer's first rows cannot be written here "
                                   f"({type(exc).__name__}); cast it to VARCHAR in the statement")
        except BaseException:
            file.close()
            raise
        if keep is not None:
            spool.keep(keep, file)
        return spooled(file.reader(), self._fmt, filename, headers)

    def chunks(self) -> Iterator[bytes]:
        """The whole download; the cursor and the lane released however it ends."""
        try:
            yield from self._first
            while not self.cut:
                frame = self._next()
                if frame is None:
                    break
                yield from self._written(frame)
            if self.text.closing:
                yield self.text.closing.encode()
        finally:
            self.stream.close()
            self._held.close()


def spooled(reader: SpoolReader, fmt: str, filename: str, headers: dict[str, str] | None = None) -> Response:
    """A download written before, sent from its spool file by waitress's main loop, saved under ``filename``."""
    return Response(wrap_file(request.environ, reader), mimetype=MIMETYPES[fmt], direct_passthrough=True,
                    headers={"Content-Disposition": f'attachment; filename="{filename}"',
                             "Content-Length": str(reader.size), **(headers or {})})
