# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 35-minute time box; not product code)
import sys
import time
import urllib.parse

sys.path.insert(0, "bench/redteam/serve")
from redteam_serve import Server, raw, rss_mb, status_of

s = Server("/tmp/s5c44.duckdb", [])
try:
    SLOW = "SELECT sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"
    for method in ["HEAD", "GET"]:
        t0 = time.perf_counter()
        a = raw(s, f"{method} /sql?q={urllib.parse.quote(SLOW)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=60)
        print(method, "slow sql", status_of(a), round(time.perf_counter()-t0, 1), "s", a[:0])
    for method in ["HEAD"]:
        t0 = time.perf_counter()
        a = raw(s, f"{method} /sql.csv?q={urllib.parse.quote('SELECT * FROM pair_tests t JOIN models m ON m.model_id = t.model_a')} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), timeout=60)
        print(method, "big sql.csv", status_of(a), round(time.perf_counter()-t0, 1), "s", len(a), "bytes; rss", rss_mb(s.process.pid))
    # HEAD that hangs up: does the statement keep running?
    t0 = time.perf_counter()
    raw(s, f"HEAD /sql?q={urllib.parse.quote(SLOW)} HTTP/1.1\r\nHost: x\r\n\r\n".encode(), read=False)
    time.sleep(3)
    a = raw(s, b"GET /sql?q=SELECT+1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    print("after HEAD-and-leave: SELECT 1", status_of(a))
finally:
    time.sleep(1)
    err = s.stderr(); s.stop()
    print("stderr:", [l for l in err.splitlines() if "hubtrace" in l or "Trace" in l][:10])
