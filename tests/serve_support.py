"""Helpers for the `hubtrace serve` tests (and bench/bench_serve.py): a real server process on a database, a small
scanned hub with hostile models written through the Store's API, a real scan of zoo models, and what headless
chromium measures of a served page."""

from __future__ import annotations

import html
import json
import re
import resource
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from scanner.sources import ModelRecord
from scanner.store import PairTestRow, Store
from tests.fixtures.hostile import HOSTILE_NAMES, HOSTILE_TEXTS
from tests.lineage_support import _chromium
from tests.store_support import T0, Meta, scanned_hub

HUBTRACE = Path(sys.executable).with_name("hubtrace")
"""The installed entry point (``pip install -e .``); ``python -m jobs.cli.app`` where there is none."""


@dataclass(frozen=True)
class Server:
    url: str
    """The base URL it printed, ending in ``/``."""
    process: subprocess.Popen


@contextmanager
def serving(db: Path, log: Path, *options: str, open_files: int | None = None) -> Iterator[Server]:
    """`hubtrace serve --db db --port 0` in a process of its own until the block ends: its base URL is read from the
    line it prints once it listens (stderr goes to ``log``). ``open_files``: the process's limit of open files, soft
    and hard (the system's otherwise)."""
    command = [str(HUBTRACE)] if HUBTRACE.exists() else [sys.executable, "-m", "jobs.cli.app"]

    def limit_open_files() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    with log.open("w") as errors:
        process = subprocess.Popen([*command, "serve", "--db", str(db), "--port", "0", *options],
                                   stdout=subprocess.PIPE, stderr=errors, text=True,
                                   preexec_fn=limit_open_files if open_files else None)
        try:
            line = process.stdout.readline()
            found = re.search(r"http://\S+/", line)
            assert found, f"no URL in {line!r}; stderr: {log.read_text()}"
            yield Server(found.group(0), process)
        finally:
            process.terminate()
            process.wait()


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    text: str


def get(url: str, *, headers: dict[str, str] | None = None, method: str = "GET",
        timeout: float | None = None) -> Answer:
    """One request, any status (urllib raises on 4xx and 5xx; this returns them). ``timeout``: seconds a socket
    operation may wait (a guard against a server that never answers, not a speed limit)."""
    request = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, dict(response.headers), response.read().decode("utf-8"))
    except urllib.error.HTTPError as error:
        return Answer(error.code, dict(error.headers), error.read().decode("utf-8"))


@contextmanager
def unread(url: str, *, source: str | None = None) -> Iterator[socket.socket]:
    """A client that asks for ``url`` and then reads nothing (its receive buffer fills, then the server's send
    buffer), until the block ends; from the address ``source`` if given (a visitor of its own)."""
    parts = urllib.parse.urlsplit(url)
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting, so the window stays small
        if source is not None:
            client.bind((source, 0))
        client.connect((parts.hostname, parts.port))
        client.sendall(f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        yield client


class SlowReader:
    """A client that asks for ``url`` from ``source`` and then takes ``per_second`` bytes a second (a 4 KB receive
    window), on a thread of its own while the block runs. ``status``: its answer's status line; ``received``: the
    bytes taken; ``closed_by_server``: whether the server ended the connection before the answer was whole."""

    def __init__(self, url: str, source: str = "127.0.0.1", per_second: int = 1024) -> None:
        self.url, self.source, self.per_second = urllib.parse.urlsplit(url), source, per_second
        self.status = ""
        self.received = 0
        self.closed_by_server = False
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read)

    def __enter__(self) -> SlowReader:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()

    def _read(self) -> None:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window stays small
            client.settimeout(120)
            client.bind((self.source, 0))
            client.connect((self.url.hostname, self.url.port))
            client.sendall(f"GET {self.url.path}?{self.url.query} HTTP/1.1\r\nHost: {self.url.netloc}\r\n\r\n"
                           .encode())
            while not self.stop.is_set():
                try:
                    chunk = client.recv(self.per_second)
                except OSError:
                    chunk = b""
                if not chunk:
                    self.closed_by_server = True
                    return
                if not self.status:
                    self.status = chunk.split(b"\r\n", 1)[0].decode(errors="replace")
                self.received += len(chunk)
                self.stop.wait(1.0)


