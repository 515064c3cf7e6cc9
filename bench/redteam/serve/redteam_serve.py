# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 35-minute time box; not product code)
"""Red-team cases for `hubtrace serve` that bench/bench_serve_load.py does not run. Each case starts a fresh server
on --db, runs one attack for --seconds while an honest visitor (honest.py, its own process and address 127.0.9.1)
fetches a page a second, samples the server's RSS from /proc every 0.2 s, and prints one results row.

    nice -n 10 python bench/redteam/serve/redteam_serve.py --db /tmp/x.duckdb --case slowloris --seconds 35
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

HERE = Path(__file__).resolve().parent
GUARD_MB = 4000  # the server is killed past this RSS (the machine is shared); that counts as broken


def rss_mb(pid: int) -> float:
    """The resident memory of the server and of its children (the SQL lanes' processes, where there are any)."""
    try:
        own = next(int(line.split()[1]) / 1024 for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return float("nan")
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    return own + sum(m for m in (rss_mb(c) for c in children) if m == m)


class Server:
    def __init__(self, db: str, options: list[str]) -> None:
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".stderr", delete=False)
        self.process = subprocess.Popen(
            ["nice", "-n", "10", sys.executable, "-m", "jobs.cli.app", "serve", "--db", db, "--port", "0", *options],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.process.stdout.readline()
        self.url = re.search(r"http://\S+/", line).group(0)
        parts = urllib.parse.urlsplit(self.url)
        self.host, self.port = parts.hostname, parts.port
        # the python child of nice: /proc of the Popen pid is nice until it execs python; exec keeps the pid
        self.killed_by_guard = False

    def stderr(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()


def raw(server: Server, data: bytes, address: str = "127.0.0.1", read: bool = True, timeout: float = 20.0,
        limit: int = 1 << 20) -> bytes:
    """Send bytes on a fresh connection; return what came back (up to ``limit``)."""
    out = b""
    data = data.replace(b"Host: x\r\n", f"Host: {server.host}:{server.port}\r\n".encode(), 1)
    try:
        with socket.create_connection((server.host, server.port), timeout=timeout,
                                      source_address=(address, 0)) as s:
            s.sendall(data)
            if read:
                while len(out) < limit:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
    except OSError as e:
        out += f"<{type(e).__name__}>".encode()
    return out


def status_of(answer: bytes) -> str:
    m = re.match(rb"HTTP/1\.[01] (\d{3})", answer)
    return m.group(1).decode() if m else (answer[:40].decode(errors="replace") or "<nothing>")


# ---------------------------------------------------------------- attacks (each runs until stop is set)

def slowloris(server: Server, stop: threading.Event, stats: dict, addresses: int = 120, per: int = 12) -> None:
    """addresses x per connections, each trickling a request header one byte a second, reopened when closed."""
    async def one(address: str) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(server.host, server.port, local_addr=(address, 0))
            except OSError:
                stats["refused"] = stats.get("refused", 0) + 1
                await asyncio.sleep(1)
                continue
            stats["opened"] = stats.get("opened", 0) + 1
            payload = f"GET / HTTP/1.1\r\nHost: {server.host}:{server.port}\r\nX-a: ".encode() + b"b" * 10000
            try:
                for byte in payload:
                    if stop.is_set():
                        break
                    writer.write(bytes([byte]))
                    await writer.drain()
                    try:
                        if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                            break
                    except TimeoutError:
                        pass
            except OSError:
                pass
            stats["closed_by_server"] = stats.get("closed_by_server", 0) + 1
            writer.close()
            await asyncio.sleep(0.5)

    async def main() -> None:
        await asyncio.gather(*(one(f"127.0.4.{a + 1}") for a in range(addresses) for _ in range(per)))
    asyncio.run(main())


def pipeline(server: Server, stop: threading.Event, stats: dict) -> None:
    """Connections that pipeline 2,000 requests in one write: half read the answers, half read nothing."""
    req = b"".join(f"GET /search?q=ft-{k % 97:02d} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n\r\n".encode() for k in range(2000))

    def worker(k: int) -> None:
        while not stop.is_set():
            try:
                with socket.create_connection((server.host, server.port), timeout=60,
                                              source_address=(f"127.0.5.{k + 1}", 0)) as s:
                    s.sendall(req)
                    stats["sent"] = stats.get("sent", 0) + 2000
                    got = 0
                    if k % 2 == 0:
                        while not stop.is_set():
                            chunk = s.recv(65536)
                            if not chunk:
                                break
                            got += chunk.count(b"HTTP/1.1 200")
                    else:
                        stop.wait(40)
                    stats["answered"] = stats.get("answered", 0) + got
            except OSError as e:
                stats[type(e).__name__] = stats.get(type(e).__name__, 0) + 1
                stop.wait(0.5)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


BIG_SQL = "SELECT * FROM pair_tests t JOIN models m ON m.model_id = t.model_a"


def slow_download(server: Server, stop: threading.Event, stats: dict) -> None:
    """6 clients read downloads at 1 KB/s (4 tables, 2 SQL answers), and once every 5 s another client asks for a
    small table download and a small SQL statement to see whether the lanes are held for everyone."""
    def reader(k: int) -> None:
        path = "/tables/pair_tests.csv" if k < 4 else "/sql.csv?q=" + urllib.parse.quote(BIG_SQL)
        while not stop.is_set():
            try:
                with socket.create_connection((server.host, server.port), timeout=120,
                                              source_address=(f"127.0.6.{k + 1}", 0)) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                    s.sendall(f"GET {path} HTTP/1.1\r\nHost: {server.host}:{server.port}\r\n\r\n".encode())
                    first = s.recv(1024)
                    stats[f"reader {status_of(first)}"] = stats.get(f"reader {status_of(first)}", 0) + 1
                    while not stop.is_set():
                        if not s.recv(1024):
                            stats["reader cut by server"] = stats.get("reader cut by server", 0) + 1
                            break
                        stop.wait(1.0)
            except OSError as e:
                stats[f"reader {type(e).__name__}"] = stats.get(f"reader {type(e).__name__}", 0) + 1
            stop.wait(1.0)

    def prober() -> None:
        stop.wait(3)
        while not stop.is_set():
            a = raw(server, b"GET /tables/families.csv HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    "127.0.6.100", limit=200)
            stats[f"probe table download {status_of(a)}"] = stats.get(f"probe table download {status_of(a)}", 0) + 1
            a = raw(server, b"GET /sql?q=SELECT+1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "127.0.6.101",
                    limit=200)
            stats[f"probe SELECT 1 {status_of(a)}"] = stats.get(f"probe SELECT 1 {status_of(a)}", 0) + 1
            stop.wait(5)
    threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)] + [threading.Thread(target=prober)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def concurrent_sql(server: Server, stop: threading.Event, stats: dict) -> None:
    """16 clients of distinct addresses, each running distinct statements of about 1 s, again and again."""
    def client(k: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            q = f"SELECT count(*) FROM range(12000) a, range(8000) b WHERE (a.range * {k + 7} + b.range * {n}) % 13 = 0"
            t0 = time.perf_counter()
            a = raw(server, f"GET /sql?q={urllib.parse.quote(q)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    .encode(), f"127.0.7.{k + 1}", timeout=120, limit=1 << 22)
            key = status_of(a)
            stats[f"sql {key}"] = stats.get(f"sql {key}", 0) + 1
            stats.setdefault("sql seconds (200)", [])
            if key == "200":
                stats["sql seconds (200)"].append(round(time.perf_counter() - t0, 2))
            else:
                stop.wait(0.2)
    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = stats.pop("sql seconds (200)", [])
    if s:
        stats["sql 200 median s"] = statistics.median(s)


def huge(server: Server, stop: threading.Event, stats: dict) -> None:
    """Huge request lines, query strings, headers and bodies, over and over."""
    cases = {
        "10MB query string": b"GET /search?q=" + b"a" * 10_000_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "200KB query string": b"GET /search?q=" + b"a" * 200_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "200KB sql": b"GET /sql?q=SELECT+" + b"1%2B" * 60_000 + b"1 HTTP/1.1\r\nHost: x\r\n\r\n",
        "5MB header": b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"z" * 5_000_000 + b"\r\n\r\n",
        "20000 headers": b"GET / HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(20000)) + b"\r\n",
        "GET with 50MB body": b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n" + b"q" * 50_000_000,
        "chunked 30MB": b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                        + b"100000\r\n" + b"c" * 0x100000 + b"\r\n" + b"".join(
                            [b"100000\r\n" + b"c" * 0x100000 + b"\r\n"] * 29) + b"0\r\n\r\n",
        "long model id 1MB": b"GET /model?id=" + b"m" * 1_000_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    }

    def worker(k: int) -> None:
        names = list(cases)
        i = k
        while not stop.is_set():
            name = names[i % len(names)]
            i += 1
            t0 = time.perf_counter()
            a = raw(server, cases[name], f"127.0.8.{k + 1}", timeout=30, limit=4096)
            key = f"{name}: {status_of(a)}"
            stats[key] = stats.get(key, 0) + 1
            stats[f"{name}: worst s"] = max(stats.get(f"{name}: worst s", 0), round(time.perf_counter() - t0, 1))
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


HOSTILE = [
    "/?page=999999999999999999999", "/?page=-5", "/?page=1e308", "/?page=abc", "/?page=%00",
    "/?sort=model_id;DROP TABLE models", "/?sort=%00", "/?order=desc&sort=" + "x" * 5000,
    "/search?q=%00", "/search?q=%ff%fe", "/search?q=%25", "/search?q=_", "/search?q=%5C", "/search?q=' OR 1=1 --",
    "/search?q=&page=99999999", "/search?q=a&page=18446744073709551617",
    "/model?id=%00", "/model?id=fam0100/ft-2&page=99999999999", "/model?id=bigco/base&page=-1",
    "/model?id=bigco/base&page=1000000000000000000000000000000", "/model?id=../../etc/passwd",
    "/model?id=bigco/base&relatives_page=999999999", "/model",
    "/family?id=bigco/base&page=99999999999", "/family?id=bigco/base&q=%00&page=-3", "/family?id=%ff",
    "/family?id=bigco/base&q=" + "%" * 3000, "/family", "/pair?a=bigco/base&b=bigco/ft-0001",
    "/pair?a=%00&b=%00", "/pair?a=bigco/base&b=bigco/base", "/pair?a=x", "/pair",
    "/discrepancies?page=99999999999", "/discrepancies?page=-1",
    "/tables/%00.csv", "/tables/..%2f..%2fetc%2fpasswd.csv", "/tables/models.xml", "/tables/models.csv%00.json",
    "/tables/models?limit=99999999999", "/tables/models?page=-1", "/tables/pragma_version.csv",
    "/tables/duckdb_settings.csv",
    "/sql?q=%00", "/sql?q=SELECT+1%00;DROP+TABLE+models", "/sql?q=SELECT+1;SELECT+2", "/sql?q=",
    "/sql?q=SELECT+1&limit=-1", "/sql?q=SELECT+*+FROM+models&page=99999999999",
    "/sql.csv?q=SELECT+1&rows=999999999999", "/sql.json?q=SELECT+'\u2028'", "/sql?q=PRAGMA+database_list",
    "/sql?q=ATTACH+'/tmp/x.db'", "/sql?q=SELECT+*+FROM+read_text('/etc/passwd')", "/sql?q=CALL+checkpoint()",
    "/sql?q=SELECT+getenv('HOME')", "/sql?q=SELECT+current_setting('memory_limit')",
    "/sql?q=" + urllib.parse.quote("SELECT " + "(" * 2000 + "1" + ")" * 2000),
    "/sql?q=" + urllib.parse.quote("SELECT " + "+".join(["1"] * 20000)),
    "/sql?q=" + urllib.parse.quote("SELECT * FROM range(3) " + " ".join(f"UNION ALL SELECT {i}" for i in range(3000))),
    "/static/../../../../etc/passwd", "/static/%2e%2e/%2e%2e/etc/passwd", "//etc/passwd", "/%00",
    "/graph?family=bigco/base", "/family/graph?id=%00",
]


def hostile(server: Server, stop: threading.Event, stats: dict) -> None:
    """Every page type with hostile parameters, in a loop from two addresses; records each URL's status and time."""
    results: dict[str, set] = {}

    def worker(k: int) -> None:
        i = k
        while not stop.is_set():
            path = HOSTILE[i % len(HOSTILE)]
            i += 1
            t0 = time.perf_counter()
            a = raw(server, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(errors="replace"),
                    f"127.0.10.{k + 1}", timeout=60, limit=1 << 16)
            dt = time.perf_counter() - t0
            results.setdefault(path, set()).add(status_of(a))
            stats["worst s"] = max(stats.get("worst s", 0), round(dt, 2))
            if dt > 2:
                stats.setdefault("slow", []).append((path[:80], round(dt, 1)))
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for path, codes in results.items():
        for c in codes:
            stats[f"status {c}"] = stats.get(f"status {c}", 0) + 1
            if c.startswith("5") or not c.isdigit():
                stats.setdefault("5xx or no answer", []).append((path[:100], c))


METHODS = [b"HEAD / HTTP/1.1", b"OPTIONS / HTTP/1.1", b"OPTIONS * HTTP/1.1", b"TRACE / HTTP/1.1",
           b"CONNECT 127.0.0.1:22 HTTP/1.1", b"PROPFIND / HTTP/1.1", b"POST /sql?q=SELECT+1 HTTP/1.1",
           b"DELETE /tables/models.csv HTTP/1.1", b"get / HTTP/1.1", b"GETT / HTTP/1.1", b"G\x00T / HTTP/1.1",
           b"GET / HTTP/9.9", b"GET /", b"GET / HTTP/1.0", b"PRI * HTTP/2.0\r\n\r\nSM", b"\x16\x03\x01\x02\x00",
           b"HEAD /tables/pair_tests.csv HTTP/1.1", b"HEAD /sql.csv?q=" + urllib.parse.quote(BIG_SQL).encode()
           + b" HTTP/1.1", b"OPTIONS /sql?q=SELECT+sum(a.range*b.range)+FROM+range(1000000)+a,range(1000000)+b HTTP/1.1",
           b"GET http://evil.example/ HTTP/1.1", b"GET / HTTP/1.1\r\nHost: " + b"h" * 70000,
           b"GET / HTTP/1.1\r\nExpect: 100-continue", b"GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n"
           b"Content-Length: 5", b"GET / HTTP/1.1\r\nContent-Length: -1", b"GET / HTTP/1.1\r\nContent-Length: 1e9"]


def methods(server: Server, stop: threading.Event, stats: dict) -> None:
    """HEAD/OPTIONS/unknown methods and malformed request lines, in a loop; records each one's status and time."""
    results: dict[str, set] = {}
    i = 0
    while not stop.is_set():
        line = METHODS[i % len(METHODS)]
        i += 1
        t0 = time.perf_counter()
        data = line + (b"" if b"\r\n\r\n" in line else b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        a = raw(server, data, "127.0.11.1", timeout=30, limit=1 << 16)
        dt = time.perf_counter() - t0
        results.setdefault(line[:60].decode(errors="replace"), set()).add(status_of(a))
        stats["worst s"] = max(stats.get("worst s", 0), round(dt, 2))
        if dt > 2:
            stats.setdefault("slow", []).append((line[:60].decode(errors="replace"), round(dt, 1)))
    stats["by request"] = {k: sorted(v) for k, v in results.items()}


def big_rows(server: Server, stop: threading.Event, stats: dict) -> None:
    """Few rows, many bytes: the HTML page, CSV and JSON of statements whose rows are 20 MB strings or huge lists."""
    qs = {
        "html 100 x 20MB strings": "/sql?q=" + urllib.parse.quote("SELECT repeat('x', 20000000) AS s FROM range(100)"),
        "json 100 x 20MB strings": "/sql.json?q=" + urllib.parse.quote("SELECT repeat('x', 20000000) AS s FROM range(100)"),
        "csv 60 x 50MB strings": "/sql.csv?q=" + urllib.parse.quote("SELECT repeat('\"', 50000000) AS s FROM range(60)"),
        "html 500 x 1M-element lists": "/sql?q=" + urllib.parse.quote("SELECT range(1000000) AS l FROM range(500)"),
        "html one 400MB string": "/sql?q=" + urllib.parse.quote("SELECT repeat('<', 400000000) AS s"),
        "tables page of models": "/tables/models",
    }

    def worker(k: int) -> None:
        names = list(qs)
        i = k
        while not stop.is_set():
            name = names[i % len(names)]
            i += 1
            t0 = time.perf_counter()
            a = raw(server, f"GET {qs[name]} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
                    f"127.0.12.{k + 1}", timeout=120, limit=1 << 40)
            key = f"{name}: {status_of(a)} {len(a) // 1_000_000} MB"
            stats[key] = stats.get(key, 0) + 1
            stats[f"{name}: worst s"] = max(stats.get(f"{name}: worst s", 0), round(time.perf_counter() - t0, 1))
            stop.wait(0.5)
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def pair_cache(server: Server, stop: threading.Event, stats: dict) -> None:
    """Two clients ask for the evidence report of a different pair each time (the app keeps reports it drew):
    does the server's memory grow with the number of distinct pairs visited?"""
    def worker(k: int) -> None:
        n = k
        while not stop.is_set():
            a, b = ("bigco/base", f"bigco/ft-{n % 1000:04d}") if n % 2 else (f"fam{n % 2000:04d}/base", f"fam{n % 2000:04d}/ft-1")
            n += 2
            t0 = time.perf_counter()
            ans = raw(server, f"GET /pair?a={a}&b={b} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(),
                      f"127.0.13.{k + 1}", timeout=60, limit=1 << 26)
            key = f"pair {status_of(ans)}"
            stats[key] = stats.get(key, 0) + 1
            stats["worst s"] = max(stats.get("worst s", 0), round(time.perf_counter() - t0, 2))
            stats["last size KB"] = len(ans) // 1000
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def mix(server: Server, stop: threading.Event, stats: dict) -> None:
    parts = {"slowloris": lambda s, st: slowloris(server, s, st, addresses=60, per=12), "pipeline": pipeline,
             "slow_download": slow_download, "concurrent_sql": concurrent_sql, "hostile": hostile, "methods": methods}
    subs = {name: {} for name in parts}
    threads = [threading.Thread(target=(f if name == "slowloris" else (lambda f=f, name=name: f(server, stop, subs[name]))),
                                args=((stop, subs[name]) if name == "slowloris" else ()))
               for name, f in parts.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, sub in subs.items():
        for k, v in sub.items():
            if k not in ("by request",):
                stats[f"{name}: {k}"] = v


CASES = {"baseline": None, "slowloris": slowloris, "pipeline": pipeline, "slow_download": slow_download,
         "concurrent_sql": concurrent_sql, "huge": huge, "hostile": hostile, "methods": methods,
         "big_rows": big_rows, "pair_cache": pair_cache, "mix": mix}


def pct(xs: list[float], f: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(f * (len(xs) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--case", required=True, choices=list(CASES))
    p.add_argument("--seconds", type=float, default=35)
    p.add_argument("--serve", nargs=argparse.REMAINDER, default=[])
    args = p.parse_args()
    server = Server(args.db, args.serve)
    stop, stats, memory = threading.Event(), {}, []
    try:
        for path in ["/", "/model?id=bigco/base", "/family?id=bigco/base", "/tables"]:
            raw(server, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        before = rss_mb(server.process.pid)

        sampling = threading.Thread(target=sample_memory, args=(server, stop, memory))
        sampling.start()
        attack = threading.Thread(target=CASES[args.case], args=(server, stop, stats)) if CASES[args.case] else None
        if attack:
            attack.start()
            time.sleep(3)  # the attack is in place before the honest visitor starts
        honest = subprocess.run(["nice", "-n", "10", sys.executable, str(HERE / "honest.py"), server.url,
                                 str(args.seconds), "127.0.9.1"], capture_output=True, text=True)
        load1 = os.getloadavg()[0]
        stop.set()
        if attack:
            attack.join(90)
        sampling.join()
        alive = server.process.poll() is None
        after_probe = status_of(raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "127.0.9.2",
                                    timeout=30, limit=1 << 20))
        time.sleep(1)
        after = rss_mb(server.process.pid)
    finally:
        stop.set()
        err = server.stderr()
        server.stop()
    h = json.loads(honest.stdout) if honest.stdout.strip() else {"lat": [], "fails": {"no output": honest.stderr[-500:]}}
    lat = h["lat"]
    tracebacks = err.count("Traceback")
    row = {
        "case": args.case, "honest requests": len(lat),
        "median ms": round(statistics.median(lat) * 1000) if lat else None,
        "p95 ms": round(pct(lat, 0.95) * 1000) if lat else None,
        "worst ms": round(max(lat) * 1000) if lat else None,
        "over 1 s": sum(t > 1 for t in lat), "honest failures": h["fails"], "honest statuses": h.get("statuses"),
        "rss before MB": round(before), "rss peak MB": round(max(memory, default=float("nan"))),
        "rss after MB": round(after) if after == after else None, "killed by 4 GB guard": server.killed_by_guard,
        "alive at end": alive, "front page after attack": after_probe, "load avg 1m": round(load1, 2),
        "tracebacks in stderr": tracebacks, "attack": stats,
    }
    print(json.dumps(row, default=str))
    print_server_log(err)


def sample_memory(server, stop: threading.Event, memory: list[float]) -> None:
    """The server's RSS every 0.2 s into ``memory`` until ``stop``; the server killed past GUARD_MB."""
    while not stop.is_set():
        m = rss_mb(server.process.pid)
        memory.append(m)
        if m > GUARD_MB and not server.killed_by_guard:
            server.killed_by_guard = True
            os.kill(server.process.pid, signal.SIGKILL)
        stop.wait(0.2)


def print_server_log(err: str) -> None:
    """The server's first traceback, if any, and its first 8 distinct `hubtrace serve:` lines (digits as #), to stderr."""
    if "Traceback" in err:
        i = err.find("Traceback")
        print("FIRST TRACEBACK:\n" + err[i:i + 3000], file=sys.stderr)
    lines = [ln for ln in err.splitlines() if ln.startswith("hubtrace serve:")]
    print("STDERR hubtrace lines (first 8 distinct):", file=sys.stderr)
    for ln in list(dict.fromkeys(re.sub(r"\d", "#", ln) for ln in lines))[:8]:
        print("  " + ln, file=sys.stderr)


if __name__ == "__main__":
    main()
