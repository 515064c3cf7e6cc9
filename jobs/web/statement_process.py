"""The SQL box's statements run in a process of their own per lane, whose memory the system bounds, so that no
statement, whatever it builds, grows the server.

DuckDB's ``memory_limit`` bounds its buffer pool, not the vectors a statement's operators hand each other: a chunk
of up to 2,048 rows is built whole, strings and lists included, outside it. Measured (DuckDB 2.0, one thread, limit
512 MB): ``SELECT repeat('x', 20000000) AS s FROM range(100)`` peaks at 2.1 GB in the reader (the server went from
554 MB to 4.4 GB for its HTML page), and no setting bounds it; a row cap does not bound bytes either (100 rows here).
So each SQL lane is a child process (``python -m jobs.web.statement_process``) that opens the database read-only,
sealed as the server's own readers are, and runs the lane's statements under a hard data limit (``RLIMIT_DATA``:
its heap and every private mapping, which DuckDB's and Arrow's allocations are); past it an allocation fails and
the statement ends with DuckDB's or Arrow's out-of-memory error, or the child dies, and either way the visitor is
told in one line. The answer comes back through a pipe in messages of at most `MESSAGE_BYTES` (Arrow IPC), so the
server holds at most one such message per lane; a row larger than that is refused. The pipe's own small buffer
makes the child wait while the server does not read. A statement stopped (its time, its client gone, a download cut
at its byte cap) is stopped by killing its child, and the lane starts another.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import duckdb
import polars as pl
import pyarrow as pa

from scanner.engine_limits import EngineLimits
from scanner.errors import without_sql_excerpt
from scanner.store import Store, StoreError, queries
from scanner.store.store import private_folders_hidden

MESSAGE_BYTES = 16 << 20
"""The most Arrow bytes one message carries (and so the largest row an answer may have)."""
HEADER = struct.Struct(">cQ")
"""A message: its kind and its length, then that many bytes."""
BATCH, CUT, DONE, REFUSED, READY = b"B", b"C", b"D", b"E", b"R"
"""Rows (an Arrow IPC stream); the answer ends at the byte budget asked for; the answer ends; a one-line refusal;
the child has opened the database and waits for statements."""
NICENESS = 10
"""How much lower the child's CPU priority is than the server's (the page threads')."""
MEMORY_SHARE = 2
"""DuckDB's own memory limit in the child is at most this fraction of its data limit: the rest is for what DuckDB
builds outside its limit, Arrow's batches and the interpreter (about 250 MB once DuckDB, Arrow and polars are
loaded)."""


class Refused(Exception):
    """The statement's answer, in one line a visitor may read: refused, failed in DuckDB, or too large."""


def refusal(error: BaseException, folder: Path) -> str:
    """The refusal on one line, without DuckDB's ``LINE 1: ... ^`` excerpt, and without the server's own folders (its
    home directory, DuckDB's temporary folder of any lane: ``folder``'s siblings), which DuckDB names in some errors
    (``duckdb_extensions()``, a file in the temporary folder another lane named)."""
    text = without_sql_excerpt(error)
    text = private_folders_hidden(text if isinstance(error, StoreError) else f"SQL: {text}")
    lanes = re.escape(str(folder.parent)) + r"/[\w.-]+/hubtrace-query-[\w.-]+"
    return re.sub(lanes + r"(?=/|$|[\s\"'])", "<temporary folder>", text)


def out_of_memory(data_mb: int) -> str:
    return (f"Out of Memory: the statement needs more than the {data_mb} MB of memory a statement may use here "
            "(hubtrace serve --statement-mb): its rows are too large, or it holds too much at once; select fewer or "
            "narrower columns, or fewer rows (LIMIT)")


ROW_TOO_LARGE = (f"the answer's rows are larger than the {MESSAGE_BYTES >> 20} MB the server takes at a time: select "
                 "less of each row (fewer columns, substr, list_slice)")


class StatementProcess:
    """One lane's child process, started at once and again whenever it was killed or died. ``folder``: a private
    folder of the server's for the child's spill files (removed with the child, which the system may kill before it
    cleans up)."""

    def __init__(self, db: Path, engine: EngineLimits, data_mb: int, folder: Path) -> None:
        self.db, self.engine, self.data_mb, self.folder = db, engine, data_mb, folder
        self.process: subprocess.Popen | None = None
        self.current: ProcessAnswer | None = None
        """The answer last asked for."""
        self.killed = False
        self.ready = False
        self._start()

    def _start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        memory = _memory_limit(self.engine.memory, self.data_mb)
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(self.db), str(self.data_mb), memory, self.engine.spill,
             str(self.folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
        self.killed = self.ready = False

    def answer(self, sql: str, *, as_text: bool, limit: int | None, batch_rows: int,
               max_bytes: int | None = None) -> ProcessAnswer:
        """Ask the child for ``sql``'s answer (its first ``limit`` rows, and no more than ``max_bytes`` of them),
        once it is ready (a child started after the last statement was stopped loads for a second or two: not the
        statement's time); nothing more is read until the answer is iterated."""
        if self.killed or self.process.poll() is not None:
            self.restart()
        if not self.ready:
            kind, payload = self.read()
            if kind != READY:
                self.kill()
                raise Refused(bytes(payload).decode() if kind == REFUSED else out_of_memory(self.data_mb))
            self.ready = True
        request = json.dumps({"sql": sql, "as_text": as_text, "limit": limit, "batch_rows": batch_rows,
                              "max_bytes": max_bytes}) + "\n"
        data = memoryview(request.encode())
        try:
            while data:
                data = data[self.process.stdin.write(data):]
        except OSError:  # it died between statements: the answer's first read says so
            pass
        self.current = ProcessAnswer(self)
        return self.current

    def settle(self) -> None:
        """After a lane's request: a child left in the middle of an answer is killed, and a new one started in its
        place (it loads while the lane waits for its next statement)."""
        if self.current is not None and not self.current.ended:
            self.kill()
        self.current = None
        if self.killed or self.process.poll() is not None:
            self.restart()

    def kill(self) -> None:
        """Stop whatever the child does (from any thread): its pipe ends, and the lane starts another child."""
        self.killed = True
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        self.kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            pipe.close()
        shutil.rmtree(self.folder, ignore_errors=True)

    def read(self) -> tuple[bytes, memoryview]:
        """The child's next message; `Refused` if it died meanwhile (a crash of the child is a statement that needed
        more than its memory: nothing else it runs can kill it)."""
        header = _read_exactly(self.process.stdout, HEADER.size)
        kind, length = HEADER.unpack(header) if header is not None else (b"", 0)
        payload = _read_exactly(self.process.stdout, length) if kind and length <= 2 * MESSAGE_BYTES else None
        if payload is None:
            self.kill()
            raise Refused(out_of_memory(self.data_mb))
        return kind, payload


class ProcessAnswer:
    """An answer of a `StatementProcess` as polars frames (at least one, empty for an empty answer, so its columns
    are known), the `AnswerStream` of the server's own readers. ``cut``: it ended at the byte budget asked for.
    Abandoned before its end (`close`), its child is killed: it may still be writing."""

    def __init__(self, process: StatementProcess) -> None:
        self._process = process
        self.cut = self.ended = False

    def __iter__(self) -> Iterator[pl.DataFrame]:
        sent = False
        while not self.ended:
            kind, payload = self._process.read()
            if kind == BATCH:
                sent = True
                yield pl.from_arrow(pa.ipc.open_stream(pa.py_buffer(payload)).read_all())
                continue
            self.ended = True
            if kind == REFUSED:
                raise Refused(bytes(payload).decode())
            self.cut = kind == CUT
        if not sent:
            yield pl.DataFrame()

    def interrupt(self) -> None:
        self._process.kill()

    def close(self) -> None:
        if not self.ended:
            self._process.kill()


def _read_exactly(pipe: BinaryIO, size: int) -> memoryview | None:
    """``size`` bytes of the pipe, or None if it ends first."""
    data = memoryview(bytearray(size))
    got = 0
    while got < size:
        count = pipe.readinto(data[got:])
        if not count:
            return None
        got += count
    return data


def _memory_limit(memory: str, data_mb: int) -> str:
    """The smaller of the server's DuckDB memory limit and `MEMORY_SHARE` of the child's data limit."""
    share = data_mb // MEMORY_SHARE
    found = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?)b?\s*", memory, re.IGNORECASE)
    if found is None:
        return memory  # DuckDB says what is wrong with it when the child opens the database
    number, unit, binary = float(found.group(1)), found.group(2).lower(), found.group(3)
    scale = (1024 if binary else 1000) ** " kmgt".index(unit or " ")
    return f"{min(number * scale / (1 << 20), share):.0f}MiB"


# the child ---------------------------------------------------------------------------------------------------


def _send(out: BinaryIO, kind: bytes, payload: bytes = b"") -> None:
    out.write(HEADER.pack(kind, len(payload)))
    out.write(payload)
    out.flush()


def _ipc(batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batches[0].schema) as writer:
        for batch in batches:
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _pieces(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    """The batch in slices of at most `MESSAGE_BYTES` (a slice costs nothing); `ROW_TOO_LARGE` for a row above it."""
    if batch.nbytes <= MESSAGE_BYTES:
        yield batch
    elif batch.num_rows == 1:
        raise Refused(ROW_TOO_LARGE)
    else:
        half = batch.num_rows // 2
        yield from _pieces(batch.slice(0, half))
        yield from _pieces(batch.slice(half))


def _answer(store: Store, request: dict, out: BinaryIO) -> None:
    """One statement's answer as messages: batches of up to ``batch_rows`` rows and `MESSAGE_BYTES`, ending at
    ``max_bytes`` (`CUT`) or the answer's end (`DONE`)."""
    stream = queries.read_only_stream(store, request["sql"], as_text=request["as_text"], limit=request["limit"],
                                      batch_rows=request["batch_rows"])
    budget = request["max_bytes"]
    pending: list[pa.RecordBatch] = []
    rows = size = 0
    for batch in stream.arrow_batches():
        for piece in _pieces(batch):
            if budget is not None and piece.nbytes > budget:
                fits = next((n for n in range(piece.num_rows, 0, -1) if piece.slice(0, n).nbytes <= budget), 0)
                if fits or not pending:
                    pending.append(piece.slice(0, fits))
                _send(out, BATCH, _ipc(pending))
                _send(out, CUT)
                return
            if pending and size + piece.nbytes > MESSAGE_BYTES:
                _send(out, BATCH, _ipc(pending))
                pending, rows, size = [], 0, 0
            pending.append(piece)
            rows, size = rows + piece.num_rows, size + piece.nbytes
            budget = None if budget is None else budget - piece.nbytes
            if rows >= request["batch_rows"] or size >= MESSAGE_BYTES // 4:
                _send(out, BATCH, _ipc(pending))
                pending, rows, size = [], 0, 0
    if pending:
        _send(out, BATCH, _ipc(pending))
    _send(out, DONE)


def main(db: str, data_mb: str, memory: str, spill: str, folder: str) -> None:
    """Answer the statements that come on stdin, one JSON request a line, on stdout (which nothing else writes:
    anything printed goes to stderr, the server's)."""
    out = os.fdopen(os.dup(1), "wb", buffering=1 << 16)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of the server: the server closes its children
    os.nice(NICENESS)
    limit = int(data_mb) << 20
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    tempfile.tempdir = folder  # DuckDB's spill folder goes in it, which the server removes
    try:
        store = Store(db, read_only=True, limits=EngineLimits(memory, 1, spill))
    except (StoreError, duckdb.Error) as exc:
        _send(out, REFUSED, refusal(exc, Path(folder)).encode())
        return
    _send(out, READY)
    for line in sys.stdin.buffer:
        try:
            _answer(store, json.loads(line), out)
        except Refused as exc:
            _send(out, REFUSED, str(exc).encode())
        except (MemoryError, duckdb.OutOfMemoryException, pa.ArrowMemoryError):
            _send(out, REFUSED, out_of_memory(int(data_mb)).encode())
        except Exception as exc:  # Arrow's failed allocations in DuckDB come as OSError
            text = refusal(exc, Path(folder))
            _send(out, REFUSED, (out_of_memory(int(data_mb)) if "Out of Memory" in text else text).encode())


if __name__ == "__main__":
    main(*sys.argv[1:])
