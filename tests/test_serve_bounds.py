"""`hubtrace serve` bounded per visitor in bytes and time (issue 44): a real server process on a real database, asked
over HTTP by clients that never read, by downloads past the byte cap, by downloads of wide rows, and by a visitor
holding connections that send nothing or a request a byte at a time.

Clients that never read are raw sockets with a 4 KB receive window; the server's memory is its peak resident set
(VmHWM) read from /proc. A second visitor is a second address of the loopback network (Linux answers every address
of 127.0.0.0/8). Timeouts here guard against a server that never answers; they are not speed limits (the figures for
that are in BENCHMARKS.md, bench/bench_serve_load.py).
"""

from __future__ import annotations

import csv
import http.client
import io
import json
import os
import resource
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import duckdb
import pytest

from scanner.store import Store
from tests.serve_support import Hog, Server, get, page_url, serving, unread

GUARD_S = 120.0
"""How long a test waits for an answer that must come (a guard against a hang, not a speed limit)."""
CLOSE_GUARD_S = 60.0
"""How long a test waits for the server to close a connection whose bounds (a few seconds) have passed: waitress
alone closes a connection only after 120 s without a byte, and one that sends a byte now and then never."""
ROW_BYTES = 1000
HOG = "127.0.0.2"
"""The address of a visitor who holds connections (the pages are asked for from 127.0.0.1)."""
TAKEN_AT_ONCE = ("--first-byte-seconds", "0")
"""For the tests of what the server does with the connections it holds: connections that send nothing are then its
own at once, not kept by the system until they send a byte (test_connections_that_send_nothing_...)."""


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
    """How many sockets the process holds open (its listening socket and its connections); a descriptor closed
    between the listing and its reading is not counted."""
    return sum(1 for fd in Path(f"/proc/{pid}/fd").iterdir() if _link(fd).startswith("socket:"))


def _link(fd: Path) -> str:
    try:
        return os.readlink(fd)
    except FileNotFoundError:
        return ""


def eventually(holds: Callable[[], bool], seconds: float = CLOSE_GUARD_S) -> bool:
    """Whether ``holds()``, asked until it is true or ``seconds`` pass (a guard against a hang, not a limit)."""
    deadline = time.monotonic() + seconds
    while not holds() and time.monotonic() < deadline:
        time.sleep(0.1)
    return holds()


def _status_line(client: socket.socket) -> bytes:
    """The first bytes its answer has brought the client, left unread (b"" where the server reset the connection)."""
    client.settimeout(CLOSE_GUARD_S)
    try:
        return client.recv(12, socket.MSG_PEEK)
    except OSError:
        return b""


def server_holds(server: Server, count: int) -> int:
    """The sockets the server holds once they are ``count`` (or after `CLOSE_GUARD_S`)."""
    eventually(lambda: sockets(server.process.pid) == count)
    return sockets(server.process.pid)


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
    out until they closed; later, the two that had a download lane held it, and every other download got 503. Now a
    download is written to a spool file on its lane and sent from there by waitress's main loop: the unread clients
    hold neither a thread nor a lane, and are cut off after --write-seconds."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "3") as server, ExitStack() as clients:
        table = page_url(server.url, "/tables/wide.csv")
        alone = sockets(server.process.pid)
        unread_clients = [clients.enter_context(unread(table)) for _ in range(8)]
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200  # while they hold what they can
        assert get(page_url(server.url, "/tables"), timeout=GUARD_S).status == 200
        assert until(200, table) == 200  # a lane free again once the unread ones are written
        # the downloads that took nothing for --write-seconds are cut off: the server closes their connections while
        # they still read nothing. Those turned away while the lanes wrote (503, sent whole) are kept alive for a
        # next request: idle, they are the server's to hold while it has room.
        turned_away = sum(_status_line(client).startswith(b"HTTP/1.1 503") for client in unread_clients)
        assert turned_away < len(unread_clients)
        assert server_holds(server, alone + turned_away) == alone + turned_away
        assert until(200, table) == 200


