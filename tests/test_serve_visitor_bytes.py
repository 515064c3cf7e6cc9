"""`hubtrace serve` bounded per visitor in bytes whatever the statement (issue 44): a real server process on a real
database, asked over HTTP for answers whose cells are huge, and by clients that read slowly.

The server's memory is read from /proc: its own peak resident set (VmHWM), and the resident sets of its children
(the SQL lanes' processes, jobs.web.statement_process) sampled every 20 ms. What is held to is the bound
docs/serve.md states, with a margin for what the system counts beside the data limit (the code of the interpreter,
DuckDB, Arrow and polars, about 100 MB a process) and for a shared machine. Timeouts guard against a server that
never answers; they are not speed limits.
"""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import duckdb
import pytest

from scanner.store import Store
from tests.serve_support import Server, SlowReader, get, page_url, serving
from tests.test_serve_bounds import GUARD_S, eventually, peak_mb, until

STATEMENT_MB = 1024
"""The default memory of a SQL lane's process (--statement-mb)."""
CODE_MB = 256
"""What a lane's process may hold beyond its data limit as resident memory (its code, about 100 MB), with margin."""
SERVER_GROWTH_MB = 300
"""How much the server's own process may grow for the requests here: a few answer messages of 16 MB and what they
are written as, with margin (it grew by 3.2-3.8 GB for one such request before)."""
WIDE = ", ".join(f"lpad('', 200000, 'w') AS c{i}" for i in range(100))
HUGE = {
    "strings, page": ("/sql", "SELECT repeat('x', 20000000) AS s FROM range(100)"),
    "strings, JSON": ("/sql.json", "SELECT repeat('x', 20000000) AS s FROM range(100)"),
    "concatenated, CSV": ("/sql.csv", "SELECT concat(repeat('a', 10000000), repeat('b', 10000000)) FROM range(60)"),
    "one aggregated string": ("/sql.csv", "SELECT string_agg(repeat('y', 1000), '') AS s FROM range(400000)"),
    "blobs": ("/sql.json", "SELECT repeat(CAST('ab' AS BLOB), 10000000) AS b FROM range(100)"),
    "lists": ("/sql", "SELECT range(1000000) AS l FROM range(500)"),
    "nested structs": ("/sql.csv", "SELECT {'a': repeat('z', 5000000), 'b': {'c': range(500000)}} AS st "
                                   "FROM range(200)"),
    "many wide columns": ("/sql.json", f"SELECT {WIDE} FROM range(200)"),
    "an answer within the bounds": ("/sql.csv", "SELECT i, repeat('v', 100000) AS pad FROM range(300) t(i)"),
}
"""Statements whose answer is one to 20 GB, in every shape a visitor can make (and one the server must answer)."""


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty scan database with one more table, ``wide``: 60,000 rows of about 1 KB (a 60 MB CSV download)."""
    path = tmp_path_factory.mktemp("visitor-bytes") / "scan.duckdb"
    Store(path).close()
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE wide AS SELECT range AS i, repeat('x', 1000) AS pad FROM range(60000)")
    return path


def resident_mb(pid: int) -> float:
    """A process's resident memory now, in MB (0 once it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    return int(status.split("VmRSS:")[1].split()[0]) / 1024 if "VmRSS:" in status else 0.0


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


