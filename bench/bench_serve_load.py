"""`hubtrace serve` under load: 50 clients reading pages while others run slow SQL and walk away from it, hold
downloads they read slowly or not at all, or hold connections that send nothing.

    PYTHONPATH=. python bench/bench_serve_load.py                      # 10,000 models, 4 x 60 s of load
    PYTHONPATH=. python bench/bench_serve_load.py --phases alone,downloads,botnet --seconds 45
    PYTHONPATH=. python bench/bench_serve_load.py --phases alone,everything --seconds 60
    PYTHONPATH=. python bench/bench_serve_load.py --models 2000 --big-family 300 --seconds 30
    PYTHONPATH=. python bench/bench_serve_load.py --serve --sql-slots 1 --query-seconds 10

The database is bench/bench_serve.py's synthetic hub, built once under .hubtrace-cache/bench-load/. One real server
process with its default bounds (jobs.web.limits; --serve passes other options) is loaded for --seconds in each
phase (--phases, the first four by default), so each later phase's difference is its clients' doing whatever else
the machine runs:

1. pages alone: --page-clients threads (default 50) in a process of their own, each a visitor of its own address
   (127.0.1.x; Linux answers every address of 127.0.0.0/8), fetching the front page, model pages, family views,
   searches and discrepancies in a loop, every response read whole, waiting --think seconds (default 5) before the
   next, as a reader does (each starts at a random moment of its first pause);
2. the same, while --sql-clients threads (default 4) run a statement that would work for hours (a 10^12-row cross
   join) again and again, which the server stops at its time limit or turns away (503) when its SQL lanes are
   taken, and one more client sends the statement and hangs up at once, every two seconds (the server must stop it,
   not run it for nobody);
3. the same pages, while --idle-clients visitors (default 40, each of its own address) hold a connection that sends
   half a request line and nothing more (opened again when the server closes it), --stalled-clients (default 8,
   each of its own address, 127.0.6.x: one turned away holds its idle connection until it hangs up) ask for the
   biggest table and the biggest SQL answer as CSV and read nothing (the server cuts each off after
   --write-seconds of nothing taken, and they ask again), and --slow-clients (default 4) download the biggest table
   at 64 KB/s;
4. the same pages, while one visitor (127.0.0.2) holds --hog-idle connections (default 150) that send nothing and
   --hog-trickling (default 50) that send a request's header a byte every half second (slowloris), each opened
   again half a second after the server closes or refuses it;
5. (``--phases ...,botnet``, not run by default) the same pages, while --bots visitors (default 64, each of its own
   address, 127.0.3.x) each hold --bot-connections idle connections (default 15: within the per-address bound),
   each opened again half a second after the server closes it;
6. (``--phases ...,everything``, not run by default) the same pages while every visitor above acts at once (the slow
   SQL and the one who leaves, the idle connections, the unread and 64 KB/s downloads, the hog's idle and slowloris
   connections, the botnet), and two more: --crawlers (default 6, each of its own address, 127.0.4.x) that read
   `/sql.csv` of the biggest answer and `/tables/*.csv` at 1 KB/s (a 4 KB receive window), asking again when cut
   off, and --hostile-clients (default 2, 127.0.5.x) that cycle through `HOSTILE_URLS`, every page with parameters
   far out of range, malformed, or written to break the SQL box, each answer read whole.

Prints, for each phase, the page latencies (median, 95th and 99th percentile, worst, how many took over a second), what
became of the SQL and download requests, the idle connections and the hostile URLs, and the server's resident memory
(sampled every 0.2 s from /proc: before, peak, after). Goals: pages p95 <= 1 s while the slow SQL runs (issue 34), and
pages answered within a second while any number of downloads and idle connections are open (issue 44), the server's
memory bounded.
"""

from __future__ import annotations

import argparse
import functools
import http.client
import itertools
import multiprocessing
import os
import queue
import random
import socket
import statistics
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from bench_serve import cached_database

