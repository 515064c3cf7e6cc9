"""Shared fixtures: the demo zoo and a set of independent bases, built once and cached between runs.

Both live under ``.hubtrace-cache/`` in the checkout (what ``make demo`` uses too), so a second test run
reuses them; the builders are file-locked, so parallel sessions wait for one build instead of racing.

Test tiers: a test is ``slow`` when it needs the trained zoo (or trains models itself) or a Ray cluster, by the
rule in ``pytest_collection_modifyitems`` (through any chain of fixtures), never by hand. ``make test-fast`` runs
``-m "not slow"``; ``make test`` runs everything.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from scanner.zoo import Zoo, build_zoo, train_independent_models

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"

#: 12 independent bases give 66 independent pairs, above the 50 the validity tests need.
N_INDEPENDENT = 12

#: Fixtures that make a test slow: the trained zoos (minutes to build on a fresh machine) and Ray clusters
#: (a local one in test_scan.py, a ``ray start`` head in test_ray_job_submit.py).
SLOW_FIXTURES = frozenset({"zoo", "independent_zoo", "local_ray", "cluster"})


#: Calls that train models: a test that trains its own small zoo is as slow as one that uses the cached zoo.
ZOO_TRAINERS = ("build_zoo(", "train_independent_models(")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test whose fixture closure reaches one of SLOW_FIXTURES or that calls a zoo trainer."""
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())) or _trains_models(item):
            item.add_marker(pytest.mark.slow)


def _trains_models(item: pytest.Item) -> bool:
    try:
        source = inspect.getsource(item.function)  # type: ignore[attr-defined]
    except (AttributeError, OSError, TypeError):
        return False
    return any(call in source for call in ZOO_TRAINERS)


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return build_zoo(CACHE / "zoo")


@pytest.fixture(scope="session")
def independent_zoo() -> Zoo:
    return train_independent_models(CACHE / "independent", n=N_INDEPENDENT)


@pytest.fixture(scope="session")
def s3_env():
    """One moto S3 server for the session, its AWS_* variables set in this process (and so inherited by the Ray
    nodes tests start): one per session because fsspec keeps one S3 client per process."""
    from tests.s3_support import environment, s3_server

    with s3_server() as variables, environment(variables):
        yield variables