@contextmanager
def lane_peaks(server: Server) -> Iterator[dict[str, float]]:
    """The peak resident memory of any one of the server's children, and of all of them together, while the block
    runs (sampled every 20 ms)."""
    peaks = {"one": 0.0, "together": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            sizes = [resident_mb(child) for child in children(server.process.pid)]
            peaks["one"] = max([peaks["one"], *sizes])
            peaks["together"] = max(peaks["together"], sum(sizes))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peaks
    finally:
        stop.set()
        sampler.join()


def answered(server: Server, path: str, sql: str) -> tuple[int, str]:
    """The status of ``sql``'s answer at ``path``, and what was said: the refusal, or the download's first row."""
    answer = get(page_url(server.url, path, q=sql), timeout=GUARD_S)
    for _ in range(int(GUARD_S)):  # asked again while downloads wait for the one SQL lane they may take
        if answer.status != 503:
            break
        time.sleep(1.0)
        answer = get(page_url(server.url, path, q=sql), timeout=GUARD_S)
    if answer.status == 400:  # the SQL page's refusal, or the error page of a download's
        opening = '<p class="error" role="alert">' if path == "/sql" else "<h1>Bad Request</h1>\n<p>"
        return answer.status, answer.text.split(opening, 1)[-1].split("</p>", 1)[0]
    if path == "/sql.json":
        return answer.status, str(len(json.loads(answer.text)))  # one whole document
    if path == "/sql.csv":
        rows = list(csv.reader(io.StringIO(answer.text)))
        return answer.status, str(len(rows) - 1)
    return answer.status, "rows" if "rows" in answer.text else answer.text[:200]


def test_a_statement_of_huge_cells_stays_within_the_memory_bound_two_at_a_time(db: Path, tmp_path: Path) -> None:
    """Once one GET of ``SELECT repeat('x', 20000000) AS s FROM range(100)`` took the server from 554 MB to 4.4 GB
    (its HTML page; 3.8 GB its JSON), and two at once passed 4 GB in 3 s: DuckDB builds 2,048 rows at a time outside
    its memory limit, and the row caps do not bound bytes. Now each is refused in one line, or answered whole, by a
    lane's process that cannot hold more than --statement-mb, two lanes at once, while the server's own process stays
    where it was."""
    with serving(db, tmp_path / "stderr.txt") as server:
        assert get(page_url(server.url, "/sql.csv", q="SELECT 1 AS warm"), timeout=GUARD_S).status == 200
        before = peak_mb(server.process.pid)
        with lane_peaks(server) as lanes, ThreadPoolExecutor(2) as visitors:  # the two SQL lanes at once
            answers = dict(zip(HUGE, visitors.map(lambda case: answered(server, *case), HUGE.values())))
        grown = peak_mb(server.process.pid) - before
        print(f"server grew by {grown:.0f} MB; a lane's process peaked at {lanes['one']:.0f} MB, the lanes together "
              f"at {lanes['together']:.0f} MB; {answers}")
        for case, (status, said) in answers.items():
            assert status in (200, 400), (case, status, said)
            if status == 400:
                assert "Out of Memory" in said or "rows are larger than" in said, (case, said)
                assert "\n" not in said.strip() and "Traceback" not in said, (case, said)
        assert answers["an answer within the bounds"] == (200, "300")
        assert grown < SERVER_GROWTH_MB, f"the server grew by {grown:.0f} MB"
        assert lanes["one"] < STATEMENT_MB + CODE_MB and lanes["together"] < 2 * (STATEMENT_MB + CODE_MB), lanes
        assert server.process.poll() is None and get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
        assert get(page_url(server.url, "/sql", q="SELECT 42 AS answer"), timeout=GUARD_S).status == 200
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()


@contextmanager
def reading(url: str, source: str) -> Iterator[SlowReader]:
    """A `SlowReader` of ``url`` once its answer has begun (asked again while the server says its lanes are busy)."""
    for _ in range(int(GUARD_S)):
        with SlowReader(url, source) as reader:
            eventually(lambda: reader.status or reader.closed_by_server, GUARD_S)
            if reader.status.endswith("200 OK"):
                yield reader
                return
        time.sleep(1.0)
    raise AssertionError(f"{url} never answered 200")


def test_slow_readers_deny_no_one_the_sql_box_or_a_download(db: Path, tmp_path: Path) -> None:
    """Once two clients reading a SQL download at 1 KB/s held both SQL lanes (every other visitor's statement got
    503) and two reading a table download held both download lanes, for as long as they kept reading. Now a lane
    writes the answer to a spool file and is free (the downloads keep one SQL lane free for the page's statements);
    the readers, given ten minutes here before a minimum rate applies, read on meanwhile."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "600") as server, ExitStack() as held:
        slow = [held.enter_context(reading(page_url(server.url, path), f"127.0.0.{2 + k}"))
                for k, path in enumerate(["/sql.csv?q=SELECT+*+FROM+wide"] * 2 + ["/tables/wide.csv"] * 2)]
        assert until(200, page_url(server.url, "/sql", q="SELECT 1")) == 200
        assert until(200, page_url(server.url, "/tables/schema_version.csv")) == 200
        assert get(page_url(server.url, "/sql.csv", q="SELECT 2 AS two"), timeout=GUARD_S).text == "two\r\n2\r\n"
        assert not any(reader.closed_by_server for reader in slow)  # still reading: nothing was taken from them


def test_a_reader_slower_than_the_minimum_rate_is_cut_off(db: Path, tmp_path: Path) -> None:
    """A client taking 1 KB/s of a 60 MB answer would hold its spool file for 17 hours; the write timeout alone
    fires only for a client that takes nothing. Past --write-seconds, a finished answer taken at less than
    --min-rate-kb on average is cut off; one taken faster is not."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "3", "--min-rate-kb", "64") as server:
        with SlowReader(page_url(server.url, "/sql.csv", q="SELECT * FROM wide")) as slow:
            assert eventually(lambda: slow.closed_by_server, GUARD_S)
        assert slow.status.endswith("200 OK") and 0 < slow.received < 60_000_000
        fast = get(page_url(server.url, "/tables/wide.csv"), timeout=GUARD_S)
        assert fast.status == 200 and len(fast.text.splitlines()) == 60_001
