"""Bounded work per request: what one visitor of the SQL box or the downloads can make the server do.

Without bounds, four requests of one slow statement froze every page a minute after their clients had gone, and
one grew the server past 6 GB; eight table downloads whose clients never read held every page thread. So slow work
runs:

* in one of a few lanes, at a lower CPU priority than the threads that answer pages (on Linux; a download's writing
  gives way to them for the interpreter: jobs.web.priority): the SQL box has its lanes (`ServeLimits.sql_slots`),
  each a process of its own of bounded memory (`StatementLane`, jobs.web.statement_process: DuckDB builds rows
  outside its memory limit), the table downloads theirs (`ServeLimits.download_slots`), each a thread with its own
  reader (`Lane`); a request that finds every lane of its kind taken is told to come back (503), and the server has a
  thread for each lane beside the page threads, so pages keep answering whatever the lanes do;
* for at most `ServeLimits.query_seconds` of DuckDB's time (a SQL-box statement), and only while its client is
  there: a watchdog thread stops the statement (DuckDB's ``interrupt()``, or the lane's process killed) when the time
  is up or waitress says the client went away;
* on an engine of bounded memory, threads and spill space (`EngineLimits`, set when the database opens);
* and a download is written a few megabytes at a time to a spool file, its lane then free, and sent from the file
  (jobs.web.downloads, jobs.web.spool) to a client that must keep reading (jobs.web.channel).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from flask import abort, current_app, request

from jobs.web.database import Database
from jobs.web.limits import ServeLimits
from jobs.web.priority import PagesFirst
from jobs.web.spool import Spool
from jobs.web.statement_process import StatementProcess
from scanner.store import Store

SQL = "hubtrace_sql_lanes"
"""The key of the app's SQL-box `Gate` in ``app.extensions``."""
DOWNLOADS = "hubtrace_download_lanes"
"""The key of the app's table-download `Gate` in ``app.extensions``."""
SPOOL = "hubtrace_spool"
"""The key of the app's `Spool` in ``app.extensions``."""
POLL_S = 0.05
"""How often the watchdog looks at the clock and the client."""
LANE_NICENESS = 10
"""How much lower a lane's CPU priority is than the page threads' (Linux nice steps: 10 gives pages ~10x the CPU
share of a statement when both want it)."""
T = TypeVar("T")


class QueryStopped(Exception):
    """The watchdog stopped a statement: its time was up, or its client went away (the message says which)."""


class Lane:
    """One thread with its own reader of the database; slow work (a statement, a download's batches) runs on it while
    the request's own thread waits, so the lane's lower priority is the work's (DuckDB's, which does not hold the
    interpreter's lock; a download's rows are written as text on its request's thread: jobs.web.priority)."""

    def __init__(self, database: Database, name: str, pages: PagesFirst) -> None:
        self.pages = pages
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hubtrace-{name}",
                                          initializer=_lower_priority)
        self.store: Store = self._thread.submit(database.store).result()

    def run(self, work: Callable[[], T]) -> T:
        """``work()`` on the lane; the calling thread makes no page while it waits."""
        with self.pages.aside():
            return self._thread.submit(work).result()

    def release(self) -> None:
        """After a request's work (nothing to settle: a cursor closes with its answer)."""

    def close(self) -> None:
        self._thread.shutdown()


class StatementLane:
    """A lane of the SQL box: its statements run in a child process bounded in memory (jobs.web.statement_process),
    at a lower CPU priority; the request's own thread reads the answer from it, making no page meanwhile."""

    def __init__(self, process: StatementProcess, pages: PagesFirst) -> None:
        self.process, self.pages = process, pages

    def run(self, work: Callable[[], T]) -> T:
        with self.pages.aside():
            return work()

    def release(self) -> None:
        self.process.settle()

    def close(self) -> None:
        self.process.close()


