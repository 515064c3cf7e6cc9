"""`hubtrace serve` bounded per visitor in bytes and time (issue 44): a real server process on a real database, asked
over HTTP by clients that never read, by downloads past the byte cap, and by downloads of wide rows.

Clients that never read are raw sockets with a 4 KB receive window; the server's memory is its peak resident set
(VmHWM) read from /proc. Timeouts here guard against a server that never answers; they are not speed limits (the
figures for that are in BENCHMARKS.md, bench/bench_serve_load.py).
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import os
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import duckdb
import pytest

from scanner.store import Store
from tests.serve_support import get, page_url, serving, unread

GUARD_S = 120.0
"""How long a test waits for an answer that must come (a guard against a hang, not a speed limit)."""
ROW_BYTES = 1000


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty scan database with one more table, ``wide``: 60,000 rows of about 1 KB (a 60 MB CSV download)."""
    path = tmp_path_factory.mktemp("bounds") / "scan.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute(f"CREATE TABLE wide AS SELECT range AS i, repeat('x', {ROW_BYTES}) AS pad FROM range(60000)")
    return path


def until(status: int, url: str, seconds: float = GUARD_S) -> int:
    """Ask ``url`` until it answers ``status`` or ``seconds`` pass; the last status."""
    deadline = time.monotonic() + seconds
    answered = get(url, timeout=GUARD_S).status
    while answered != status and time.monotonic() < deadline:
        time.sleep(0.2)
        answered = get(url, timeout=GUARD_S).status
    return answered


def sockets(pid: int) -> int:
    """How many sockets the process holds open (its listening socket and its connections)."""
    return sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if os.readlink(fd).startswith("socket:"))


def test_a_sql_download_ends_before_the_row_that_would_pass_its_byte_cap(db: Path, tmp_path: Path) -> None:
    cap = 1 << 20
    with serving(db, tmp_path / "stderr.txt", "--download-mb", "1") as server:
        sql = "SELECT i, pad FROM wide ORDER BY i"
        answer = get(page_url(server.url, "/sql.csv", q=sql), timeout=GUARD_S)
        assert answer.status == 200 and answer.headers["X-Hubtrace-Byte-Cap"] == str(cap)
        assert cap - 2 * ROW_BYTES < len(answer.text.encode()) <= cap
        rows = list(csv.reader(io.StringIO(answer.text)))
        assert rows[0] == ["i", "pad"] and [int(r[0]) for r in rows[1:]] == list(range(len(rows) - 1))
        assert all(len(r[1]) == ROW_BYTES for r in rows[1:])  # whole rows only
        as_json = get(page_url(server.url, "/sql.json", q=sql), timeout=GUARD_S).text
        numbers = [r["i"] for r in json.loads(as_json)]  # still one whole array
        assert cap - 2 * ROW_BYTES < len(as_json.encode()) <= cap and numbers == list(range(len(numbers)))
        assert "1 MiB" in get(page_url(server.url, "/sql", q="SELECT 1"), timeout=GUARD_S).text


def peak_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024


def test_a_download_of_wide_rows_streams_without_holding_them(db: Path, tmp_path: Path) -> None:
    """Once ``SELECT repeat('x', 5000000) FROM range(200)`` took the server from 0.5 to 3.0 GB and sent nothing in
    80 s (the batch of rows, then its frame, its CSV text and that text encoded, each whole). 300 rows of 1 MB:
    DuckDB holds its own chunk of them (300 MB) whatever the server does; the rest must be a few rows at a time."""
    with serving(db, tmp_path / "stderr.txt") as server:
        assert get(page_url(server.url, "/sql.csv", q="SELECT 1 AS warm"), timeout=GUARD_S).status == 200
        before = peak_mb(server.process.pid)
        url = page_url(server.url, "/sql.csv", q="SELECT repeat('x', 1000000) AS r FROM range(300)")
        received = 0
        with urllib.request.urlopen(url, timeout=GUARD_S) as response:
            while chunk := response.read(1 << 20):
                received += len(chunk)
        grown = peak_mb(server.process.pid) - before
    assert received == len("r\r\n") + 300 * (1_000_000 + 2)
    print(f"the server grew by {grown:.0f} MB for a 300 MB download")
    assert grown < 600, f"the server grew by {grown:.0f} MB for a 300 MB download"


def test_clients_that_do_not_read_hold_no_page_thread_and_are_cut_off(db: Path, tmp_path: Path) -> None:
    """Once eight connections to a big table download that never read held all eight page threads: every page timed
    out until they closed."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "3") as server, ExitStack() as clients:
        table = page_url(server.url, "/tables/wide.csv")
        alone = sockets(server.process.pid)
        for _ in range(8):
            clients.enter_context(unread(table))
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200  # while they hold what they can
        assert get(page_url(server.url, "/tables"), timeout=GUARD_S).status == 200
        turned_away = get(table, timeout=GUARD_S)  # the download lanes are taken: come back later, at once
        assert turned_away.status == 503 and "table downloads are running" in turned_away.text
        # the two downloads that took nothing for --write-seconds are cut off (the server closes their connections
        # while they still read nothing; the six turned away stay open, idle, until waitress's idle timeout), and
        # their lanes answer the next download
        deadline = time.monotonic() + GUARD_S
        while sockets(server.process.pid) > alone + 6 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sockets(server.process.pid) == alone + 6
        assert until(200, table) == 200


def test_unread_sql_downloads_give_their_lanes_back(db: Path, tmp_path: Path) -> None:
    """Once two unread SQL downloads held both SQL lanes past the 30 s limit (DuckDB's time is counted while it
    works, not while the client reads): every visitor's statement got 503."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "3") as server, ExitStack() as clients:
        for _ in range(2):
            clients.enter_context(unread(page_url(server.url, "/sql.csv", q="SELECT * FROM wide")))
        statement = page_url(server.url, "/sql", q="SELECT 42 AS answer")
        assert until(503, statement, seconds=30) == 503  # both lanes taken by downloads nobody reads
        assert until(200, statement) == 200  # cut off after --write-seconds, their lanes free again


def test_a_value_that_cannot_be_written_past_the_first_batch_cuts_its_download_visibly(
        db: Path, tmp_path: Path) -> None:
    """The first batch decides whether an answer is written as text; a later one polars still cannot turn into Python
    (its PanicException, a BaseException, which neither Flask nor waitress catches) once left the client waiting for
    ever. Now the download ends early, as a failed one, and the server answers on."""
    sql = "SELECT CASE WHEN range < 25000 THEN DATE '2000-01-01' ELSE DATE '5881580-07-10' END AS d FROM range(30000)"
    with serving(db, tmp_path / "stderr.txt") as server:
        for _ in range(3):
            with pytest.raises(http.client.IncompleteRead):  # never a complete file
                with urllib.request.urlopen(page_url(server.url, "/sql.csv", q=sql), timeout=GUARD_S) as response:
                    response.read()
        assert get(page_url(server.url, "/sql", q=sql), timeout=GUARD_S).status == 200  # the page: all as text
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