class Hog:
    """One visitor (one source address, ``source``) holding ``idle`` connections that send nothing and ``trickling``
    ones that send a request's header a byte every ``every`` seconds without ever finishing it (slowloris), kept by a
    thread of its own while the block runs. The trickling ones connect first. With ``reconnect``, each connection the
    server closes is opened again ``every`` seconds later, as a determined visitor would."""

    PREFIX = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "

    def __init__(self, url: str, source: str, *, idle: int, trickling: int, every: float = 0.5,
                 reconnect: bool = False) -> None:
        self.address = urllib.parse.urlsplit(url)
        self.source, self.every, self.reconnect = source, every, reconnect
        self.kinds = ["trickling"] * trickling + ["idle"] * idle
        self.selector = selectors.DefaultSelector()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._hold)
        self.reopen: list[tuple[float, str]] = []
        """Connections to open again (with ``reconnect``): when, and of which kind."""
        self.opened = 0
        self.closed_by_server = 0
        """Connections the server closed (a reset or an end of stream) while the hog held them."""
        self.sent_after_open = 0
        """Bytes the trickling connections sent after their first line, all together."""

    def __enter__(self) -> Hog:
        for kind in self.kinds:
            if not self._open(kind) and self.reconnect:
                self.reopen.append((time.monotonic() + self.every, kind))
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()
        for key in list(self.selector.get_map().values()):
            key.fileobj.close()
        self.selector.close()

    @property
    def held(self) -> int:
        """Connections open now, as far as the hog has seen."""
        return len(self.selector.get_map())

    @property
    def trickling(self) -> int:
        """Trickling connections open now, as far as the hog has seen."""
        return sum(key.data == "trickling" for key in list(self.selector.get_map().values()))

    def _open(self, kind: str) -> bool:
        """Open one connection of ``kind``; False if the server reset it at once (a loopback connection can be
        accepted and reset before connect() returns)."""
        self.opened += 1
        client = socket.socket()
        try:
            client.settimeout(30)
            client.bind((self.source, 0))
            client.connect((self.address.hostname, self.address.port))
            if kind == "trickling":
                client.sendall(self.PREFIX)
        except (ConnectionResetError, BrokenPipeError):
            client.close()
            self.closed_by_server += 1
            return False
        client.setblocking(False)
        self.selector.register(client, selectors.EVENT_READ, kind)
        return True

    def _hold(self) -> None:
        next_byte = time.monotonic() + self.every
        while not self.stop.is_set():
            for key, _ in self.selector.select(timeout=min(self.every, 0.1)):
                try:
                    ended = key.fileobj.recv(4096) == b""
                except OSError:  # reset (refused) or gone
                    ended = True
                if ended:
                    self._lost(key)
            now = time.monotonic()
            if now >= next_byte:
                next_byte = now + self.every
                for key in [k for k in self.selector.get_map().values() if k.data == "trickling"]:
                    try:
                        key.fileobj.send(b"a")
                        self.sent_after_open += 1
                    except OSError:
                        self._lost(key)
            while self.reopen and self.reopen[0][0] <= now and not self.stop.is_set():
                kind = self.reopen.pop(0)[1]
                try:
                    opened = self._open(kind)
                except OSError:  # not even taken by the kernel now
                    opened = False
                if not opened:
                    self.reopen.append((now + self.every, kind))

    def _lost(self, key: selectors.SelectorKey) -> None:
        self.selector.unregister(key.fileobj)
        key.fileobj.close()
        self.closed_by_server += 1
        if self.reconnect:
            self.reopen.append((time.monotonic() + self.every, key.data))


def page_url(base: str, path: str, **params: str) -> str:
    """``base`` + ``path`` with the parameters url-encoded (ids hold ``/``, ``&``, newlines, anything)."""
    return base.rstrip("/") + path + ("?" + urllib.parse.urlencode(params) if params else "")


# -- databases ---------------------------------------------------------------------------------------------------