from tests.serve_support import Hog, Server, page_url, serving, unread

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache" / "bench-load"
SLOW = "SELECT sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"
BIG_TABLE = "pair_tests"
BIG_SQL = "SELECT * FROM pair_tests t JOIN models m ON m.model_id = t.model_a"
HOG = "127.0.0.2"
CRAWLED = ("/sql.csv", f"/tables/{BIG_TABLE}.csv", "/tables/lineage_edges.csv", "/tables/models.csv")
"""What the 1 KB/s readers of the everything phase download (the SQL one with `BIG_SQL`)."""
HOSTILE_URLS = [
    ("/", {"page": "1" + "0" * 30}), ("/", {"page": "-3"}), ("/", {"page": "nan"}), ("/", {"sort": "x; DROP TABLE"}),
    ("/search", {"q": "%_\\"}), ("/search", {"q": "\x00\uffff"}), ("/search", {"q": "a", "page": str(2**64 + 1)}),
    ("/model", {"id": "../../etc/passwd"}), ("/model", {"id": "bigco/base", "page": "9" * 25}),
    ("/model", {"id": "m" * 100_000}), ("/family", {"id": "bigco/base", "q": "%" * 2000, "page": "-7"}),
    ("/family?id=%ff%fe", {}), ("/pair", {"a": "bigco/base", "b": "bigco/ft-0007"}),
    ("/pair", {"a": "nobody/x", "b": "nobody/y" * 5000}), ("/discrepancies", {"page": "1e308"}),
    ("/tables/..%2fmodels.csv", {}), ("/tables/duckdb_settings.json", {}), ("/tables/models", {"page": "-1"}),
    ("/sql", {"q": "SELECT 1; SELECT 2"}), ("/sql", {"q": "ATTACH '/tmp/x.duckdb'"}),
    ("/sql", {"q": "SELECT * FROM read_text('/etc/hostname')"}), ("/sql", {"q": "CALL checkpoint()"}),
    ("/sql", {"q": "SELECT " + "(" * 1500 + "1" + ")" * 1500}), ("/sql", {"q": "SELECT " + " + ".join(["2"] * 15000)}),
    ("/sql", {"q": "SELECT 1 " + " ".join(f"UNION ALL SELECT {i}" for i in range(2000))}),
    ("/sql", {"q": "SELECT DATE '5881580-07-10'"}), ("/sql.json", {"q": "SELECT '\u2028', 'nan'::DOUBLE"}),
    ("/static/../../etc/passwd", {}), ("/%00", {}),
]
"""What the hostile visitors of the everything phase ask for, over and over: each must be answered (most with 400 or
404), never hang or fail the server."""


class FromAddress(urllib.request.HTTPHandler):
    """urllib's HTTP from one source address: each client is a visitor of its own (the server bounds connections per
    address)."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(http.client.HTTPConnection, source_address=(self.address, 0)), req)


def rss_mb(pid: int) -> float:
    """The process's resident memory now, in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Phase:
    """What one phase of load measured."""

    latencies: list[list[float]]
    failures: Counter = field(default_factory=Counter)
    sql: Counter = field(default_factory=Counter)
    downloads: Counter = field(default_factory=Counter)
    connections: Counter = field(default_factory=Counter)
    hostile: Counter = field(default_factory=Counter)
    """The hostile visitors' answers by status."""
    memory: list[float] = field(default_factory=list)
    load: float = float("nan")
    """The machine's load average (1 minute) at the phase's end."""


def read_pages(url: str, pages: list[tuple[str, dict]], clients: int, think: float, seconds: float,
               answers: multiprocessing.Queue) -> None:
    """The page readers, in a process of their own: beside 2,000 attacking connections a second in the bench's own
    process they would wait for its interpreter lock, and their latencies would be the bench's, not the server's.
    Puts each page's latencies and the failures on ``answers``."""
    latencies: list[list[float]] = [[] for _ in pages]
    failures: Counter = Counter()
    stop = threading.Event()

    def pages_client(offset: int) -> None:
        i = offset
        opener = urllib.request.build_opener(FromAddress(f"127.0.1.{offset + 1}"))
        stop.wait(random.Random(offset).uniform(0, think))  # readers arrive over a pause, not all at once
        while not stop.is_set():
            k = i % len(pages)
            i += 1
            started = time.perf_counter()
            try:
                with opener.open(page_url(url, pages[k][0], **pages[k][1]), timeout=120) as answer:
                    answer.read()
                latencies[k].append(time.perf_counter() - started)
            except (urllib.error.URLError, OSError) as error:
                failures[type(error).__name__] += 1
            stop.wait(think)

    readers = [threading.Thread(target=pages_client, args=(k,)) for k in range(clients)]
    for thread in readers:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for thread in readers:
        thread.join()
    answers.put((latencies, failures))


