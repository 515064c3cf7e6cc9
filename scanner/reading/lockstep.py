"""Iterate over what a callback-style producer emits, one item at a time, with the producer paused in between.

A model's own forward pass calls its layers; a fingerprint wants them as a generator that holds one block at a time.
`lockstep` runs the producer on a worker thread and hands each emitted item across only when the consumer asks for
the next one, so at most one item is alive on either side and the producer never runs ahead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class _Closed(BaseException):
    """Raised inside the producer when the consumer stopped iterating (a BaseException: producers catch Exception)."""


class _Channel(Generic[T]):
    def __init__(self) -> None:
        self.to_consumer = threading.Semaphore(0)
        self.to_producer = threading.Semaphore(0)
        self.item: T | None = None
        self.done = False
        self.error: BaseException | None = None
        self.closed = False

    def emit(self, item: T) -> None:
        self.item = item
        self.to_consumer.release()
        self.to_producer.acquire()
        if self.closed:
            raise _Closed


def lockstep(produce: Callable[[Callable[[T], None]], None], name: str = "hubtrace-lockstep") -> Iterator[T]:
    """Yield every item `produce(emit)` passes to `emit`, in order; the producer waits inside `emit` until the
    consumer asks for the next item. An exception in the producer is raised in the consumer; a consumer that stops
    early (closes the generator) makes the pending `emit` raise, so the producer unwinds and its thread ends."""
    channel: _Channel[T] = _Channel()

    def run() -> None:
        try:
            produce(channel.emit)
        except _Closed:
            return
        except BaseException as exc:  # handed to the consumer, which re-raises it
            channel.error = exc
        channel.done = True
        channel.to_consumer.release()

    worker = threading.Thread(target=run, name=name, daemon=True)
    worker.start()
    try:
        while True:
            channel.to_consumer.acquire()
            if channel.done:
                if channel.error is not None:
                    raise channel.error
                return
            item, channel.item = channel.item, None
            yield item  # type: ignore[misc]
            del item
            channel.to_producer.release()
    finally:
        if not channel.done:
            channel.closed = True
            channel.to_producer.release()
        worker.join()
