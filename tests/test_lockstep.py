"""scanner.reading.lockstep: a callback-style producer read as a generator, never running ahead of its consumer."""

from __future__ import annotations

import threading

import pytest

from scanner.reading.lockstep import lockstep


def test_items_come_in_order_and_the_producer_waits_for_each_request() -> None:
    produced: list[int] = []

    def produce(emit) -> None:
        for i in range(5):
            produced.append(i)
            emit(i)

    seen = []
    for item in lockstep(produce):
        seen.append(item)
        assert produced == seen  # nothing produced beyond what was consumed: one item alive at a time
    assert seen == [0, 1, 2, 3, 4]


def test_an_error_in_the_producer_is_raised_in_the_consumer_after_what_came_before() -> None:
    def produce(emit) -> None:
        emit("first")
        raise ValueError("the model's forward failed")

    stream = lockstep(produce)
    assert next(stream) == "first"
    with pytest.raises(ValueError, match="forward failed"):
        next(stream)


def test_a_consumer_that_stops_early_ends_the_producer_thread() -> None:
    unwound = threading.Event()

    def produce(emit) -> None:
        try:
            for i in range(100):
                emit(i)
        finally:
            unwound.set()

    stream = lockstep(produce, name="test-lockstep")
    assert [next(stream), next(stream)] == [0, 1]
    stream.close()
    assert unwound.is_set()
    assert not any(t.name == "test-lockstep" and t.is_alive() for t in threading.enumerate())


def test_a_producer_that_emits_nothing_gives_an_empty_stream() -> None:
    assert list(lockstep(lambda emit: None)) == []
