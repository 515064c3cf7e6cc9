# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 40-minute time box; not product code)
"""Red-team cases for `hubtrace serve` that neither bench/bench_serve_load.py nor bench/redteam/serve/redteam_serve.py
run. Reuses redteam_serve's harness (fresh niced server per case, honest.py in its own process at 127.0.9.1, RSS
sampled every 0.2 s, 4 GB guard) and adds p99 and the honest visitor's per-page figures.

    PYTHONPATH=. nice -n 10 python bench/redteam/serve44/redteam44.py --db DB --case onebyte --seconds 40
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
import redteam_serve as rt  # noqa: E402

HONEST = Path(os.environ.get("HT_HONEST") or Path(__file__).resolve().parents[1] / "serve" / "honest.py")


def _bump(stats: dict, key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n


def conn_loop(server, stop, stats, addresses: int, per: int, prefix: str, payload: bytes, read_answer: bool,
              pause: float = 0.0, hold: float = 0.0) -> None:
    """addresses x per asyncio connections; each sends ``payload`` then waits (reading) until the server closes it
    (or, with ``hold``, until it has been open that long: then it closes it), and reopens after ``pause``."""
    payload = payload.replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())

    async def one(address: str) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(server.host, server.port, local_addr=(address, 0)), 10)
            except (OSError, TimeoutError) as e:
                _bump(stats, f"connect {type(e).__name__}")
                await asyncio.sleep(0.2)
                continue
            _bump(stats, "opened")
            try:
                writer.write(payload)
                await writer.drain()
                got = b""
                while not stop.is_set():
                    if hold and time.monotonic() - t0 >= hold:
                        _bump(stats, "closed by client")
                        got = None
                        break
                    try:
                        chunk = await asyncio.wait_for(reader.read(65536), min(1.0, hold or 1.0))
                    except TimeoutError:
                        continue
                    if not chunk:
                        break
                    if not got:
                        _bump(stats, f"answer {rt.status_of(chunk)}")
                    got += chunk[:100]
                if got is not None:
                    _bump(stats, "closed by server")
                stats.setdefault("held s", []).append(time.monotonic() - t0)
            except OSError as e:
                _bump(stats, f"io {type(e).__name__}")
            writer.close()
            if pause:
                await asyncio.sleep(pause)

    async def main() -> None:
        await asyncio.gather(*(one(f"{prefix}.{a // 250}.{a % 250 + 1}") for a in range(addresses) for _ in range(per)))
    asyncio.run(main())
    held = stats.pop("held s", [])
    if held:
        stats["held s median"] = round(statistics.median(held), 2)


def onebyte(server, stop, stats) -> None:
    """240 addresses x 16 connections (3,840) each send one byte ('G') so TCP_DEFER_ACCEPT hands them over at once,
    then nothing; reopened as soon as the server closes them."""
    conn_loop(server, stop, stats, 240, 16, "127.20", b"G", read_answer=True)


def partial_max(server, stop, stats) -> None:
    """256 addresses x 16 (the per-address maximum) = 4,096 connections, each sending a whole request line and Host
    header but never the blank line that ends the header; reopened at once when closed."""
    conn_loop(server, stop, stats, 256, 16, "127.21", b"GET /discrepancies HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"p" * 900,
              read_answer=True)


def keepalive_idle(server, stop, stats) -> None:
    """200 addresses x 16 connections (3,200) each send one complete cheap request (GET of a 404 path), read the
    answer, then keep the connection alive idle until the server closes it; reopened at once."""
    conn_loop(server, stop, stats, 200, 16, "127.22", b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", read_answer=True)


def keepalive_paced(server, stop, stats) -> None:
    """keepalive_idle, but each connection is reopened 3 s after the server closes it (fewer requests a second)."""
    conn_loop(server, stop, stats, 200, 16, "127.25", b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", read_answer=True,
              pause=3.0)


def keepalive_recycled(server, stop, stats) -> None:
    """keepalive_idle whose connections close themselves 5 s after they opened and reopen at once: 3,200 connections,
    each asking for a page, opened together every 5 s (the server no longer closes idle ones; the bots do)."""
    conn_loop(server, stop, stats, 200, 16, "127.27", b"GET /no-such-page HTTP/1.1\r\nHost: x\r\n\r\n", read_answer=True,
              hold=5.0)


def notfound_flood(server, stop, stats) -> None:
    """24 threads of own addresses: GET of a 404 path with Connection: close, answer read, again at once (the request
    rate of keepalive_idle without its idle connections)."""
    _flood(server, stop, stats, [b"GET /no-such-page HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"], 24,
           "127.26", read=True)


def _flood(server, stop, stats, requests: list[bytes], threads: int, prefix: str, read: bool) -> None:
    def worker(k: int) -> None:
        i = k
        address = f"{prefix}.{k // 250}.{k % 250 + 1}"
        while not stop.is_set():
            data = requests[i % len(requests)].replace(b"Host: x", f"Host: {server.host}:{server.port}".encode())
            i += 1
            try:
                with socket.create_connection((server.host, server.port), timeout=20, source_address=(address, 0)) as s:
                    s.sendall(data)
                    if read:
                        first = s.recv(200)
                        _bump(stats, f"answer {rt.status_of(first)}")
                        while s.recv(65536):
                            pass
                    else:  # gone at once, with a reset: nothing for the server to answer
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                _bump(stats, "sent")
            except OSError as e:
                _bump(stats, f"io {type(e).__name__}")
                stop.wait(0.05)
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


CHEAP = [b"GET /discrepancies HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
         b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
         b"GET /search?q=ft-0 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
         b"GET /family?id=bigco/base HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"]


def hit_and_run(server, stop, stats) -> None:
    """24 threads, each of its own address: a complete request for a real page, then a reset at once (never reads)."""
    _flood(server, stop, stats, CHEAP, 24, "127.23", read=False)


def head_flood(server, stop, stats) -> None:
    """12 threads of own addresses: HEAD and OPTIONS of real pages, each with a 60 KB junk query parameter, read."""
    pad = b"&zz=" + b"a" * 60000
    reqs = [b"HEAD /discrepancies?x=1" + pad + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"OPTIONS /family?id=bigco/base" + pad + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"HEAD /search?q=ft" + pad + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            b"HEAD /?page=2" + pad + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"]
    _flood(server, stop, stats, reqs, 12, "127.24", read=True)


CASES = {"baseline": None, "onebyte": onebyte, "partial_max": partial_max, "keepalive_idle": keepalive_idle,
         "hit_and_run": hit_and_run, "keepalive_paced": keepalive_paced,
         "keepalive_recycled": keepalive_recycled,
         "notfound_flood": notfound_flood, "head_flood": head_flood}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--case", required=True, choices=list(CASES))
    p.add_argument("--seconds", type=float, default=40)
    p.add_argument("--serve", nargs=argparse.REMAINDER, default=[], help="options for hubtrace serve")
    args = p.parse_args()
    server = rt.Server(args.db, args.serve)
    # rt.Server starts the server under a further `nice -n 10` (19 when this script runs at 10), which would give the
    # attack threads of this process priority over it: the server and the honest visitor run at this script's level
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    for tid in os.listdir(f"/proc/{server.process.pid}/task"):
        os.setpriority(os.PRIO_PROCESS, int(tid), mine)
    cpu0 = os.times()
    stop, stats, memory = threading.Event(), {}, []
    try:
        for path in ["/", "/model?id=bigco/base", "/family?id=bigco/base", "/tables"]:
            rt.raw(server, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        before = rt.rss_mb(server.process.pid)

        sampling = threading.Thread(target=rt.sample_memory, args=(server, stop, memory))
        sampling.start()
        attack = threading.Thread(target=CASES[args.case], args=(server, stop, stats)) if CASES[args.case] else None
        if attack:
            attack.start()
            time.sleep(4)
        honest = subprocess.run([sys.executable, str(HONEST), server.url, str(args.seconds),
                                 "127.0.9.1"], capture_output=True, text=True)
        load1 = os.getloadavg()[0]
        cpu1 = os.times()
        stop.set()
        if attack:
            attack.join(60)
        sampling.join()
        alive = server.process.poll() is None
        after_probe = rt.status_of(rt.raw(server, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                          "127.0.9.2", timeout=30))
        time.sleep(1)
        after = rt.rss_mb(server.process.pid)
    finally:
        stop.set()
        err = server.stderr()
        server.stop()
    h = json.loads(honest.stdout) if honest.stdout.strip() else {"lat": [], "fails": {"no output": honest.stderr[-500:]}}
    lat = h["lat"]
    pages = ["/", "/model?id=fam0100/ft-2", "/family?id=bigco/base", "/search?q=ft-05", "/discrepancies",
             "/model?id=bigco/base", "/tables"]
    per_page = {pg: round(max(lat[i::len(pages)]) * 1000) for i, pg in enumerate(pages) if lat[i::len(pages)]}
    row = {"case": args.case, "n": len(lat),
           "median ms": round(statistics.median(lat) * 1000) if lat else None,
           "p95 ms": round(rt.pct(lat, 0.95) * 1000) if lat else None,
           "p99 ms": round(rt.pct(lat, 0.99) * 1000) if lat else None,
           "worst ms": round(max(lat) * 1000) if lat else None,
           "over 1 s": sum(t > 1 for t in lat), "worst per page ms": per_page,
           "honest failures": h["fails"], "honest statuses": h.get("statuses"),
           "rss before MB": round(before), "rss peak MB": round(max(memory, default=float("nan"))),
           "rss after MB": round(after) if after == after else None, "killed by guard": server.killed_by_guard,
           "alive at end": alive, "front page after": after_probe, "load1": round(load1, 2),
           "tracebacks": err.count("Traceback"), "attacker cpu s": round(cpu1.user + cpu1.system - cpu0.user - cpu0.system, 1),
           "server nice": mine, "attack": stats}
    row.update({k: h[k] for k in ("conn", "first") if k in h})
    print(json.dumps(row, default=str))
    rt.print_server_log(err)


if __name__ == "__main__":
    main()