def load(server: Server, pages: list[tuple[str, dict]], args: argparse.Namespace, sql_clients: int = 0,
         downloads: bool = False, hog: bool = False, botnet: bool = False, crawl: bool = False,
         hostile: bool = False) -> Phase:
    """--seconds of page clients (and ``sql_clients`` slow-SQL clients and one that leaves, if any; the idle,
    stalled and slow download clients, if ``downloads``; the visitor holding connections, if ``hog``; the many
    visitors each holding its share, if ``botnet``; the 1 KB/s readers, if ``crawl``; the hostile URLs, if
    ``hostile``)."""
    phase = Phase([[] for _ in pages])
    stop = threading.Event()
    table, answer = page_url(server.url, f"/tables/{BIG_TABLE}.csv"), page_url(server.url, "/sql.csv", q=BIG_SQL)

    def sql_client() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(page_url(server.url, "/sql", q=SLOW), timeout=300) as answer:
                    answer.read()
                    phase.sql[f"answered {answer.status}"] += 1
            except urllib.error.HTTPError as error:
                text = error.read().decode()
                phase.sql["stopped at the time limit" if "stopped" in text else
                          "turned away, lanes taken (503)" if error.code == 503 else f"HTTP {error.code}"] += 1
                if error.code == 503:
                    stop.wait(1.0)
            except (urllib.error.URLError, OSError) as error:
                phase.sql[type(getattr(error, "reason", error)).__name__] += 1
                stop.wait(1.0)

    def leaving_client() -> None:
        parts = urlsplit(page_url(server.url, "/sql", q=SLOW))
        while not stop.is_set():
            with socket.create_connection((parts.hostname, parts.port)) as client:
                client.sendall(f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
                time.sleep(0.2)
            phase.sql["sent and left"] += 1
            stop.wait(2.0)

    def idle_client(address: str) -> None:
        parts = urlsplit(server.url)
        while not stop.is_set():
            try:
                with socket.create_connection((parts.hostname, parts.port), source_address=(address, 0)) as client:
                    client.sendall(b"GET / HT")  # half a request line, then nothing
                    phase.connections["idle: opened"] += 1
                    client.settimeout(0.5)
                    while not stop.is_set():
                        try:
                            if not client.recv(1):
                                break
                        except TimeoutError:
                            continue
                    else:
                        return
            except OSError:
                pass
            phase.connections["idle: closed by the server"] += 1
            stop.wait(0.5)

    def stalled_client(url: str, address: str) -> None:
        while not stop.is_set():  # asks, reads nothing for --stall seconds, hangs up, asks again
            with unread(url, source=address):
                phase.downloads["stalled: asked and read nothing"] += 1
                stop.wait(args.stall)

    def slow_client() -> None:
        while not stop.is_set():
            try:
                with urllib.request.urlopen(table, timeout=300) as download:
                    phase.downloads[f"slow {download.status}"] += 1
                    while not stop.is_set() and download.read(16384):
                        stop.wait(0.25)  # 64 KB/s
            except urllib.error.HTTPError as error:
                phase.downloads[f"slow {error.code}"] += 1
                stop.wait(1.0)
            except (urllib.error.URLError, OSError) as error:
                phase.downloads[f"slow {type(error).__name__}"] += 1

    def crawler(k: int) -> None:
        path = CRAWLED[k % len(CRAWLED)]
        url = page_url(server.url, path, **({"q": BIG_SQL} if path == "/sql.csv" else {}))
        while not stop.is_set():
            try:
                with unread(url, source=f"127.0.4.{k + 1}") as client:
                    client.settimeout(60)
                    status = b"".join(client.recv(1024).split(b" ", 2)[1:2]).decode() or "no answer"
                    phase.downloads[f"1 KB/s {path}: {status}"] += 1
                    while status == "200" and not stop.wait(1.0):
                        if not client.recv(1024):
                            phase.downloads[f"1 KB/s {path}: cut off by the server"] += 1
                            break
            except OSError as error:
                phase.downloads[f"1 KB/s {path}: {type(error).__name__}"] += 1
            stop.wait(1.0)

    def hostile_client(k: int) -> None:
        opener = urllib.request.build_opener(FromAddress(f"127.0.5.{k + 1}"))
        for i in itertools.count(k):
            if stop.is_set():
                return
            path, params = HOSTILE_URLS[i % len(HOSTILE_URLS)]
            try:
                with opener.open(page_url(server.url, path, **params), timeout=120) as answer:
                    answer.read()
                    status = answer.status
            except urllib.error.HTTPError as error:
                error.read()
                status = error.code
            except (urllib.error.URLError, OSError) as error:
                status = type(error).__name__
            phase.hostile[f"{status}"] += 1

    def sampler() -> None:
        while not stop.is_set():
            phase.memory.append(rss_mb(server.process.pid))
            stop.wait(0.2)

    background = [threading.Thread(target=sampler)]
    if sql_clients:
        background += [threading.Thread(target=sql_client) for _ in range(sql_clients)]
        background.append(threading.Thread(target=leaving_client))
    if downloads:
        background += [threading.Thread(target=idle_client, args=(f"127.0.2.{k + 1}",))
                       for k in range(args.idle_clients)]
        background += [threading.Thread(target=stalled_client, args=(table if k % 2 else answer, f"127.0.6.{k + 1}"))
                       for k in range(args.stalled_clients)]
        background += [threading.Thread(target=slow_client) for _ in range(args.slow_clients)]
    if crawl:
        background += [threading.Thread(target=crawler, args=(k,)) for k in range(args.crawlers)]
    if hostile:
        background += [threading.Thread(target=hostile_client, args=(k,)) for k in range(args.hostile_clients)]
    for thread in background:
        thread.start()
    with ExitStack() as held:
        holder = held.enter_context(Hog(server.url, HOG, idle=args.hog_idle if hog else 0,
                                        trickling=args.hog_trickling if hog else 0, reconnect=True))
        bots = [held.enter_context(Hog(server.url, f"127.0.3.{k + 1}", idle=args.bot_connections, trickling=0,
                                       reconnect=True)) for k in range(args.bots if botnet else 0)]
        if sql_clients or downloads or hog or botnet or crawl or hostile:
            time.sleep(2.0)  # the slow statements, downloads and held connections are there before the pages start
        spawn = multiprocessing.get_context("spawn")
        answers = spawn.Queue()
        readers = spawn.Process(target=read_pages, args=(server.url, pages, args.page_clients, args.think,
                                                         args.seconds, answers))
        readers.start()
        try:  # the readers' own --seconds, and their last pages (each waits up to 120 s)
            phase.latencies, phase.failures = answers.get(timeout=args.seconds + 180)
        except queue.Empty:
            raise SystemExit(f"the page readers' process gave no answer (exit code {readers.exitcode})") from None
        readers.join()
        stop.set()
        phase.load = os.getloadavg()[0]
        for thread in background:
            thread.join()
        if hog:
            phase.connections.update({"hog: opened": holder.opened, "hog: closed or refused by the server":
                                      holder.closed_by_server, "hog: open at the end": holder.held})
        if botnet:
            phase.connections.update({
                "bots: opened": sum(bot.opened for bot in bots),
                "bots: closed or refused by the server": sum(bot.closed_by_server for bot in bots),
                "bots: open at the end": sum(bot.held for bot in bots)})
    return phase


def report(title: str, phase: Phase, pages: list[tuple[str, dict]], seconds: float) -> None:
    every = [t for times in phase.latencies for t in times]
    print(f"\n{title}: {len(every) / seconds:.1f} pages/s answered, load average {phase.load:.1f}")
    print("| pages | requests | median ms | p95 ms | p99 ms | worst ms | over 1 s |\n|---|---|---|---|---|---|---|")

    def row(label: str, times: list[float]) -> None:
        times = sorted(times)
        if not times:
            print(f"| {label} | 0 | | | | | |")
            return
        q = lambda f: times[min(len(times) - 1, round(f * (len(times) - 1)))] * 1000  # noqa: E731
        print(f"| {label} | {len(times)} | {statistics.median(times) * 1000:.0f} | {q(0.95):.0f} | {q(0.99):.0f} "
              f"| {times[-1] * 1000:.0f} | {sum(t > 1.0 for t in times)} |")

    for (path, params), times in zip(pages, phase.latencies):
        row(path + (f" {params}" if params else ""), times)
    row("all pages", every)
    print(f"page failures: {dict(phase.failures) or 'none'}")
    if phase.sql:
        print(f"SQL requests: {dict(phase.sql)}")
    if phase.downloads:
        print(f"download clients: {dict(phase.downloads)}")
    if phase.connections:
        print(f"idle connections: {dict(phase.connections)}")
    if phase.hostile:
        print(f"hostile URLs, answers by status: {dict(phase.hostile)}")
    print(f"server memory (RSS) peak: {max(phase.memory, default=float('nan')):.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--big-family", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0, help="of each phase")
    parser.add_argument("--page-clients", type=int, default=50)
    parser.add_argument("--sql-clients", type=int, default=4)
    parser.add_argument("--think", type=float, default=5.0, help="seconds each page client waits between pages")
    parser.add_argument("--idle-clients", type=int, default=40, help="visitors whose connection sends half a request")
    parser.add_argument("--hog-idle", type=int, default=150, help="connections one visitor holds that send nothing")
    parser.add_argument("--hog-trickling", type=int, default=50,
                        help="connections the same visitor holds that send a request a byte every half second")
    parser.add_argument("--bots", type=int, default=64, help="visitors of the botnet phase, each of its own address")
    parser.add_argument("--bot-connections", type=int, default=15,
                        help="idle connections each bot holds (within the default 16 an address)")
    parser.add_argument("--stalled-clients", type=int, default=8, help="downloads asked for and never read")
    parser.add_argument("--slow-clients", type=int, default=4, help="downloads read at 64 KB/s")
    parser.add_argument("--stall", type=float, default=40.0, help="seconds a stalled client holds its connection")
    parser.add_argument("--crawlers", type=int, default=6, help="downloads read at 1 KB/s (everything phase)")
    parser.add_argument("--hostile-clients", type=int, default=2,
                        help="visitors cycling through hostile URLs (everything phase)")
    parser.add_argument("--phases", default="alone,sql,downloads,hog",
                        help="the phases to run, in this order, of: alone, sql, downloads, hog, botnet, everything")
    parser.add_argument("--serve", nargs=argparse.REMAINDER, default=[],
                        help="options for hubtrace serve, e.g. --serve --sql-slots 1 --threads 2")
    args = parser.parse_args()
    db = cached_database(CACHE, args.models, args.big_family)
    pages = [("/", {}), ("/model", {"id": "fam0100/ft-2"}), ("/model", {"id": "bigco/base"}),
             ("/family", {"id": "bigco/base"}), ("/family", {"id": "fam0100/base"}), ("/search", {"q": "ft-05"}),
             ("/model", {"id": f"bigco/ft-{args.big_family // 2:04d}"}), ("/discrepancies", {})]
    titles = {"alone": "pages alone",
              "sql": f"pages while {args.sql_clients} clients run slow SQL and one sends it and leaves",
              "downloads": f"pages while {args.idle_clients} idle connections, {args.stalled_clients} downloads nobody "
                           f"reads and {args.slow_clients} read at 64 KB/s are open",
              "hog": f"pages while one visitor holds {args.hog_idle} idle and {args.hog_trickling} trickling "
                     "connections",
              "botnet": f"pages while {args.bots} visitors each hold {args.bot_connections} idle connections",
              "everything": f"pages while every visitor above acts at once, with {args.crawlers} downloads read at "
                            f"1 KB/s and {args.hostile_clients} visitors asking for hostile URLs"}
    clients = {"alone": {}, "sql": {"sql_clients": args.sql_clients}, "downloads": {"downloads": True},
               "hog": {"hog": True}, "botnet": {"botnet": True},
               "everything": {"sql_clients": args.sql_clients, "downloads": True, "hog": True, "botnet": True,
                              "crawl": True, "hostile": True}}
    chosen = args.phases.split(",")
    if unknown := set(chosen) - set(titles):
        parser.error(f"no phase {', '.join(sorted(unknown))} (there are {', '.join(titles)})")
    with tempfile.TemporaryDirectory() as tmp, serving(db, Path(tmp) / "stderr.txt", *args.serve) as server:
        for path, params in pages:  # warm: the first model and family pages read their tables once
            urllib.request.urlopen(page_url(server.url, path, **params)).read()
        before = rss_mb(server.process.pid)
        measured = {name: load(server, pages, args, **clients[name]) for name in chosen}
        time.sleep(1.0)
        after = rss_mb(server.process.pid)
        stopped = (Path(tmp) / "stderr.txt").read_text().count("stopped a statement")
    print(f"{args.page_clients} page clients ({args.think:g} s between pages), {args.models:,} models, "
          f"{args.seconds:.0f} s a phase, hubtrace serve {' '.join(args.serve) or '(defaults)'}, {os.cpu_count()} CPUs")
    for name, phase in measured.items():
        report(titles[name], phase, pages, args.seconds)
    peak = max(m for phase in measured.values() for m in phase.memory)
    print(f"\nstatements the server stopped: {stopped}; server memory (RSS): {before:.0f} MB before, "
          f"{peak:.0f} MB peak, {after:.0f} MB after")


if __name__ == "__main__":
    main()
