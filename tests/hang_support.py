"""A guard that turns a blocking call (a FIFO opened for reading waits forever for a writer) into a test failure."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def hang_guard(seconds: int) -> Iterator[None]:
    """Raise TimeoutError in the block when it has not finished after ``seconds``, rather than hang the suite."""
    def expire(*_: object) -> None:
        raise TimeoutError(f"blocked for {seconds} s: something waited forever (a FIFO opened?)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
