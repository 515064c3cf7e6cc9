# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 40-minute time box; not product code)
"""Red team 45: cases for `hubtrace serve` beyond serve44's. Reuses redteam44's harness (fresh server, honest.py at
127.0.9.1 one page a second, RSS sampled) and adds an `ss -ltn` sampler of the listener's accept queue.

    PYTHONPATH=/work/main nice -n 10 /work/main/.venv/bin/python bench/redteam/serve45/redteam45.py --db /tmp/rt44.duckdb --case rotate_pages --seconds 40
"""
from __future__ import annotations

import asyncio
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve44"))
import redteam44 as r44  # noqa: E402

rt = r44.rt
_bump = r44._bump
_fresh = itertools.count()


def fresh_address() -> str:
    """A new loopback address each call (127.100.0.1 ... 127.227.255.250): every request a 'new visitor'."""
    n = next(_fresh)
    return f"127.{100 + (n // 62500) % 128}.{(n // 250) % 250}.{n % 250 + 1}"


def ss_sampler(server, stop, stats) -> None:
    """The listener's Recv-Q (accept queue) every 2 s, and the server's open connections (established, its port)."""
    qs, est = [], []
    while not stop.is_set():
        out = subprocess.run(["ss", "-ltnH", f"sport = :{server.port}"], capture_output=True, text=True).stdout.split()
        if len(out) >= 2:
            qs.append(int(out[1]))
        e = subprocess.run(["ss", "-tnH", "state", "established", f"sport = :{server.port}"], capture_output=True, text=True).stdout
        est.append(e.count("\n"))
        if os.environ.get("HT_PYSPY_RECORD") and len(qs) == 3:  # 12 s of samples of every thread, idle included
            rec = Path(__file__).parent / "results" / f"{os.environ['HT_PYSPY_RECORD']}.collapsed"
            subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "--pid", str(server.process.pid), "--duration", "12",
                              "--rate", "50", "--idle", "--threads", "--nonblocking", "--format", "raw", "-o", str(rec)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.environ.get("HT_PYSPY") and len(qs) in (4, 9):
            out = Path(__file__).parent / "results" / f"{os.environ['HT_PYSPY']}-t{2 * len(qs)}"
            states = subprocess.run(["ss", "-tanH", f"sport = :{server.port}"], capture_output=True, text=True).stdout
            count = {}
            for line in states.splitlines():
                count[line.split()[0]] = count.get(line.split()[0], 0) + 1
            dump = subprocess.run(["/tmp/pyspy/bin/py-spy", "dump", "--pid", str(server.process.pid)], capture_output=True, text=True)
            out.with_suffix(".pyspy").write_text(f"server-side socket states: {count}\n" + dump.stdout + dump.stderr)
        stop.wait(2)
    stats["acceptq samples"] = qs
    stats["server-side established samples"] = est


def with_ss(attack):
    def run(server, stop, stats):
        t = threading.Thread(target=ss_sampler, args=(server, stop, stats))
        t.start()
        attack(server, stop, stats)
        t.join()
    run.__doc__ = attack.__doc__
    return run


def _rotating_flood(server, stop, stats, requests: list[bytes], threads: int) -> None:
    """``threads`` closed-loop clients; every request on a fresh connection from a never-seen address, answer read."""
    def worker(k: int) -> None:
        i = k
        while not stop.is_set():
            data = requests[i % len(requests)].replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())
            i += 1
            try:
                with socket.create_connection((server.host, server.port), timeout=20, source_address=(fresh_address(), 0)) as s:
                    s.sendall(data)
                    first = s.recv(200)
                    _bump(stats, f"answer {rt.status_of(first)}")
                    while s.recv(65536):
                        pass
            except OSError as e:
                _bump(stats, f"io {type(e).__name__}")
                stop.wait(0.05)
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts: t.start()
    for t in ts: t.join()


def rotate_pages(server, stop, stats) -> None:
    """24 closed-loop clients asking real pages (/, /discrepancies, /search, /family), each request from a new address."""
    _rotating_flood(server, stop, stats, r44.CHEAP, 24)


def rotate_404(server, stop, stats) -> None:
    """24 closed-loop clients asking a missing page (404, cheap), each request from a new address."""
    _rotating_flood(server, stop, stats, [b"GET /no-such-page HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"], 24)


def rotate_pages_8(server, stop, stats) -> None:
    """8 closed-loop clients asking real pages, each request from a new address (a lighter load)."""
    _rotating_flood(server, stop, stats, r44.CHEAP, 8)


def fixed_pages_24(server, stop, stats) -> None:
    """Control for rotate_pages: 24 closed-loop clients asking real pages, each from its own FIXED address."""
    r44._flood(server, stop, stats, r44.CHEAP, 24, "127.31", read=True)