def test_unread_sql_downloads_hold_no_lane(db: Path, tmp_path: Path) -> None:
    """Once two unread SQL downloads held both SQL lanes past the 30 s limit (DuckDB's time is counted while it
    works, not while the client reads), and later for --write-seconds: every visitor's statement got 503. Now their
    lanes are free as soon as their answers are written, while the clients, given ten minutes here, still hold their
    connections."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "600") as server, ExitStack() as clients:
        alone = sockets(server.process.pid)
        for _ in range(2):  # one after the other: downloads keep a lane free for the page's statements
            assert until(200, page_url(server.url, "/sql.csv", q="SELECT 1 AS free")) == 200
            client = clients.enter_context(unread(page_url(server.url, "/sql.csv", q="SELECT * FROM wide")))
            assert _status_line(client) == b"HTTP/1.1 200"  # written, its lane free, before the next asks for one
        statement = page_url(server.url, "/sql", q="SELECT 42 AS answer")
        assert until(200, statement) == 200
        assert server_holds(server, alone + 2) == alone + 2  # both downloads still waiting for their clients


def test_a_value_that_cannot_be_written_past_the_first_batch_is_refused_not_sent_complete(
        db: Path, tmp_path: Path) -> None:
    """The first batch decides whether an answer is written as text; a later one polars still cannot turn into Python
    (its PanicException, a BaseException, which neither Flask nor waitress catches) once left the client waiting for
    ever, then ended the download early. Now the download is written whole before it is sent: it is refused, and the
    server answers on."""
    sql = "SELECT CASE WHEN range < 25000 THEN DATE '2000-01-01' ELSE DATE '5881580-07-10' END AS d FROM range(30000)"
    with serving(db, tmp_path / "stderr.txt") as server:
        for _ in range(3):
            refused = get(page_url(server.url, "/sql.csv", q=sql), timeout=GUARD_S)
            assert refused.status == 400 and "cannot be written here" in refused.text
        assert get(page_url(server.url, "/sql", q=sql), timeout=GUARD_S).status == 200  # the page: all as text
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200


def test_a_visitor_holding_idle_and_trickling_connections_keeps_no_one_else_out(db: Path, tmp_path: Path) -> None:
    """Once one visitor's hundred connections that sent nothing held every other visitor out for two minutes
    (waitress accepted no more until it closed them, 120 s after their last byte), and connections that sent a
    request a byte at a time were never closed. With the default bounds: the visitor's connections beyond its share
    are refused as they come, those that began a request closed when they have not sent it whole in time, however
    they trickle, and another visitor's page is answered meanwhile."""
    log = tmp_path / "stderr.txt"
    with serving(db, log) as server:
        with Hog(server.url, HOG, idle=150, trickling=50) as hog:
            assert get(page_url(server.url, "/"), timeout=CLOSE_GUARD_S).status == 200
            # the trickling ones closed while they trickled, the rest refused beyond the visitor's share (the idle
            # ones within it are held: they cost a descriptor, and make room when the server is full)
            # (the idle ones reach the server only after --first-byte-seconds)
            assert eventually(lambda: hog.trickling == 0 and hog.held <= 16) and hog.sent_after_open > 0
            assert hog.closed_by_server == 200 - hog.held
        assert get(page_url(server.url, "/tables"), timeout=CLOSE_GUARD_S).status == 200
    assert f"refusing connections from {HOG}: it holds 16" in log.read_text()


