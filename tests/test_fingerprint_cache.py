"""A node's disk cache of remote fingerprint parts, with the real pair-task code (`jobs.actors.compare_batch`, run
here without Ray) reading fingerprints from a real S3-compatible server (moto's): what the server sent is counted
by a relay between it and the client (tests/s3_support.py), never by the client library itself.

The pairs' verdicts are fixed by their seeds (a derived pair at p < 1e-30, unrelated ones far above 1e-2; under
independence the screen of 2 blocks falls below 1e-2 with probability 1%, and these seeds are fixed).
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from jobs.actors import DiskCacheSpec, PairJob, compare_batch
from scanner.fingerprints.cache import FingerprintCache
from scanner.fingerprints.ranges import HEADER_PREFETCH
from scanner.fingerprints.store import FingerprintStore
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.synthetic import synthetic_pair
from tests.s3_support import counting_relay, make_bucket
from tests.synthetic_fingerprints import template_fingerprint

REVISION = "0123456789abcdef0123456789abcdef01234567"
BUCKET = "fp-cache"
DEPTH, UNITS, TOKENS = 8, 512, 128
#: Bytes of one block: gate and up, UNITS x TOKENS float16 each, and a float32 scale per unit of each.
BLOCK_BYTES = 2 * UNITS * (TOKENS * 2 + 4)
#: HTTP response headers, HEAD answers: generous, and far below one block.
HTTP_OVERHEAD = 32 << 10
DESIGN = SequentialDesign(screen_blocks=2, stop_below_log10_p=-30.0, stop_above_log10_p=-2.0)
GIB = 1 << 30


@pytest.fixture(scope="module")
def stored(tmp_path_factory, s3_env):
    """Fingerprints a, b (derived from a in every block) and c (unrelated) in the S3 server, and in memory."""
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), TOKENS)
    a, b = synthetic_pair(template, DEPTH, UNITS, {i: i for i in range(DEPTH)}, seed=31)
    c = synthetic_pair(template, DEPTH, UNITS, {}, seed=32)[1]
    make_bucket(BUCKET)
    store = FingerprintStore(f"s3://{BUCKET}/fps")
    written = {name: (*store.write(fp, f"org/{name}", REVISION), fp) for name, fp in zip("abc", (a, b, c), strict=True)}
    return written  # name -> (address, file sha256, fingerprint)


def jobs(stored, *names: tuple[str, str]) -> list[PairJob]:
    return [PairJob(f"org/{x}", REVISION, stored[x][0], f"org/{y}", REVISION, stored[y][0], "set", "comparable",
                    sha256_a=stored[x][1], sha256_b=stored[y][1]) for x, y in names]


def results(outcomes) -> list[float]:
    assert all(o.error is None for o in outcomes), [o.error for o in outcomes]
    return [o.result.log10_p for o in outcomes]


def test_a_second_pair_task_on_the_node_downloads_nothing(stored, tmp_path):
    spec = DiskCacheSpec(str(tmp_path / "cache"), GIB)
    batch = jobs(stored, ("a", "b"), ("a", "c"), ("b", "c"))
    with counting_relay() as first:
        p_first = results(compare_batch(batch, "match", DESIGN, cache=spec))
    with counting_relay() as second:  # a new task: a new pair worker and cache object, the same folder
        p_second = results(compare_batch(batch, "match", DESIGN, cache=spec))
    assert first.downloaded > 3 * 2 * BLOCK_BYTES  # the screening blocks of three fingerprints crossed once
    assert second.downloaded == 0
    whole = {name: fp for name, (_, _, fp) in stored.items()}
    expected = [compare_fingerprints(whole[x], whole[y], design=DESIGN).log10_p for x, y in ("ab", "ac", "bc")]
    assert p_first == p_second == expected  # the same numbers as a test of the whole files
    assert p_first[0] < -30 and min(p_first[1:]) > -2


@pytest.mark.parametrize("pair", [("a", "b"), ("a", "c")], ids=["dependent", "independent"])
def test_the_sequential_design_reads_the_header_and_the_screening_blocks(stored, pair):
    """Without a disk cache: each fingerprint costs its header and the 2 screened blocks, not its 8 blocks."""
    with counting_relay() as relay:
        outcome, = compare_batch(jobs(stored, pair), "match", DESIGN)
    assert outcome.error is None and outcome.result.n_layers == DESIGN.screen_blocks  # the screen settled it
    screened = 2 * (8 + HEADER_PREFETCH + DESIGN.screen_blocks * BLOCK_BYTES)
    assert 2 * DESIGN.screen_blocks * BLOCK_BYTES < relay.downloaded <= screened + HTTP_OVERHEAD
    assert relay.downloaded < 2 * DEPTH * BLOCK_BYTES / 3


def test_a_damaged_cache_file_is_detected_and_fetched_again(stored, tmp_path):
    address, sha, _ = stored["a"]
    cache = FingerprintCache(tmp_path / "cache", GIB)
    spec = DiskCacheSpec(str(cache.folder), GIB)
    batch = jobs(stored, ("a", "c"))
    expected = results(compare_batch(batch, "match", DESIGN, cache=spec))
    part = cache.path(address, sha, "block-00000")
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit pattern in the payload, length unchanged
    part.write_bytes(bytes(data))
    with counting_relay() as relay:
        assert results(compare_batch(batch, "match", DESIGN, cache=spec)) == expected
    assert BLOCK_BYTES <= relay.downloaded <= BLOCK_BYTES + HTTP_OVERHEAD  # that block alone, again
    assert part.read_bytes() != bytes(data)  # replaced by the fetched part, which now reads back intact:
    assert len(FingerprintCache(cache.folder, GIB).get(address, sha, "block-00000", _no_fetch)) == BLOCK_BYTES


def test_the_budget_holds_and_the_least_recently_used_parts_go(tmp_path):
    part = 100_000
    cache = FingerprintCache(tmp_path / "cache", max_bytes=3 * (part + 32))
    for i in range(5):
        cache.get("s3://b/x", "sha", f"block-{i}", lambda i=i: bytes([i]) * part)
        if i == 2:
            cache.get("s3://b/x", "sha", "block-0", _no_fetch)  # used again: blocks 1 and 2 are now older
        assert cache.size() <= cache.max_bytes
    kept = {p.name.rsplit(".", 1)[1] for p in cache.folder.iterdir() if not p.name.startswith(".")}
    assert kept == {"block-0", "block-3", "block-4"}
    assert cache.get("s3://b/x", "sha", "block-4", _no_fetch) == bytes([4]) * part
    too_big = cache.get("s3://b/x", "sha", "huge", lambda: b"z" * cache.max_bytes)  # served, not kept
    assert len(too_big) == cache.max_bytes and not cache.path("s3://b/x", "sha", "huge").exists()


def test_another_recorded_sha256_is_never_served_the_old_bytes(tmp_path):
    cache = FingerprintCache(tmp_path / "cache", GIB)
    cache.get("s3://b/x", "old", "header", lambda: b"old revision")
    assert cache.get("s3://b/x", "new", "header", lambda: b"new revision") == b"new revision"
    assert cache.counts.misses == 2 and cache.counts.hits == 0


def test_processes_sharing_the_folder_see_whole_parts(tmp_path):
    """Four processes write and read the same parts at once under a budget that forces eviction: every part any
    of them gets back is the one its key names, and nothing half written is left."""
    folder = tmp_path / "cache"
    with ProcessPoolExecutor(4) as pool:
        outcomes = list(pool.map(_hammer, [folder] * 4, range(4)))
    assert all(outcomes)
    names = os.listdir(folder)
    assert not [n for n in names if n.startswith(".tmp-")]
    assert FingerprintCache(folder, 8 * 50_032).size() <= 8 * 50_032


def _hammer(folder: Path, seed: int) -> bool:
    cache = FingerprintCache(folder, max_bytes=8 * 50_032)
    ok = True
    for i in range(60):
        k = (i * 7 + seed) % 12
        ok &= cache.get("s3://b/x", "sha", f"block-{k}", lambda k=k: bytes([k]) * 50_000) == bytes([k]) * 50_000
    return ok


def _no_fetch() -> bytes:
    raise AssertionError("fetched although the part is cached")


def test_the_default_folder_is_private_to_the_user(tmp_path, monkeypatch):
    """Issue 24: the default was one predictable folder in the shared temp directory, taken as it was found."""
    import stat as stat_module
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    cache = FingerprintCache()
    assert cache.folder == tmp_path / f"hubtrace-{os.getuid()}" / "fingerprint-cache" and cache.disabled is None
    for folder in (cache.folder, cache.folder.parent):
        mode = os.lstat(folder).st_mode
        assert stat_module.S_IMODE(mode) & 0o077 == 0, oct(mode)


@pytest.mark.parametrize("plant", ["world-writable", "symlink"])
def test_a_folder_others_could_write_turns_the_cache_off(tmp_path, plant):
    """A folder another user could have prepared (parts with valid digests of forged bytes) is never read."""
    if plant == "world-writable":
        folder = tmp_path / "cache"
        folder.mkdir()
        os.chmod(folder, 0o777)
    else:
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        folder = tmp_path / "cache"
        folder.symlink_to(tmp_path / "elsewhere")
    cache = FingerprintCache(folder)
    assert cache.disabled is not None
    fetched = []
    assert cache.get("s3://b/x", "sha", "header", lambda: fetched.append(1) or b"bytes") == b"bytes"
    assert cache.get("s3://b/x", "sha", "header", lambda: fetched.append(1) or b"bytes") == b"bytes"
    assert len(fetched) == 2  # fetched each time, never cached
    assert not [p for p in tmp_path.rglob("*.header")]


def test_a_fifo_planted_as_a_part_is_not_read(tmp_path):
    from tests.hang_support import hang_guard

    cache = FingerprintCache(tmp_path / "cache")
    os.mkfifo(cache.path("s3://b/x", "sha", "header"))
    with hang_guard(10):
        assert cache.get("s3://b/x", "sha", "header", lambda: b"fresh") == b"fresh"
    assert cache.counts.damaged == 1