def hostile_hub(store: Store) -> list[str]:
    """`scanned_hub`'s two nights, then a third that finds a model per `HOSTILE_NAMES` (id ``hostile/<name>``) whose
    card carries `HOSTILE_TEXTS` in its licence, tags and declared bases, each tested dependent on the one before it
    (per-block layers and notes included) and the fourth claiming training from scratch, so the lineage has a family,
    directions, discrepancies and pair reports full of hostile text; and an error whose reason is hostile. Returns
    the hostile ids."""
    scanned_hub(store)
    night = store.start_run({"night": 3})
    ids = [f"hostile/{name}" for name in HOSTILE_NAMES]
    for i, model_id in enumerate(ids):
        texts = HOSTILE_TEXTS[i::len(ids)]
        store.upsert_model(ModelRecord(
            model_id=model_id, revision="r1", source="local", location=f"/hub/{model_id}",
            base_models=(ids[i - 1], *texts) if i else texts, base_model_relation="finetune",
            claims_from_scratch=i == 3, license=texts[0], tags=(*texts, "ok"), created_at=T0 + timedelta(days=i),
            last_modified=T0 + timedelta(days=i)), Meta(), night, "ok")
    layers = [{"layer_a": b, "layer_b": b, "log10_p": -25.0, "rho": 0.9, "n_units": 128} for b in range(2)]
    store.put_pair_tests([PairTestRow(a, "r1", b, "r1", "match", "v1", -50.0 if j == i + 1 else -0.4, 2, layers,
                                      [HOSTILE_TEXTS[i % len(HOSTILE_TEXTS)]], "comparable", night, 0.9)
                          for i, a in enumerate(ids) for j, b in enumerate(ids) if j > i])
    store.record_error(night, ids[1], "r1", f"/hub/{ids[1]}", "validate", "CheckpointError", HOSTILE_TEXTS[1])
    store.finish_run(night, "succeeded", {})
    return ids


# -- what a person sees ------------------------------------------------------------------------------------------

#: Measured in a served page after it is laid out: the window, how wide the page is (a phone must not scroll
#: sideways), the header's search box, the smallest font of any element holding visible text, each table's right
#: edge and the right edge of the scrolling box it sits in (none: null), the family drawing's boxes whose label
#: does not fit inside, and whether the stylesheet applied.
SERVE_PROBE = """
<script>
(() => {
  const box = e => { const r = e.getBoundingClientRect(); return [r.left, r.top, r.width, r.height]; };
  const shown = e => e.getClientRects().length && [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  const texts = [...document.body.querySelectorAll('*')].filter(shown);
  const scroller = e => { for (let x = e; x && x !== document.body; x = x.parentElement) {
    if (['auto', 'scroll'].includes(getComputedStyle(x).overflowX)) return x; } return null; };
  const tables = [...document.querySelectorAll('table')].map(t => { const s = scroller(t);
    return {right: t.getBoundingClientRect().right, box: s ? s.getBoundingClientRect().right : null}; });
  const fonts = texts.map(e => [parseFloat(getComputedStyle(e).fontSize), e.tagName,
    e.textContent.trim().slice(0, 30)]);
  const labels = [...document.querySelectorAll('svg.family .box')].filter(g => {  // a label wider than its box
    const r = g.querySelector('rect').getBBox(), t = g.querySelector('text').getBBox();
    return t.x < r.x || t.x + t.width > r.x + r.width; }).map(g => g.querySelector('title').textContent);
  document.title = 'GEOMETRY ' + JSON.stringify({window: [innerWidth, innerHeight], labels_outside: labels,
    page_width: document.documentElement.scrollWidth, search: box(document.querySelector('header input[type=search]')),
    smallest_font: fonts.reduce((a, b) => (b[0] < a[0] ? b : a), [1e9, '', '']), tables: tables,
    styled: getComputedStyle(document.querySelector('main')).maxWidth !== 'none'});
})();
</script>
"""


def served_geometry(url: str, folder: Path, width: int, height: int, screenshot: Path) -> dict:
    """`SERVE_PROBE`'s measures of the page at ``url`` in a ``width`` x ``height`` headless chromium, and a screenshot
    of the page as served. The probe runs in a copy of the page (the app's Content-Security-Policy runs no script)
    whose ``<base>`` points at the server, so it is styled by the app's own stylesheet."""
    with urllib.request.urlopen(url) as response:
        page = response.read().decode("utf-8")
    probed = folder / f"probed-{width}x{height}.html"
    probed.write_text(page.replace("<head>", f'<head><base href="{html.escape(url)}">', 1)
                      .replace("</body>", SERVE_PROBE + "</body>"), encoding="utf-8")
    dom = _chromium(probed, folder / "profile", f"--window-size={width},{height}", "--dump-dom")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    _chromium(url, folder / "profile", f"--window-size={width},{height}", f"--screenshot={screenshot}",
              "--hide-scrollbars")
    return json.loads(html.unescape(dom.split("<title>GEOMETRY ", 1)[1].split("</title>", 1)[0]))