def _lower_priority() -> None:
    """This thread a few nice steps down (Linux: a thread id names one thread; elsewhere it could name another
    process, so nothing is changed there)."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + LANE_NICENESS))


AnyLane = Lane | StatementLane


class Gate:
    """The lanes of one kind of slow work (SQL-box statements, or table downloads) and their watchdog, for one app.
    ``busy``: what a request that finds every lane taken is told; ``downloads_at_most``: the lanes downloads may hold
    at once (the SQL box keeps one for the statements of its page, which clients asking for downloads again and again
    would otherwise take)."""

    def __init__(self, limits: ServeLimits, lanes: list[AnyLane], busy: str, downloads_at_most: int | None = None
                 ) -> None:
        self.limits, self.busy = limits, busy
        self.downloads_at_most = len(lanes) if downloads_at_most is None else downloads_at_most
        self._lanes = lanes
        self._free = list(lanes)
        self._downloads = 0
        """Lanes held by downloads now."""
        self._lock = threading.Lock()

    @contextmanager
    def lane(self, download: bool = False, busy: str | None = None) -> Iterator[AnyLane]:
        """A free lane for the request's work; with none free, refuse at once (503, saying ``busy`` or the gate's own)
        instead of queueing behind slow work. A ``download`` may take a lane only while downloads hold fewer than
        `downloads_at_most`."""
        with self._lock:
            lane = None
            if self._free and not (download and self._downloads >= self.downloads_at_most):
                lane = self._free.pop()
                self._downloads += download
        if lane is None:
            abort(503, description=busy or self.busy)
        try:
            yield lane
        finally:
            try:
                lane.release()
            finally:
                with self._lock:
                    self._free.append(lane)
                    self._downloads -= download

    def run(self, lane: AnyLane, work: Callable[[], T], interrupt: Callable[[], None],
            seconds: float | None = None) -> T:
        """``work()`` on the lane under the watchdog: ``interrupt()`` when ``seconds`` (default: the query limit;
        infinity: none) are up or the client went away, and `QueryStopped` saying which instead of DuckDB's
        interruption."""
        seconds = self.limits.query_seconds if seconds is None else seconds
        gone = request.environ.get("waitress.client_disconnected", lambda: False)
        why: list[str] = []
        stop = threading.Event()

        def watch() -> None:
            deadline = time.monotonic() + seconds
            while not stop.wait(POLL_S):
                if gone():
                    why.append("its client went away")
                elif time.monotonic() >= deadline:
                    why.append(f"it ran for the {self.limits.query_seconds:g} s a statement may take here "
                               "(hubtrace serve --query-seconds)")
                if why:
                    interrupt()
                    return

        watchdog = threading.Thread(target=watch, name="hubtrace-watchdog", daemon=True)
        started = time.monotonic()
        watchdog.start()
        try:
            return lane.run(work)
        except Exception as exc:
            if why:  # said where the operator looks too: the statement itself is not repeated (it is anyone's text)
                sys.stderr.write(f"hubtrace serve: stopped a statement of {request.path} after "
                                 f"{time.monotonic() - started:.1f} s: {why[0]}\n")
                raise QueryStopped(f"stopped: {why[0]}") from exc
            raise
        finally:
            stop.set()
            watchdog.join()

    def close(self) -> None:
        for lane in self._lanes:
            lane.close()


def sql_and_download_gates(limits: ServeLimits, database: Database, pages: PagesFirst,
                           folder: Path) -> dict[str, Gate | Spool]:
    """The app's two gates and the downloads' spool, by their ``app.extensions`` keys, the lanes giving way to
    ``pages``; the SQL lanes' processes spill, and the spool keeps its files, in ``folder`` (a private folder of the
    server's)."""
    statements: list[AnyLane] = [
        StatementLane(StatementProcess(database.path, limits.engine, limits.statement_mb, folder / f"sql-{number}"),
                      pages) for number in range(limits.sql_slots)]
    downloads: list[AnyLane] = [Lane(database, f"download-{number}", pages) for number in range(limits.download_slots)]
    (folder / "spool").mkdir()
    return {
        SPOOL: Spool(limits.spool_bytes, folder / "spool"),
        SQL: Gate(limits, statements, f"The SQL box is answering {limits.sql_slots} other statements; try again in a "
                  "moment (the other pages answer meanwhile).",
                  downloads_at_most=max(1, limits.sql_slots - 1)),  # the last lane kept for the page's statements
        DOWNLOADS: Gate(limits, downloads, f"{limits.download_slots} table downloads are running; try again in a "
                        "moment (the other pages answer meanwhile)."),
    }


def spool() -> Spool:
    """The app's spool of downloads waiting for their clients (inside a request)."""
    return current_app.extensions[SPOOL]


def gate() -> Gate:
    """The app's SQL-box gate (inside a request)."""
    return current_app.extensions[SQL]


def download_gate() -> Gate:
    """The app's table-download gate (inside a request)."""
    return current_app.extensions[DOWNLOADS]
