"""Bounded work per request: what one visitor of the SQL box can make the server do.

Without bounds, four requests of one slow statement froze every page a minute after their clients had gone, and
one grew the server past 6 GB. So the SQL box runs a statement:

* in one of a few lanes (`ServeLimits.sql_slots`), each a thread of its own with its own reader, at a lower CPU
  priority than the threads that answer pages (on Linux): a request that finds every lane taken is told to come
  back (503), and pages keep answering while statements run;
* for at most `ServeLimits.query_seconds` of DuckDB's time, and only while its client is there: a watchdog thread
  interrupts the statement (DuckDB's ``interrupt()``) when the time is up or waitress says the client went away;
* on an engine of bounded memory, threads and spill space (`EngineLimits`, set when the database opens);
* and a download streams at most `ServeLimits.download_rows` rows, a batch at a time.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from flask import abort, current_app, request

from jobs.web.database import Database
from jobs.web.limits import ServeLimits
from scanner.store import Store

EXTENSION = "hubtrace_limits"
"""The key of the app's `SqlGate` in ``app.extensions``."""
POLL_S = 0.05
"""How often the watchdog looks at the clock and the client."""
LANE_NICENESS = 10
"""How much lower a lane's CPU priority is than the page threads' (Linux nice steps: 10 gives pages ~10x the CPU
share of a statement when both want it)."""
T = TypeVar("T")


class QueryStopped(Exception):
    """The watchdog stopped a statement: its time was up, or its client went away (the message says which)."""


class Lane:
    """One SQL-box thread with its own reader of the database; a statement runs on it while the request's own
    thread waits, so the lane's lower priority is the statement's."""

    def __init__(self, database: Database, number: int) -> None:
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"hubtrace-sql-{number}",
                                          initializer=_lower_priority)
        self.store: Store = self._thread.submit(database.store).result()

    def run(self, work: Callable[[], T]) -> T:
        return self._thread.submit(work).result()

    def close(self) -> None:
        self._thread.shutdown()


def _lower_priority() -> None:
    """This thread a few nice steps down (Linux: a thread id names one thread; elsewhere it could name another
    process, so nothing is changed there)."""
    if sys.platform == "linux":
        thread = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, thread, min(19, os.getpriority(os.PRIO_PROCESS, thread) + LANE_NICENESS))


class SqlGate:
    """The SQL box's lanes and watchdog for one app."""

    def __init__(self, limits: ServeLimits, database: Database) -> None:
        self.limits = limits
        self._lanes = [Lane(database, number) for number in range(limits.sql_slots)]
        self._free: queue.SimpleQueue[Lane] = queue.SimpleQueue()
        for lane in self._lanes:
            self._free.put(lane)

    @contextmanager
    def lane(self) -> Iterator[Lane]:
        """A free lane for the request's statement; with none free, refuse at once (503) instead of queueing
        behind slow statements."""
        try:
            lane = self._free.get_nowait()
        except queue.Empty:
            abort(503, description=f"The SQL box is answering {self.limits.sql_slots} other statements; try again "
                                   "in a moment (the other pages answer meanwhile).")
        try:
            yield lane
        finally:
            self._free.put(lane)

    def run(self, lane: Lane, work: Callable[[], T], interrupt: Callable[[], None],
            seconds: float | None = None) -> T:
        """``work()`` on the lane under the watchdog: ``interrupt()`` when ``seconds`` (default: the query limit)
        are up or the client went away, and `QueryStopped` saying which instead of DuckDB's interruption."""
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


def gate() -> SqlGate:
    """The app's gate (inside a request)."""
    return current_app.extensions[EXTENSION]
