"""The pair page keeps the reports it drew within a bound in bytes (issue 44): a report holds its two models' card
text, so a hub whose cards are big makes every report big, and a bound in entries (128 once) let a visitor who walks
through distinct pairs grow the server by hundreds of megabytes. A real server process (and the app's own code path)
on a real DuckDB file whose models carry a licence of half a megabyte each."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from jobs.web import evidence
from jobs.web.app import create_app
from jobs.web.byte_cache import ByteBoundedCache, size_in_memory
from lineage_graph.persist import rebuild_lineage
from scanner.store import Store
from tests.serve_support import get, page_url, serving
from tests.store_support import Meta, record, test_row

LICENCE_BYTES = 1 << 19
"""Each model's licence text: a pair's report shows both, so it holds about a megabyte."""
WARM, MEASURED = 12, 48
"""Distinct pairs visited before the server's memory is read (each page thread has then drawn a big page, and its
allocator holds what that took), and after: 48 reports of a megabyte are three times the bound."""
SLACK_MB = 16
"""What the server may grow by beyond the bound while it draws the measured reports (matplotlib's and DuckDB's own
caches). Measured: -23 MB with the bound; 54 MB with a bound of 128 reports, whatever their size, instead."""
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": str(128 << 10)}
"""The server's glibc hands every block of 128 KB or more back to the system when it is freed. By default the
threshold rises to the biggest block freed (up to 32 MB), after which a report's copies stay in the allocator's
reserve once freed, and the resident set counts that reserve (it hid the kept reports: +54 MB then measured -2 MB)."""


def chain(count: int) -> list[str]:
    return [f"org/m{k:03d}" for k in range(count)]


@pytest.fixture(scope="module")
def big_cards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A chain of models, each tested dependent on the next, each card with a licence of `LICENCE_BYTES`."""
    db = tmp_path_factory.mktemp("pair-cache") / "hub.duckdb"
    ids = chain(WARM + MEASURED + 1)
    with Store(db) as store:
        run = store.start_run({})
        for model_id in ids:
            licence = f"{model_id}: " + "licence text " * (LICENCE_BYTES // 13)
            store.upsert_model(dataclasses.replace(record(model_id), license=licence), Meta(), run, "ok")
        store.put_pair_tests([test_row(a, "r1", b, "r1", -60.0, run) for a, b in zip(ids, ids[1:])])
        store.finish_run(run, "succeeded", {})
        rebuild_lineage(store)
    return db


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def test_a_visitor_walking_distinct_pairs_grows_the_server_by_no_more_than_the_report_bound(
        big_cards: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = chain(WARM + MEASURED + 1)
    for name, value in FIXED_MMAP.items():
        monkeypatch.setenv(name, value)
    with serving(big_cards, tmp_path / "stderr.txt") as server:
        def visit(k: int) -> None:
            answer = get(page_url(server.url, "/pair", a=ids[k], b=ids[k + 1]), timeout=120)
            assert answer.status == 200 and f"{ids[k + 1]}: licence text" in answer.text

        for k in range(WARM):
            visit(k)
        before = rss_mb(server.process.pid)
        for k in range(WARM, WARM + MEASURED):
            visit(k)
        grown = rss_mb(server.process.pid) - before
    assert grown < (evidence.REPORT_CACHE_BYTES >> 20) + SLACK_MB, f"grew {grown:.0f} MB over {MEASURED} reports"


def test_the_kept_reports_stay_within_the_bound_and_the_latest_are_kept(big_cards: Path) -> None:
    ids = chain(WARM + MEASURED + 1)
    client = create_app(big_cards).test_client()
    for k in range(len(ids) - 1):
        assert client.get("/pair", query_string={"a": ids[k], "b": ids[k + 1]}).status_code == 200
    kept = evidence._reports
    assert 0 < kept.bytes <= evidence.REPORT_CACHE_BYTES
    assert 2 <= len(kept) < len(ids) - 1  # about a megabyte each: a dozen or so of the 60 fit
    latest = (str(big_cards), ids[-2], ids[-1])
    assert kept.get(latest, lambda: pytest.fail("the latest report was not kept"))


def test_the_least_recently_used_go_first_and_an_entry_bigger_than_the_bound_is_never_kept() -> None:
    made: list[str] = []

    def make(text: str) -> str:
        made.append(text)
        return text

    entry = size_in_memory(("a",), "x" * 1000)
    cache: ByteBoundedCache[str] = ByteBoundedCache(3 * entry)
    for key in "abc":
        cache.get((key,), lambda key=key: make(key * 1000))
    cache.get(("a",), lambda: make("again"))  # kept: a is now the most recently used
    cache.get(("d",), lambda: make("d" * 1000))  # b, the least recently used, goes
    assert made == ["a" * 1000, "b" * 1000, "c" * 1000, "d" * 1000]
    assert cache.bytes == 3 * entry and len(cache) == 3
    assert cache.get(("b",), lambda: make("b" * 1000)) == "b" * 1000 and made[-1] == "b" * 1000
    huge = "h" * (4 * entry)
    assert cache.get(("h",), lambda: make(huge)) is huge and cache.get(("h",), lambda: make(huge)) is huge
    assert made[-2:] == [huge, huge] and cache.bytes <= 3 * entry  # made each time, never kept
