"""A least-recently-used cache bounded by the bytes its keys and values take in memory, not by how many it keeps:
what a visitor can make the app keep grows with the text of a hub (a card's licence, a model's id), so a bound in
entries is no bound in memory."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


def size_in_memory(key: tuple, value: object) -> int:
    """Bytes an entry holds: its value and each part of its key, as ``sys.getsizeof`` counts them (a str's
    characters included, at the width CPython stores them in)."""
    return sys.getsizeof(value) + sum(sys.getsizeof(part) for part in key)


class ByteBoundedCache(Generic[V]):
    """Values made once per key and kept while the entries kept, together, take at most ``max_bytes``; the least
    recently used go first, and a value bigger than the whole bound is made for each request and never kept.
    Thread-safe; two threads asking for the same missing key may both make it (``make`` serialises itself if it
    must)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple, tuple[V, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """Bytes the entries kept now take (`size_in_memory`)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[Hashable, ...], make: Callable[[], V]) -> V:
        """The value kept for ``key``, or ``make()``'s, kept if it fits."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key][0]
        value = make()
        size = size_in_memory(key, value)
        with self._lock:
            if size <= self.max_bytes and key not in self._entries:
                self._entries[key] = (value, size)
                self._bytes += size
                while self._bytes > self.max_bytes:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self._bytes -= dropped
        return value