def over_limit(server, stop, stats) -> None:
    """400 addresses x 16 = 6,400 keep-alive connections (above the 4,096 limit): each asks a 404, reads it, idles;
    reopened at once when closed, so the full server must make room continuously."""
    r44.conn_loop(server, stop, stats, 400, 16, "127.32", b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", read_answer=True)


def idle_plus_rotate(server, stop, stats) -> None:
    """255 addresses x 16 = 4,080 idle keep-alive holders (near full) plus 8 rotating-address page clients."""
    t = threading.Thread(target=r44.conn_loop, args=(server, stop, stats, 255, 16, "127.33",
                                                     b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", True))
    t.start()
    time.sleep(3)
    _rotating_flood(server, stop, stats, r44.CHEAP, 8)
    t.join()


def idle_plus_pages(server, stop, stats) -> None:
    """250 addresses x 16 = 4,000 idle keep-alive holders (each asked a 404 once; reopened if closed) plus 12
    closed-loop clients of fixed addresses asking real pages (fixed_pages_24's kind of load, half of it)."""
    t = threading.Thread(target=r44.conn_loop, args=(server, stop, stats, 250, 16, "127.36",
                                                     b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", True))
    t.start()
    time.sleep(3)
    r44._flood(server, stop, stats, r44.CHEAP, 12, "127.37", read=True)
    t.join()


def slower_than_honest(server, stop, stats) -> None:
    """150 fixed addresses, each asking a real page every 2 s (half the honest visitor's rate) on a fresh connection,
    Connection: close, answer read; no pipelining, no rotation: ~75 pages/s in all."""
    async def one(k: int) -> None:
        address = f"127.38.{k // 250}.{k % 250 + 1}"
        i = k
        await asyncio.sleep(k * 2.0 / 150)
        while not stop.is_set():
            t0 = time.monotonic()
            data = r44.CHEAP[i % len(r44.CHEAP)].replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())
            i += 1
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(server.host, server.port, local_addr=(address, 0)), 10)
                writer.write(data); await writer.drain()
                first = await asyncio.wait_for(reader.read(200), 60)
                _bump(stats, f"answer {rt.status_of(first)}")
                while await asyncio.wait_for(reader.read(65536), 60):
                    pass
                writer.close()
            except (OSError, TimeoutError) as e:
                _bump(stats, f"io {type(e).__name__}")
            await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - t0)))

    async def main() -> None:
        await asyncio.gather(*(one(k) for k in range(150)))
    asyncio.run(main())


def unread_pages(server, stop, stats, hold: float = 35.0) -> None:
    """250 addresses x 16 = 4,000 keep-alive connections, each pipelining 4 GETs of /discrepancies and never reading a
    byte (answers pile in the kernel buffers and in waitress's outbufs); each closed by the client after ``hold`` s
    (35: past the server's 30 s cut of unread answers) and reopened at once."""
    req = b"GET /discrepancies HTTP/1.1\r\nHost: x\r\n\r\n" * 4
    payload = req.replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())

    async def one(address: str) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(server.host, server.port, local_addr=(address, 0)), 10)
            except (OSError, TimeoutError) as e:
                _bump(stats, f"connect {type(e).__name__}"); await asyncio.sleep(0.2); continue
            _bump(stats, "opened")
            try:
                writer.write(payload); await writer.drain()
                writer.transport.pause_reading()  # never read: the answer stays in the buffers
                t0 = time.monotonic()
                while not stop.is_set() and time.monotonic() - t0 < hold:
                    await asyncio.sleep(0.5)
                _bump(stats, "closed by client")
            except OSError as e:
                _bump(stats, f"io {type(e).__name__}")
            writer.close()

    async def main() -> None:
        await asyncio.gather(*(one(f"127.34.{a // 250}.{a % 250 + 1}") for a in range(250) for _ in range(16)))
    asyncio.run(main())


def burst_close(server, stop, stats) -> None:
    """unread_pages, but each connection closes itself 1 s after sending its 4 pipelined requests and reopens at once
    (4,000 connections whose requests are queued, then abandoned)."""
    unread_pages(server, stop, stats, hold=1.0)


def pipeline_flood(server, stop, stats) -> None:
    """60 addresses x 4 keep-alive connections, each pipelining 50 GETs of real pages at a time and reading them
    all, again and again (keeps the server's queue full without new connections)."""
    reqs = b"".join(r.replace(b"Connection: close\r\n", b"") for r in r44.CHEAP) * 12 + b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 2
    payload = reqs.replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())

    async def one(address: str) -> None:
        while not stop.is_set():
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(server.host, server.port, local_addr=(address, 0)), 10)
            except (OSError, TimeoutError) as e:
                _bump(stats, f"connect {type(e).__name__}"); await asyncio.sleep(0.2); continue
            try:
                while not stop.is_set():
                    writer.write(payload); await writer.drain()
                    got = 0
                    while got < 50:
                        line = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
                        n = int(next((l.split(b":")[1] for l in line.split(b"\r\n") if l.lower().startswith(b"content-length")), b"0"))
                        await reader.readexactly(n)
                        got += 1
                        _bump(stats, "answers")
            except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
                _bump(stats, f"io {type(e).__name__}")
            writer.close()

    async def main() -> None:
        await asyncio.gather(*(one(f"127.35.0.{a + 1}") for a in range(60) for _ in range(4)))
    asyncio.run(main())


NEW = {"rotate_pages": rotate_pages, "rotate_404": rotate_404, "rotate_pages_8": rotate_pages_8,
       "fixed_pages_24": fixed_pages_24, "over_limit": over_limit, "idle_plus_rotate": idle_plus_rotate,
       "unread_pages": unread_pages, "slower_than_honest": slower_than_honest, "idle_plus_pages": idle_plus_pages, "burst_close": burst_close, "pipeline_flood": pipeline_flood}
r44.CASES.update({k: with_ss(v) for k, v in NEW.items()})
r44.CASES["baseline_ss"] = with_ss(lambda server, stop, stats: stop.wait(1e9))

if __name__ == "__main__":
    r44.main()
