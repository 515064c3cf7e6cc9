"""An honest visitor, in a process of its own (so attack threads' GIL does not inflate its timings): fetches a few
different pages once a second from its own address for --seconds, each on a fresh connection, and prints one JSON
line of latencies (seconds) and failures."""

import functools
import http.client
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

base, seconds, address = sys.argv[1], float(sys.argv[2]), sys.argv[3]
PAGES = ["/", "/model?id=fam0100/ft-2", "/family?id=bigco/base", "/search?q=ft-05", "/discrepancies",
         "/model?id=bigco/base", "/tables"]


class FromAddress(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(functools.partial(http.client.HTTPConnection, source_address=(address, 0)), req)


opener = urllib.request.build_opener(FromAddress())
lat, fails, statuses = [], {}, {}
end = time.monotonic() + seconds
i = 0
while time.monotonic() < end:
    tick = time.monotonic()
    url = base.rstrip("/") + PAGES[i % len(PAGES)]
    i += 1
    t0 = time.perf_counter()
    try:
        with opener.open(url, timeout=60) as r:
            r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1
        lat.append(time.perf_counter() - t0)
    except urllib.error.HTTPError as e:
        statuses[e.code] = statuses.get(e.code, 0) + 1
        fails[f"HTTP {e.code}"] = fails.get(f"HTTP {e.code}", 0) + 1
        lat.append(time.perf_counter() - t0)
    except (urllib.error.URLError, OSError) as e:
        key = type(getattr(e, "reason", e)).__name__
        fails[key] = fails.get(key, 0) + 1
        lat.append(time.perf_counter() - t0)  # a failure counts at the time it took
    time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
print(json.dumps({"lat": lat, "fails": fails, "statuses": statuses}))
