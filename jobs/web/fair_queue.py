"""The requests waiting for a page thread, answered by visitor: each address's turns come the more slowly the more it
has asked lately, and no address, new or known, can be passed for ever.

waitress answers waiting requests in the order they came: one visitor asking a thousand times a second (each request
cheap, a 404, from many connections) put a thousand requests ahead of everyone else's. 200 addresses each holding 16
keep-alive connections that asked for a missing page, idled and asked again when reopened, queued thousands of
requests in waves, and an honest visitor's page waited 1.4-2.9 s at the median behind them (bench/redteam/serve44).

Here the queue is start-time fair queueing (Goyal, Vin and Cheng, 1996) over client addresses, with a weight: each
request gets a tag, its address's previous tag or the queue's virtual time (the tag of the request last taken),
whichever is later, plus ``1 + asked / SHARE_SCALE``, where ``asked`` is the address's count of requests (halving every
`HALF_LIFE_S`); the smallest tag is answered first, ties in the order they came. So

* a visitor who has asked less lately than the others is answered before them (a 404 flood from a few addresses
  weighs its own turns down, not the visitor's);
* requests of one address keep their order, and an address asking many at once waits a turn for each;
* a new address starts at the virtual time, not ahead of it: a flood from ever new addresses (each one never seen,
  so each as light as can be) takes turns with a known visitor instead of passing it for ever (a first version
  answered the least served address first, and 24 clients each asking from a new address every time kept a visitor
  waiting 3.5 s at the median and 24 s at worst: bench/redteam/serve45).

A visitor with a request waiting waits at most for the requests tagged below its own: from each other address with
requests waiting, about ``its own weight`` of them. Behind a reverse proxy every request comes from the proxy's address,
and the queue is waitress's again (first come, first served); the proxy then has to share its clients' turns
(docs/serve.md).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable

from waitress.task import ThreadedTaskDispatcher

HALF_LIFE_S = 10.0
"""How fast an address's past requests stop counting against it: a visitor that asked much a minute ago and little
since is served as one that asks little."""
SHARE_SCALE = 10.0
"""Requests counted (with `HALF_LIFE_S`) that double an address's weight: a visitor reading a page a second weighs
about 2.5, an address asking ten a second about 16, one never seen 1."""
FORGOTTEN = 10 * math.log(2)
"""An address whose count has halved ten times since its last request (below a thousandth) is forgotten (as new)."""
FORGET_EVERY = 4096
"""Requests taken between two sweeps of the forgotten addresses (each sweep looks at every address remembered)."""
REMEMBERED = 1 << 16
"""The most addresses a sweep keeps, those that asked most: a flood from ever new addresses is forgotten sooner (each
of its addresses asked little, and is then treated as a new one, which it nearly is)."""


def _address(task: object) -> str:
    """The client address of a waiting request (a waitress channel); one key for every client of a Unix socket."""
    addr = getattr(task, "addr", None)
    return str(addr[0]) if isinstance(addr, tuple) and addr else ""


class FairQueue:
    """The queue of waitress's dispatcher (``append``, ``popleft``, its length), in the order of weighted start-time
    fair queueing over client addresses (the module's docstring).

    An address's count is kept as the logarithm of the sum of ``exp(rate * t)`` over the times ``t`` it asked, so that
    counts decay without being touched."""

    def __init__(self, half_life_s: float = HALF_LIFE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = math.log(2) / half_life_s
        self._clock = clock
        self._waiting: list[tuple[float, int, object]] = []
        """A heap of (tag, order of arrival, task)."""
        self._virtual = 0.0
        """The tag of the request taken last."""
        self._last_tag: dict[str, float] = {}
        """Each address's latest tag, while it is ahead of the virtual time (else it counts as the virtual time)."""
        self._asked: dict[str, float] = {}
        """The logarithm of each remembered address's count of requests (absent: none)."""
        self._arrivals = itertools.count()
        self._until_forgetting = FORGET_EVERY

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def remembered(self) -> int:
        """Addresses whose count is kept (those that asked within the last few minutes)."""
        return len(self._asked)

    def append(self, task: object) -> None:
        """A request waiting for a thread (waitress queues the channel that holds it). Its turn takes 1 for an address
        never seen, more the more the address asked lately."""
        address = _address(task)
        now = self._rate * self._clock()
        asked = math.exp(self._asked.get(address, -math.inf) - now)  # the address's decayed count of requests
        tag = max(self._virtual, self._last_tag.get(address, self._virtual)) + 1.0 + asked / SHARE_SCALE
        self._last_tag[address] = tag
        self._asked[address] = float(math.log(asked + 1) + now)
        heapq.heappush(self._waiting, (tag, next(self._arrivals), task))

    def popleft(self) -> object:
        """The request with the smallest tag (the earliest of equal ones)."""
        tag, _, task = heapq.heappop(self._waiting)
        self._virtual = tag
        self._until_forgetting -= 1
        if self._until_forgetting <= 0:
            self._forget()
        return task

    def _forget(self) -> None:
        """Drop the tags the virtual time has passed and the counts too small to matter, so that a flood from ever new
        addresses leaves no memory behind."""
        self._until_forgetting = FORGET_EVERY
        self._last_tag = {address: tag for address, tag in self._last_tag.items() if tag > self._virtual}
        now = self._rate * self._clock()
        kept = [(address, count) for address, count in self._asked.items() if count > now - FORGOTTEN]
        if len(kept) > REMEMBERED:
            kept = heapq.nlargest(REMEMBERED, kept, key=lambda remembered: remembered[1])
        self._asked = dict(kept)


class FairDispatcher(ThreadedTaskDispatcher):
    """waitress's dispatcher (its threads, their lock and condition) with `FairQueue` for its queue."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = FairQueue()  # type: ignore[assignment]  # the deque methods waitress calls

    def add_task(self, task: object) -> None:
        """waitress's, less its warning for every task queued beyond the idle threads: a flood of 4,000 connections
        queued thousands, and the main loop spent an eighth of its time writing "Task queue depth is N" while it held
        the lock the threads take their tasks under (bench/redteam/serve45, unread_pages)."""
        with self.lock:
            self.queue.append(task)
            self.queue_cv.notify()