def test_a_visitor_holds_its_share_of_connections_and_no_more(db: Path, tmp_path: Path) -> None:
    """The share is of connections open at once, per address: the visitor's first four are kept (they have ten
    minutes to send a request here), the rest refused as they come; another address has a share of its own, and
    the visitor's next connection is refused while its four stay open."""
    options = ("--connections-per-address", "4", "--request-seconds", "600", *TAKEN_AT_ONCE)
    with serving(db, tmp_path / "stderr.txt", *options) as server:
        alone = sockets(server.process.pid)
        with Hog(server.url, HOG, idle=30, trickling=0) as hog:
            assert eventually(lambda: hog.closed_by_server >= 26) and hog.closed_by_server == 26 and hog.held == 4
            assert server_holds(server, alone + 4) == alone + 4
            assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
            with Hog(server.url, "127.0.0.3", idle=4, trickling=0) as other:
                assert server_holds(server, alone + 8) == alone + 8 and other.closed_by_server == 0
            assert server_holds(server, alone + 4) == alone + 4
            with Hog(server.url, HOG, idle=1, trickling=0) as one_more:  # the share still taken: refused
                assert eventually(lambda: one_more.closed_by_server == 1)
            assert hog.held == 4 and hog.closed_by_server == 26  # the four kept all along


def test_connections_that_send_nothing_are_kept_from_the_server_until_their_first_byte_then_bounded(
        db: Path, tmp_path: Path) -> None:
    """Visitors that open connections and send nothing, each opened again once closed, made a full server accept and
    close about 1,250 connections a second, and pages waited (BENCHMARKS.md, "Everything at once"). The system now
    keeps such a connection from the server until it sends a byte: forty of them against a server of eight
    connections take none of its sockets and are not closed to make room, while a page is answered. Once
    --first-byte-seconds have passed the server takes them, and its bounds apply (here, making room)."""
    options = ("--connections", "8", "--connections-per-address", "64")
    with serving(db, tmp_path / "stderr.txt", *options, "--first-byte-seconds", "600",
                 "--request-seconds", "600") as server:
        alone = sockets(server.process.pid)
        with Hog(server.url, HOG, idle=40, trickling=0) as hog:
            assert eventually(lambda: hog.held == 40)
            assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
            assert server_holds(server, alone) == alone and hog.closed_by_server == 0 and hog.held == 40
    with serving(db, tmp_path / "stderr.txt", *options, "--first-byte-seconds", "1") as server:
        with Hog(server.url, HOG, idle=40, trickling=0) as hog:
            # taken after a few seconds, held while there is room; then each one taken closes the longest waiting
            # (the server's eight include its listener and its wake-up socket), and a page still finds room
            assert eventually(lambda: hog.closed_by_server >= 32 and hog.closed_by_server + hog.held == 40)
            assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200


def test_a_connection_is_closed_when_it_takes_no_answer_not_while_it_reads_nor_while_it_idles(
        db: Path, tmp_path: Path) -> None:
    """An answer the app has finished, waiting whole in the server's buffer for a client that takes none of it, is
    closed after --write-seconds (waitress alone waits 120 s); a download its client reads steadily for longer than
    that is not cut; a kept-alive connection that asks for nothing meanwhile is kept (the server has room: closing
    idle connections made a botnet's connections come back all at once, bench/redteam/serve44) and answers its next
    request."""
    with serving(db, tmp_path / "stderr.txt", "--write-seconds", "3", "--request-seconds", "1") as server:
        alone = sockets(server.process.pid)
        parts = urllib.parse.urlsplit(server.url)
        kept = http.client.HTTPConnection(parts.hostname, parts.port, timeout=CLOSE_GUARD_S)
        kept.request("GET", "/tables")
        answer = kept.getresponse()
        assert answer.status == 200 and answer.read() and not answer.will_close  # kept alive for a next request
        leftover = page_url(server.url, "/sql.csv", q="SELECT i, pad FROM wide ORDER BY i LIMIT 2000")  # 2 MB
        with unread(leftover) as left:
            # its answer begun before another download asks: the SQL box lends downloads one lane, and a download
            # asked at once could take it first and leave this one a 503, whole in the client's buffer, its
            # connection then idle and rightly kept (a run in 5 to 25 failed so)
            assert _status_line(left) == b"HTTP/1.1 200"
            assert until(200, page_url(server.url, "/sql.csv", q="SELECT 1 AS written")) == 200  # its lane free again
            received = 0
            with urllib.request.urlopen(page_url(server.url, "/sql.csv", q="SELECT i, pad FROM wide ORDER BY i"),
                                        timeout=GUARD_S) as download:
                while chunk := download.read(1 << 16):
                    received += len(chunk)
                    time.sleep(0.01)  # 60 MB at most 6.5 MB/s: longer than either bound
            assert received == len("i,pad\r\n") + sum(len(str(i)) + ROW_BYTES + 3 for i in range(60000))
            assert server_holds(server, alone + 1) == alone + 1  # the unread answer's connection closed
        kept.request("GET", "/")  # idle for longer than --request-seconds
        assert kept.getresponse().status == 200
        kept.close()


