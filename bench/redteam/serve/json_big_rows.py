# ruff: noqa: E501, E701, E702, E741, B023  (red-team scripts written in a 35-minute time box; not product code)
import subprocess
import sys
import threading
import time

sys.path.insert(0, "bench/redteam/serve")
from redteam_serve import Server, rss_mb

s = Server(sys.argv[1] if len(sys.argv) > 1 else "/tmp/s5c44.duckdb", [])
peak=[0]; stop=threading.Event()
def samp():
    while not stop.is_set():
        m=rss_mb(s.process.pid); peak[0]=max(peak[0], m if m==m else 0)
        if m>6000: s.process.kill(); print("guard kill at", m)
        stop.wait(0.05)
threading.Thread(target=samp).start()
t0=time.time()
r=subprocess.run(["curl","-s","-o","/dev/null","-w","%{http_code} %{size_download} %{time_total}","--max-time","40",
  s.url+"sql.json?q=SELECT+repeat('x',+20000000)+AS+s+FROM+range(100)"],capture_output=True,text=True)
print("curl:", r.stdout, "rc", r.returncode, "peak RSS MB", round(peak[0]), "alive", s.process.poll() is None)
h=subprocess.run(["curl","-s","-o","/dev/null","-w","%{http_code} %{time_total}","--max-time","20",s.url],capture_output=True,text=True)
print("front page right after:", h.stdout)
stop.set(); err=s.stderr(); s.stop()
print([l for l in err.splitlines() if "hubtrace" in l or "Trace" in l or "Error" in l][:6])
