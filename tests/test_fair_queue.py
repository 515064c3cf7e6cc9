"""The page threads' queue of `hubtrace serve` (jobs.web.fair_queue): requests answered by visitor, weighted by how
much each address asked lately, on a clock the tests move; and waitress's dispatcher running it on real threads.
Deterministic: no false failures."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from jobs.web.fair_queue import FORGET_EVERY, HALF_LIFE_S, REMEMBERED, FairDispatcher, FairQueue


@dataclass
class Request:
    """What waitress queues: a connection (here, only its client address) with a request to answer."""

    address: str
    name: str
    answered: list[str] = field(default_factory=list)

    @property
    def addr(self) -> tuple[str, int]:
        return (self.address, 50000)

    def service(self) -> None:
        self.answered.append(self.name)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drained(queue: FairQueue) -> list[str]:
    return [queue.popleft().name for _ in range(len(queue))]


def test_a_visitor_asking_once_is_answered_before_the_rest_of_a_flood_that_came_first() -> None:
    queue = FairQueue(clock=Clock())
    for k in range(100):
        queue.append(Request("203.0.113.9", f"flood {k}"))
    queue.append(Request("198.51.100.1", "visitor"))
    order = drained(queue)
    assert order.index("visitor") == 1  # after the flood's first, which was waiting before it came
    assert [name for name in order if name != "visitor"] == [f"flood {k}" for k in range(100)]  # in their order


def test_visitors_asking_alike_take_turns_whatever_the_order_they_asked_in() -> None:
    queue = FairQueue(clock=Clock())
    for address in ("a", "b", "c"):
        for k in range(3):
            queue.append(Request(address, f"{address}{k}"))
    assert drained(queue) == ["a0", "b0", "c0", "a1", "b1", "c1", "a2", "b2", "c2"]


def test_an_address_served_more_lately_waits_behind_one_served_less_and_is_forgiven_with_time() -> None:
    clock = Clock()
    queue = FairQueue(clock=clock)
    for name, answers in (("busy", 10), ("quiet", 2)):
        for _ in range(answers):
            queue.append(Request(name, name))
            queue.popleft()
    queue.append(Request("busy", "busy again"))
    queue.append(Request("quiet", "quiet again"))
    assert drained(queue) == ["quiet again", "busy again"]
    # ten answers four half-lives ago count less than two answers now
    clock.now += 4 * HALF_LIFE_S
    for _ in range(2):
        queue.append(Request("quiet", "quiet"))
        queue.popleft()
    queue.append(Request("quiet", "quiet now"))
    queue.append(Request("busy", "busy before"))
    assert drained(queue) == ["busy before", "quiet now"]


def test_a_flood_from_ever_new_addresses_takes_turns_with_a_known_visitor_and_never_passes_it_for_ever() -> None:
    """24 clients each asking again as soon as answered, every request from an address never seen (each as light as an
    address can be), against a visitor who has asked 15 pages lately: the visitor's request waits for about one turn
    of each client, not for ever (a queue that put the least served address first never answered it)."""
    queue = FairQueue(clock=Clock())
    fresh = (f"10.0.{k >> 8}.{k & 255}" for k in range(1_000_000))
    for _ in range(15):
        queue.append(Request("198.51.100.1", "visitor before"))
        queue.popleft()
    for _ in range(24):
        queue.append(Request(next(fresh), "flood"))
    queue.append(Request("198.51.100.1", "visitor"))
    taken_before = 0
    while queue.popleft().name != "visitor":
        taken_before += 1
        queue.append(Request(next(fresh), "flood"))  # the client answered asks again, from a new address
        assert taken_before < 10_000
    assert 24 <= taken_before <= 2 * 24


def test_a_flood_from_ever_new_addresses_leaves_no_memory_behind() -> None:
    clock = Clock()
    queue = FairQueue(clock=clock)
    for k in range(3 * FORGET_EVERY):
        queue.append(Request(f"10.{k >> 16}.{(k >> 8) & 255}.{k & 255}", "one"))
        queue.popleft()
        clock.now += 0.05
    assert len(queue) == 0
    # the addresses of the last ten half-lives (100 s: 2,000 here), and those since the last sweep; not all 12,288
    assert queue.remembered < 2 * FORGET_EVERY


def test_waitress_threads_answer_from_the_fair_queue() -> None:
    """The dispatcher's own threads: a flood queued before them, one visitor's request after it; one thread answers
    them all, the visitor's second."""
    dispatcher = FairDispatcher()
    answered: list[str] = []
    for k in range(20):
        dispatcher.add_task(Request("203.0.113.9", f"flood {k}", answered))
    dispatcher.add_task(Request("198.51.100.1", "visitor", answered))
    done = threading.Event()
    dispatcher.add_task(type("Last", (), {"addr": ("192.0.2.1", 1), "service": lambda self: done.set()})())
    dispatcher.set_thread_count(1)
    assert done.wait(60)
    dispatcher.shutdown()
    assert answered[:2] == ["flood 0", "visitor"] and len(answered) == 21


def test_a_flood_of_new_addresses_faster_than_they_are_forgotten_is_remembered_up_to_a_bound() -> None:
    clock = Clock()
    queue = FairQueue(clock=clock)
    for k in range(REMEMBERED + 2 * FORGET_EVERY):
        queue.append(Request(f"10.{k >> 16}.{(k >> 8) & 255}.{k & 255}", "one"))
        queue.popleft()
        clock.now += 0.0001  # 74,000 addresses in 7 s
    assert REMEMBERED <= queue.remembered < REMEMBERED + FORGET_EVERY
