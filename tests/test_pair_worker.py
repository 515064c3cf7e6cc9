"""The Ray-free pair worker: the results of compare_fingerprints, each fingerprint read once while its pairs stream
through, a byte budget that bounds what it keeps, and errors raised for the caller to record."""

from __future__ import annotations

import pytest

from scanner.errors import FingerprintError
from scanner.fingerprints.store import FingerprintStore, read_fingerprint_at
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.pairs.worker import PairWorker
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_pair
from tests.synthetic_fingerprints import template_fingerprint

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def addresses(tmp_path_factory):
    """Four stored fingerprints: a, its derivative b (blocks 0 and 2), and an unrelated pair c, d."""
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), 16)
    a, b = synthetic_pair(template, 3, 64, {0: 0, 2: 2}, seed=21)
    c, d = synthetic_pair(template, 3, 64, {}, seed=22)
    store = FingerprintStore(tmp_path_factory.mktemp("fps"))
    return [store.write(fp, f"org/{name}", REVISION)[0] for name, fp in zip("abcd", (a, b, c, d), strict=True)]


def test_pairs_stream_through_with_each_fingerprint_read_once(addresses):
    design = SequentialDesign(2, -300.0, -0.5)
    worker = PairWorker(statistic="match", design=design)
    pairs = [(x, y) for i, x in enumerate(addresses) for y in addresses[i + 1:]]
    for x, y in pairs:
        expected = compare_fingerprints(read_fingerprint_at(x), read_fingerprint_at(y), design=design)
        assert worker.compare(x, y) == expected
    assert worker.reads == len(addresses)  # six pairs, four fingerprints, each read once
    assert worker.compare(addresses[0], addresses[1]).log10_p < -5  # the derived pair
    assert worker.compare(addresses[2], addresses[3]).log10_p > -5  # the unrelated one


def test_the_byte_budget_bounds_the_cache_and_only_costs_reads(addresses):
    one = PairWorker().fingerprint(addresses[0])
    size = sum(x.gate.nbytes + x.up.nbytes for block in one.blocks for x in block)
    worker = PairWorker(cache_bytes=size)  # room for one fingerprint (the pair's other is dropped after use)
    for x, y in [(addresses[0], addresses[1]), (addresses[0], addresses[2]), (addresses[1], addresses[2])]:
        assert worker.compare(x, y) == PairWorker().compare(x, y)
        assert worker.cached_bytes <= size
    assert worker.reads == 6


def test_a_damaged_fingerprint_raises_and_is_not_cached(addresses, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    worker = PairWorker()
    for _ in range(2):  # read again the second time: nothing of the bad file was kept
        with pytest.raises(FingerprintError):
            worker.compare(addresses[0], str(bad))
    assert worker.reads == 1 and worker.cached_bytes > 0  # the good fingerprint, read once
