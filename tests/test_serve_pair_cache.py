"""The pair page keeps the reports it drew within a bound in bytes (issue 44): a report holds its two models' card
text, so a hub whose cards are big makes every report big, and a bound in entries (128 once) let a visitor who walks
through distinct pairs grow the server by hundreds of megabytes. The app's own code path on a real DuckDB file whose
models carry a licence of two megabytes each; what the app keeps is read with tracemalloc, which counts the Python
objects it holds whatever the allocator keeps in reserve (a server's resident set moved by -119 to +44 MB between
runs of the same visits, wider than the bound itself)."""

from __future__ import annotations

import dataclasses
import gc
import tracemalloc
from pathlib import Path

import pytest
from cachetools.keys import hashkey

from jobs.web import evidence
from jobs.web.app import create_app
from lineage_graph.persist import rebuild_lineage
from scanner.store import Store
from tests.store_support import Meta, record, test_row

LICENCE_BYTES = 1 << 21
"""Each model's licence text: a pair's report shows both, so it holds about four megabytes."""
WARM, MEASURED = 12, 48
"""Distinct pairs visited before the app's memory is read (matplotlib's and Jinja's caches are then full), and after:
48 reports of four megabytes are twelve times the bound."""
SLACK_MB = 8
"""What the app may come to hold beyond the bound while it draws the measured reports (its libraries' small caches).
A bound of 128 reports, whatever their size, would hold about 190 MB more."""


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


def held_mb() -> float:
    """The Python objects held now, of those allocated since tracing began."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / (1 << 20)


def test_a_visitor_walking_distinct_pairs_makes_the_app_hold_no_more_than_the_report_bound(big_cards: Path) -> None:
    ids = chain(WARM + MEASURED + 1)
    client = create_app(big_cards).test_client()

    def visit(k: int) -> None:
        answer = client.get("/pair", query_string={"a": ids[k], "b": ids[k + 1]})
        assert answer.status_code == 200 and f"{ids[k + 1]}: licence text" in answer.get_data(as_text=True)

    tracemalloc.start()
    try:
        for k in range(WARM):
            visit(k)
        before = held_mb()
        for k in range(WARM, WARM + MEASURED):
            visit(k)
        grown = held_mb() - before
    finally:
        tracemalloc.stop()
    assert grown < (evidence.REPORT_CACHE_BYTES >> 20) + SLACK_MB, f"grew {grown:.0f} MB over {MEASURED} reports"


def test_the_kept_reports_stay_within_the_bound_and_the_latest_are_kept(big_cards: Path) -> None:
    ids = chain(WARM + MEASURED + 1)
    client = create_app(big_cards).test_client()
    for k in range(len(ids) - 1):
        assert client.get("/pair", query_string={"a": ids[k], "b": ids[k + 1]}).status_code == 200
    kept = evidence._reports
    assert 0 < kept.currsize <= evidence.REPORT_CACHE_BYTES
    assert 2 <= len(kept) < len(ids) - 1  # about four megabytes each: three or so of the 60 fit
    assert hashkey(str(big_cards), ids[-2], ids[-1]) in kept
    assert hashkey(str(big_cards), ids[0], ids[1]) not in kept  # the least recently drawn went first