def test_a_full_server_makes_room_by_closing_the_connection_that_waited_longest_for_a_request(
        db: Path, tmp_path: Path) -> None:
    """Many visitors each within their share (a botnet) once filled every connection with ones that sent nothing, and
    a visitor's connection waited in the kernel's queue until one closed (5 s, --request-seconds; never, with ten
    minutes). Now each new connection into a full server closes the one that has waited longest for a request: the
    first visitor's, which trickles half a request, goes first, the last one's stays, and a page is answered."""
    options = ("--connections", "12", "--connections-per-address", "4", "--request-seconds", "600", *TAKEN_AT_ONCE)
    with serving(db, tmp_path / "stderr.txt", *options) as server, ExitStack() as held:
        first = held.enter_context(Hog(server.url, "127.0.0.2", idle=0, trickling=4))
        eventually(lambda: first.sent_after_open > 0)  # the first visitor's four are older than the others'
        second = held.enter_context(Hog(server.url, "127.0.0.3", idle=4, trickling=0))
        last = held.enter_context(Hog(server.url, "127.0.0.4", idle=4, trickling=0))
        hogs = (first, second, last)
        assert eventually(lambda: first.closed_by_server > 0) and last.closed_by_server == 0
        closed = sum(hog.closed_by_server for hog in hogs)
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
        assert eventually(lambda: sum(hog.closed_by_server for hog in hogs) > closed)  # room made for the page
        assert last.closed_by_server == 0 and last.held == 4
    log = (tmp_path / "stderr.txt").read_text()
    assert "every connection taken (--connections): closing those that waited longest" in log
    assert "no longer accepting" not in log  # waitress's note, which its full server's accepting made untrue


def test_a_server_full_of_answers_being_sent_says_it_has_no_connection_to_close(db: Path, tmp_path: Path) -> None:
    """Where every connection is busy with an answer, a full server can make no room: it says so (waitress said it
    was no longer accepting new connections, which is said wrongly while it makes room). Downloads nobody reads are
    opened one at a time until the server says it is full (its map also holds its listener and waitress's trigger,
    so it fills before the third)."""
    said = "each busy with a request or its answer"
    log = tmp_path / "stderr.txt"
    with serving(db, log, "--connections", "3", "--write-seconds", "600", *TAKEN_AT_ONCE) as server, \
            ExitStack() as held:
        url = page_url(server.url, "/sql.csv", q="SELECT i, pad FROM wide ORDER BY i LIMIT 30000")
        for _ in range(3):
            if eventually(lambda: said in log.read_text(), seconds=2.0):
                break
            client = held.enter_context(unread(url))
            client.settimeout(GUARD_S)
            download = http.client.HTTPResponse(client)
            download.begin()
            assert download.status == 200
        assert eventually(lambda: said in log.read_text())
    assert "no longer accepting" not in log.read_text()


