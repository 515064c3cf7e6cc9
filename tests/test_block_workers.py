"""Blocks of a pair compared on several threads give exactly the one-thread result, with and without the
sequential design."""

from __future__ import annotations

import pytest

from scanner.pairs.fingerprint_compare import compare_fingerprints, parallel_map
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_pair
from tests.synthetic_fingerprints import template_fingerprint


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), 32)
    return synthetic_pair(template, 6, 160, {0: 0, 2: 2, 5: 5}, seed=11)


def test_parallel_map_keeps_order():
    assert parallel_map(lambda x: x * x, list(range(50)), 4) == [x * x for x in range(50)]
    assert parallel_map(str, [], 4) == []


@pytest.mark.parametrize("design", [None, SequentialDesign(), SequentialDesign(2, -300.0, -0.5)])
def test_threads_give_the_one_thread_result(pair, design):
    a, b = pair
    one = compare_fingerprints(a, b, design=design)
    for workers in (2, 3, 8):
        assert compare_fingerprints(a, b, design=design, workers=workers) == one
    assert one.log10_p < -5  # three of six blocks derive: the comparison did real work
