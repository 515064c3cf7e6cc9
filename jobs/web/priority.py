"""Pages before downloads in the interpreter. A download's rows are written as CSV or JSON in Python, which holds
the interpreter's lock (the GIL) whatever the lane's CPU priority, so the threads making pages waited for it.

Measured on the load bench (bench/bench_serve_load.py, downloads phase, 2 cores): four downloads writing at once
(the 25.5 MB `pair_tests` table costs 1.46 s of CPU on its lane, 1.15 s of it Python's ``csv``; the 26 MB SQL
join 2.37 s, 1.83 s of it ``csv``) made a thread that sleeps 1 ms get the lock back 1.5-5 ms late at the median
and 45-76 ms late at the 99th percentile (0.1 and 5 ms without them) for the ten seconds they wrote, and pages
took up to 1.2 s. So a download writing rows gives way (`give_way`, before each row) while a request thread is
making a page: it waits until none is, for at most ``wait_s``, and then writes for ``turn_s`` before it gives way
again, so pages come first and a download still moves while they never stop. A request thread that waits for a lane
(a SQL statement, a download's batch) or writes a download makes no page meanwhile (`aside`), so a download never
waits for itself. The writing is done at the pages' CPU priority (on the download's request thread, not on its
lane): a writer the system runs last, holding the lock or the pages' count when it is put aside, held up the pages
waiting for either whenever the machine was busy (pages p99 1.2 s against 0.6-0.9 s with one download read at full
speed, at load 6-7).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PAGES = "hubtrace_pages"
"""The key of the app's `PagesFirst` in ``app.extensions``."""
WAIT_S = 0.2
"""The longest a download waits for the pages being made before it writes anyway."""
TURN_S = 0.01
"""How long a download that waited ``WAIT_S`` in vain writes before it gives way again."""


class PagesFirst:
    """Which threads are making a page now, and the downloads' way of letting them have the interpreter."""

    def __init__(self, wait_s: float = WAIT_S, turn_s: float = TURN_S) -> None:
        self.wait_s, self.turn_s = wait_s, turn_s
        self._making: set[int] = set()
        """The ids of the threads making a page now."""
        self._changed = threading.Condition()
        self._turn = threading.local()
        """A writing thread's ``until``: when its turn of writing regardless ends."""

    @contextmanager
    def page(self) -> Iterator[None]:
        """The calling thread makes a page (a request, up to its response's body) while the block runs."""
        thread = threading.get_ident()
        with self._changed:
            self._making.add(thread)
        try:
            yield
        finally:
            self._left(thread)

    @contextmanager
    def aside(self) -> Iterator[None]:
        """The calling thread waits for a lane or writes a download while the block runs: it makes no page
        meanwhile."""
        thread = threading.get_ident()
        making = thread in self._making
        if making:
            self._left(thread)
        try:
            yield
        finally:
            if making:
                with self._changed:
                    self._making.add(thread)

    def _left(self, thread: int) -> None:
        with self._changed:
            self._making.discard(thread)
            if not self._making:
                self._changed.notify_all()

    @property
    def pages_being_made(self) -> int:
        return len(self._making)

    def give_way(self) -> None:
        """Called by a download between small steps of Python work: returns at once while no page is being made (or in
        the writer's turn), else once none is, or after ``wait_s``, starting a turn of ``turn_s``."""
        if not self._making or time.monotonic() < getattr(self._turn, "until", 0.0):
            return
        with self._changed:
            if not self._changed.wait_for(lambda: not self._making, timeout=self.wait_s):
                self._turn.until = time.monotonic() + self.turn_s
