# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 35-minute time box; not product code)
"""One request at a time on a fresh server: the server's peak RSS while it answers (sampled every 0.05 s from
/proc), the status, bytes received and seconds. The server is killed past --guard-mb (the machine is shared).

    nice -n 10 python bench/redteam/serve/one_request_memory.py --db X.duckdb "/sql?q=SELECT ..." ...
"""

import argparse
import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from redteam_serve import Server, raw, rss_mb, status_of  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--db", required=True)
p.add_argument("--guard-mb", type=float, default=6000)
p.add_argument("paths", nargs="+")
args = p.parse_args()
for path in args.paths:
    s = Server(args.db, [])
    try:
        raw(s, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        before = rss_mb(s.process.pid)
        peak, stop, killed = [before], threading.Event(), [False]

        def sample() -> None:
            while not stop.is_set():
                m = rss_mb(s.process.pid)
                peak.append(m)
                if m > args.guard_mb and not killed[0]:
                    killed[0] = True
                    os.kill(s.process.pid, signal.SIGKILL)
                stop.wait(0.05)
        t = threading.Thread(target=sample)
        t.start()
        t0 = time.perf_counter()
        a = raw(s, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=120, limit=1 << 40)
        dt = time.perf_counter() - t0
        stop.set()
        t.join()
        tail = a[-300:].decode(errors="replace").replace("\n", " ")[-160:]
        print(f"{path[:90]} | status {status_of(a)} | {len(a) / 1e6:.1f} MB received | {dt:.1f} s | RSS before "
              f"{before:.0f} MB, peak {max(x for x in peak if x == x):.0f} MB | killed by guard: {killed[0]} | "
              f"tail: {tail!r}", flush=True)
        err = s.stderr()
        if "Traceback" in err:
            print("  TRACEBACK:", err[err.find("Traceback"):][:800])
    finally:
        s.stop()
