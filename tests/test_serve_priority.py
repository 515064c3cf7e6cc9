"""Pages before downloads in the interpreter (jobs.web.priority): a download writing its rows in Python gives way,
before each row, to the threads making pages, and still finishes while pages keep coming.

What is asserted is the order of events, never a duration: the sleeps only give a wrong order the chance to
happen (the speed figures are bench/bench_serve_load.py's, in BENCHMARKS.md)."""

from __future__ import annotations

import csv
import io
import threading
import time
from pathlib import Path

import duckdb
import pytest

from jobs.web.app import create_app
from jobs.web.priority import PAGES, PagesFirst
from scanner.store import Store

ROWS = 3000
GUARD_S = 120.0
"""How long a test waits for a thread that must end (a guard against a hang, not a speed limit)."""
CHANCE_S = 0.5
"""How long a page is held open before it ends: time for a writer that did not wait to write its rows."""


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty scan database with one more table, ``numbers``: `ROWS` rows."""
    path = tmp_path_factory.mktemp("priority") / "scan.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE numbers AS SELECT range AS i, 'row ' || range AS label FROM range({ROWS})")
    return path


def test_a_writer_waits_for_the_page_being_made() -> None:
    pages, events = PagesFirst(wait_s=GUARD_S), []
    making = threading.Event()

    def writer_of_rows() -> None:
        making.wait()
        pages.give_way()
        events.append("row written")

    writer = threading.Thread(target=writer_of_rows)
    writer.start()
    with pages.page():
        making.set()
        time.sleep(CHANCE_S)
        events.append("page made")
    writer.join(GUARD_S)
    assert events == ["page made", "row written"]


def test_a_thread_waiting_for_a_lane_makes_no_page() -> None:
    pages = PagesFirst(wait_s=GUARD_S)
    with pages.page():
        assert pages.pages_being_made == 1
        with pages.aside():
            assert pages.pages_being_made == 0
            pages.give_way()  # returns at once: the only page's thread is waiting for a lane or writing
        assert pages.pages_being_made == 1
    with pages.aside():  # a thread making no page (a download's stream) stays so
        assert pages.pages_being_made == 0
    assert pages.pages_being_made == 0


def download(client, events: list[str], answers: list[bytes]) -> None:
    answer = client.get("/tables/numbers.csv")
    answers.append(answer.get_data())
    events.append("download written")


def rows_of(answer: bytes) -> list[list[str]]:
    return list(csv.reader(io.StringIO(answer.decode())))


def test_a_download_writes_no_row_while_a_page_is_being_made(db: Path) -> None:
    app = create_app(db, host_names=None)
    pages: PagesFirst = app.extensions[PAGES]
    pages.wait_s = GUARD_S  # no turn of its own while the test holds the page
    events, answers = [], []
    downloader = threading.Thread(target=download, args=(app.test_client(), events, answers))
    with pages.page():  # a page being made on this thread while the download asks for its rows
        downloader.start()
        time.sleep(CHANCE_S)
        events.append("page made")
    downloader.join(GUARD_S)
    assert events == ["page made", "download written"]
    assert [int(row[0]) for row in rows_of(answers[0])[1:]] == list(range(ROWS))


def test_a_download_ends_while_pages_never_stop(db: Path) -> None:
    app = create_app(db, host_names=None)
    pages: PagesFirst = app.extensions[PAGES]
    pages.wait_s, pages.turn_s = 0.05, 0.001
    events, answers = [], []
    downloader = threading.Thread(target=download, args=(app.test_client(), events, answers))
    with pages.page():  # a page being made the whole time
        downloader.start()
        downloader.join(GUARD_S)
        assert events == ["download written"]
    assert [int(row[0]) for row in rows_of(answers[0])[1:]] == list(range(ROWS))
