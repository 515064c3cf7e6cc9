"""Ray for tests: a cluster a fixture starts is its tests' alone, and what its workers print stays out of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ray_for_tests(**init: object) -> Iterator[None]:
    """``ray.init(**init)`` for a fixture's tests, shut down when they are done. Workers' output is not sent to
    this process (``log_to_driver=False``): Ray's driver prints it to whatever ``sys.stderr`` is when it arrives,
    which may be another test's captured stream (a CLI test's one-line refusal once held 42 lines of a worker's
    stack trace). It stays in the session's Ray logs."""
    import ray

    ray.init(log_to_driver=False, **init)
    try:
        yield
    finally:
        ray.shutdown()
