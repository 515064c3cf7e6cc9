"""The requests waiting for a page thread, answered by visitor, the least served first.

waitress answers waiting requests in the order they came: one visitor asking a thousand times a second (each request
cheap, a 404, from many connections) put a thousand requests ahead of everyone else's. 200 addresses each holding 16
keep-alive connections that asked for a missing page, idled and asked again when reopened, queued thousands of
requests in waves, and an honest visitor's page waited 1.4-2.9 s at the median behind them (bench/redteam/serve44).
Here the next request answered is that of the address served least lately (a count of its answers that halves every
`HALF_LIFE_S`), so a visitor who asks less than every other one waits for no one's queue but the requests being
answered, however many others there are and however fast they ask; a visitor asking as fast as the others waits one
request of each. Among requests of one address the order is the order they came.

Behind a reverse proxy every request comes from the proxy's address, and the queue is waitress's again (first come,
first served); the proxy then has to share its clients' turns (docs/serve.md).
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from collections.abc import Callable

from waitress.task import ThreadedTaskDispatcher

HALF_LIFE_S = 10.0
"""How fast an address's past answers stop counting against it: a visitor that asked much a minute ago and little
since is served as one that asks little."""
FORGOTTEN = 10 * math.log(2)
"""An address whose count has halved ten times since its last answer (below a thousandth) is forgotten (as new)."""
FORGET_EVERY = 4096
"""Answers between two sweeps of the forgotten addresses (each sweep looks at every address remembered)."""
REMEMBERED = 1 << 16
"""The most addresses a sweep keeps, those served most: a flood from ever new addresses is forgotten sooner (each of
its addresses was served little, and is then served as a new one, which it nearly is)."""


def _address(task: object) -> str:
    """The client address of a waiting request (a waitress channel); one key for every client of a Unix socket."""
    addr = getattr(task, "addr", None)
    return str(addr[0]) if isinstance(addr, tuple) and addr else ""


class LeastServedFirst:
    """The queue of waitress's dispatcher (``append``, ``popleft``, its length): the next task is the oldest of the
    address with the lowest decayed count of answers, ties in the order the addresses' first waiting requests came.

    A count is kept as the logarithm of the sum of ``exp(rate * t)`` over its answers' times ``t``: every count decays
    by the same factor, so their order only changes when one is served, and each address waits in a heap under the
    count it had when it was last served, which stays exact."""

    def __init__(self, half_life_s: float = HALF_LIFE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = math.log(2) / half_life_s
        self._clock = clock
        self._waiting: dict[str, deque[object]] = {}
        """Each address with requests waiting, oldest first."""
        self._turns: list[tuple[float, int, str]] = []
        """A heap of (count, order of arrival, address), one entry for each address in `_waiting`."""
        self._served: dict[str, float] = {}
        """The logarithm of each remembered address's count of answers (absent: none)."""
        self._arrivals = itertools.count()
        self._length = 0
        self._until_forgetting = FORGET_EVERY

    def __len__(self) -> int:
        return self._length

    @property
    def remembered(self) -> int:
        """Addresses whose count is kept (those served within the last few minutes, and those waiting)."""
        return len(self._served)

    def append(self, task: object) -> None:
        """A request waiting for a thread (waitress queues the channel that holds it)."""
        address = _address(task)
        waiting = self._waiting.get(address)
        if waiting is None:
            waiting = self._waiting[address] = deque()
            heapq.heappush(self._turns, (self._served.get(address, -math.inf), next(self._arrivals), address))
        waiting.append(task)
        self._length += 1

    def popleft(self) -> object:
        """The next request to answer, counted as an answer to its address."""
        _, _, address = heapq.heappop(self._turns)
        waiting = self._waiting[address]
        task = waiting.popleft()
        self._length -= 1
        now = self._rate * self._clock()
        count = self._served[address] = float(math.log(math.exp(self._served.get(address, -math.inf) - now) + 1)
                                              + now)
        if waiting:
            heapq.heappush(self._turns, (count, next(self._arrivals), address))
        else:
            del self._waiting[address]
        self._until_forgetting -= 1
        if self._until_forgetting <= 0:
            self._forget(now)
        return task

    def _forget(self, now: float) -> None:
        """Drop the counts too small to matter, so that a flood from ever new addresses leaves no memory behind."""
        self._until_forgetting = FORGET_EVERY
        kept = [(address, count) for address, count in self._served.items()
                if count > now - FORGOTTEN or address in self._waiting]
        if len(kept) > REMEMBERED:
            kept = heapq.nlargest(REMEMBERED, kept, key=lambda remembered: remembered[1])
        self._served = dict(kept)


class FairDispatcher(ThreadedTaskDispatcher):
    """waitress's dispatcher (its threads, their lock and condition) with `LeastServedFirst` for its queue."""

    def __init__(self) -> None:
        super().__init__()
        self.queue = LeastServedFirst()  # type: ignore[assignment]  # the deque methods waitress calls
