"""Shared fixtures: the demo zoo and a set of independent bases, built once and cached between runs.

Both live under ``.hubtrace-cache/`` in the checkout (what ``make demo`` uses too), so a second test run
reuses them; the builders are file-locked, so parallel sessions wait for one build instead of racing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.zoo import Zoo, build_zoo, train_independent_models

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"

#: 12 independent bases give 66 independent pairs, above the 50 the validity tests need.
N_INDEPENDENT = 12


@pytest.fixture(scope="session")
def zoo() -> Zoo:
    return build_zoo(CACHE / "zoo")


@pytest.fixture(scope="session")
def independent_zoo() -> Zoo:
    return train_independent_models(CACHE / "independent", n=N_INDEPENDENT)