def test_a_full_server_never_closes_a_connection_whose_answer_is_being_written_or_waits_to_be_sent(
        db: Path, tmp_path: Path) -> None:
    """Two downloads nobody reads (one the app is still writing, past the 16 MB waitress holds; one the app has
    finished, its rest waiting in the server's buffer) hold their connections while visitors that send nothing fill
    the server and a page asks for room: the visitors' connections are closed to make it, the downloads arrive
    whole once read."""
    options = ("--connections", "8", "--connections-per-address", "3", "--request-seconds", "600",
               "--write-seconds", "600", *TAKEN_AT_ONCE)
    rows = {"writing": 30000, "written": 8000}
    with serving(db, tmp_path / "stderr.txt", *options) as server, ExitStack() as held:
        downloads = {}
        for name, count in rows.items():
            url = page_url(server.url, "/sql.csv", q=f"SELECT i, pad FROM wide ORDER BY i LIMIT {count}")
            downloads[name] = http.client.HTTPResponse(held.enter_context(unread(url)))
            downloads[name].begin()  # its answer has begun: its request is being answered
            assert downloads[name].status == 200
        hogs = [held.enter_context(Hog(server.url, f"127.0.0.{k}", idle=2, trickling=0)) for k in range(2, 7)]
        assert eventually(lambda: sum(hog.closed_by_server for hog in hogs) > 0)
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
        for name, count in rows.items():
            body = downloads[name].read()
            assert len(body) == len("i,pad\r\n") + sum(len(str(i)) + ROW_BYTES + 3 for i in range(count)), name


def test_the_server_raises_its_limit_of_open_files_to_hold_its_connections_or_says_it_holds_fewer(
        db: Path, tmp_path: Path) -> None:
    """4,096 connections by default: many systems start a process with 1,024 open files. The server raises its own
    limit as far as the system lets it; where that is too low (here 300, soft and hard), it holds as many as it can
    beside the files it needs otherwise, says so, and serves."""
    from jobs.web.channel import OPEN_FILES_KEPT, room_for_connections

    assert room_for_connections(8) == 8
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    raised = subprocess.run(  # a process started at 300 open files of the system's hard limit
        [sys.executable, "-c", "import resource; from jobs.web.channel import room_for_connections; "
         "resource.setrlimit(resource.RLIMIT_NOFILE, (300, resource.getrlimit(resource.RLIMIT_NOFILE)[1])); "
         "print(room_for_connections(4096), resource.getrlimit(resource.RLIMIT_NOFILE)[0])"],
        capture_output=True, text=True, check=True).stdout.split()
    held = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard - OPEN_FILES_KEPT)
    assert int(raised[0]) == held and int(raised[1]) >= held + OPEN_FILES_KEPT
    log = tmp_path / "stderr.txt"
    with serving(db, log, open_files=300) as server:
        assert get(page_url(server.url, "/"), timeout=GUARD_S).status == 200
    assert f"--connections 4096 lowered to {300 - OPEN_FILES_KEPT}: the system lets this process open too few" in (
        log.read_text())


def test_a_client_that_hung_up_is_seen_gone_before_its_pipelined_requests_are_answered() -> None:
    """waitress reads no more of a connection with two requests waiting, so a client that sent four and left was
    answered four times for nobody (bench/redteam/serve45, burst_close). A page thread now asks the system first
    whether the client has closed its side (a real TCP connection on loopback)."""
    from jobs.web.channel import _hung_up

    with socket.create_server(("127.0.0.1", 0)) as listener:
        for leave in (lambda client: client.shutdown(socket.SHUT_WR), lambda client: client.close()):
            client = socket.create_connection(listener.getsockname())
            server_side, _ = listener.accept()
            with server_side:
                client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 4)
                time.sleep(0.05)
                assert not _hung_up(server_side)  # requests waiting, client still there
                leave(client)
                assert eventually(lambda gone=server_side: _hung_up(gone), seconds=GUARD_S)
            assert _hung_up(server_side)  # closed by the server meanwhile: gone too, not an error
            client.close()
