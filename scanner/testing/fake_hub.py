"""A loopback Hugging Face Hub: a real HTTP server that speaks the endpoints huggingface_hub uses, so tests
drive the real client (``HfApi(endpoint=hub.endpoint)``, ``hf_hub_download(endpoint=...)``) over real sockets.

Served from memory, repos added from bytes or folders (zoo models):
- ``GET /api/models`` — author / search / filter / limit / ``expand``, paged with ``Link: <…>; rel="next"``
  and an opaque cursor; ``baseModels``, ``childrenModelCount`` and ``usedStorage`` are refused when listing,
  as the Hub does;
- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` — model info at a branch or commit;
- ``HEAD|GET /{repo}/resolve/{rev}/{file}`` — ``X-Repo-Commit``, ``ETag``, ``Content-Length``,
  ``Accept-Ranges`` and single-range reads (206, 416);
- injectable faults (the first N requests to matching paths answer e.g. 429 with ``Retry-After``, or 503, or
  hang up part-way through a download), and a log of every request, to assert what a client fetched.

Adding a folder again with changed content makes a new revision; old commits stay resolvable, like the Hub.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

import yaml

LISTING_REFUSES = frozenset({"baseModels", "childrenModelCount", "usedStorage"})
RELATIONS = frozenset({"adapter", "finetune", "merge", "quantized"})
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")
_FRONT_MATTER = re.compile(r"\A---\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|$)", re.DOTALL)


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the server saw it, and what it answered."""

    method: str
    path: str                        # unquoted, without the query
    query: dict[str, list[str]]
    status: int
    range: str | None                # the Range header, if sent
    body_bytes: int                  # bytes of body sent back
    authorized: bool                 # an Authorization header was sent


@dataclass
class _Fault:
    pattern: re.Pattern[str]
    status: int                      # 0: answer normally but drop the connection after ``cut_after`` body bytes
    remaining: int | None            # None: every matching request fails
    retry_after: int | None
    method: str | None
    cut_after: int = 0


@dataclass(frozen=True)
class _Revision:
    sha: str
    files: dict[str, bytes]
    modified: datetime


@dataclass
class _Repo:
    repo_id: str
    created: datetime
    extra_tags: tuple[str, ...]
    revisions: list[_Revision] = field(default_factory=list)   # oldest first; the last one is main

    def at(self, revision: str) -> _Revision | None:
        if revision == "main":
            return self.revisions[-1]
        return next((r for r in self.revisions if r.sha == revision), None)


class FakeHub:
    """The server and the repos it serves; use as a context manager (``with FakeHub() as hub:``)."""

    def __init__(self, *, page_size: int = 2) -> None:
        self.page_size = page_size
        self._repos: dict[str, _Repo] = {}
        self._faults: list[_Fault] = []
        self._log: list[LoggedRequest] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- repos -----------------------------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: Mapping[str, bytes], *, tags: tuple[str, ...] = (),
                 when: datetime | None = None) -> str:
        """Publish ``files`` as the new head of ``repo_id`` (created if new); returns the commit sha."""
        when = when or datetime.now(UTC)
        content = {name: bytes(data) for name, data in sorted(files.items())}
        digest = hashlib.sha1()
        for name, data in content.items():
            digest.update(f"{name}\0{hashlib.sha256(data).hexdigest()}\n".encode())
        digest.update(repo_id.encode())
        with self._lock:
            repo = self._repos.setdefault(repo_id, _Repo(repo_id, when, tuple(tags)))
            repo.extra_tags = tuple(tags) or repo.extra_tags
            if not repo.revisions or repo.revisions[-1].sha != digest.hexdigest():
                repo.revisions.append(_Revision(digest.hexdigest(), content, when))
            return repo.revisions[-1].sha

    def add_folder(self, repo_id: str, folder: Path, **kwargs: Any) -> str:
        """Publish every file under ``folder`` (relative paths as repo paths)."""
        files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*"))
                 if p.is_file()}
        return self.add_repo(repo_id, files, **kwargs)

    # -- faults and log --------------------------------------------------------------------------------------
    def fail(self, path_regex: str, status: int, *, times: int | None = 1, retry_after: int | None = None,
             method: str | None = None) -> None:
        """The next ``times`` requests (``None``: all) whose unquoted target (path and query) matches ``path_regex``
        answer ``status``, with ``Retry-After`` if given; ``method`` narrows it to e.g. ``"GET"``."""
        with self._lock:
            self._faults.append(_Fault(re.compile(path_regex), status, times, retry_after, method))

    def drop(self, path_regex: str, after_bytes: int, *, times: int | None = 1) -> None:
        """The next ``times`` GETs whose target matches send ``after_bytes`` of the body, then hang up."""
        with self._lock:
            self._faults.append(_Fault(re.compile(path_regex), 0, times, None, "GET", after_bytes))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def requests(self) -> list[LoggedRequest]:
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- server ----------------------------------------------------------------------------------------------
    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeHub is not running; use it as a context manager")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = None

    # -- used by the handler ---------------------------------------------------------------------------------
    def _take_fault(self, method: str, path: str, *, drops: bool) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.remaining == 0 or (fault.method and fault.method != method) or not fault.pattern.search(path):
                    continue
                if (fault.status == 0) != drops:
                    continue
                if fault.remaining is not None:
                    fault.remaining -= 1
                return fault
        return None

    def _record(self, entry: LoggedRequest) -> None:
        with self._lock:
            self._log.append(entry)

    def _lookup(self, repo_id: str, revision: str) -> tuple[_Repo | None, _Revision | None]:
        with self._lock:
            repo = self._repos.get(repo_id)
            return repo, (repo.at(revision) if repo else None)

    def _listing(self) -> list[tuple[_Repo, _Revision]]:
        with self._lock:
            return [(r, r.revisions[-1]) for _, r in sorted(self._repos.items())]


def _model_fields(repo: _Repo, rev: _Revision) -> dict[str, Any]:
    """Everything the Hub could say about one repo revision, under the Hub's JSON names."""
    card = _card_data(rev.files.get("README.md", b""))
    declared = card.get("base_model") if card else None
    declared = [declared] if isinstance(declared, str) else declared if isinstance(declared, list) else []
    bases = [b for b in declared if isinstance(b, str)]
    relation = card.get("base_model_relation") if card else None
    if relation not in RELATIONS:
        relation = "merge" if len(bases) > 1 else "finetune"
    tags = list(repo.extra_tags)
    card_tags = card.get("tags") if card else None
    tags += [t for t in (card_tags if isinstance(card_tags, list) else []) if isinstance(t, str)]
    if any(n.endswith(".safetensors") for n in rev.files):
        tags.append("safetensors")
    if card and isinstance(card.get("license"), str):
        tags.append(f"license:{card['license']}")
    for base in bases:
        tags += [f"base_model:{base}", f"base_model:{relation}:{base}"]
    fields: dict[str, Any] = {
        "id": repo.repo_id,
        "author": repo.repo_id.split("/")[0],
        "sha": rev.sha,
        "createdAt": _iso(repo.created),
        "lastModified": _iso(rev.modified),
        "private": False,
        "tags": list(dict.fromkeys(tags)),
        "cardData": card,
        "siblings": [{"rfilename": name} for name in rev.files],
        "safetensors": _safetensors_summary(rev.files),
        "baseModels": {"relation": relation, "models": [{"id": b} for b in bases]} if bases else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def _dispatch(self, *, head: bool) -> None:
        url = urlsplit(self.path)
        self._path = unquote(url.path)
        self._query = parse_qs(url.query, keep_blank_values=True)
        fault = self.fake._take_fault(self.command, unquote(self.path), drops=False)
        if fault is not None:
            headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
            return self._json(fault.status, {"error": f"injected HTTP {fault.status}"}, headers)
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and not head:
            return self._api(parts[2:])
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{unquote(parts[0])}/{unquote(parts[1])}", unquote(parts[3]),
                                 "/".join(unquote(p) for p in parts[4:]), head=head)
        return self._json(404, {"error": "not found"})

    # -- API -------------------------------------------------------------------------------------------------
    def _api(self, rest: list[str]) -> None:
        expand = self._query.get("expand", []) + self._query.get("expand[]", [])
        if not rest:
            return self._list_models(expand)
        repo_id = "/".join(unquote(p) for p in rest[:2])
        revision = unquote(rest[3]) if len(rest) == 4 and rest[2] == "revision" else "main"
        if len(rest) not in (2, 4) or (len(rest) == 4 and rest[2] != "revision"):
            return self._json(404, {"error": "not found"})
        repo, rev = self.fake._lookup(repo_id, revision)
        if repo is None:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
        if rev is None:
            return self._json(404, {"error": f"Invalid rev id: {revision}"}, {"X-Error-Code": "RevisionNotFound"})
        fields = _model_fields(repo, rev)
        if "baseModels" not in expand:  # the Hub sends it only when asked for
            fields.pop("baseModels", None)
        self._json(200, _select(fields, expand))

    def _list_models(self, expand: list[str]) -> None:
        refused = sorted(set(expand) & LISTING_REFUSES)
        if refused:
            return self._json(400, {"error": f"expand values not allowed when listing: {', '.join(refused)}"})
        q = self._query
        author, search = _first(q, "author"), (_first(q, "search") or "").lower()
        wanted_tags = q.get("filter", [])
        rows = []
        for repo, rev in self.fake._listing():
            fields = _model_fields(repo, rev)
            if author and fields["author"] != author:
                continue
            if search and search not in repo.repo_id.lower():
                continue
            if any(t not in fields["tags"] for t in wanted_tags):
                continue
            fields.pop("baseModels", None)
            rows.append(_select(fields, expand) if expand else
                        {k: fields[k] for k in ("id", "tags", "createdAt", "private")})
        limit = int(_first(q, "limit") or 0) or None
        size = min(self.fake.page_size, limit) if limit else self.fake.page_size
        cursor = _first(q, "cursor")
        start = int(base64.urlsafe_b64decode(cursor.encode()).decode()) if cursor else 0
        page = rows[start:start + size]
        headers = {}
        if start + size < len(rows):
            params = [(k, v) for k, vs in q.items() if k != "cursor" for v in vs]
            params.append(("cursor", base64.urlsafe_b64encode(str(start + size).encode()).decode()))
            host, port = self.server.server_address[:2]
            headers["Link"] = f'<http://{host}:{port}/api/models?{urlencode(params)}>; rel="next"'
        self._json(200, page, headers)

    # -- files -----------------------------------------------------------------------------------------------
    def _resolve(self, repo_id: str, revision: str, name: str, *, head: bool) -> None:
        repo, rev = self.fake._lookup(repo_id, revision)
        if repo is None:
            return self._json(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"}, head)
        if rev is None:
            return self._json(404, {"error": "Revision not found"}, {"X-Error-Code": "RevisionNotFound"}, head)
        data = rev.files.get(name)
        if data is None:
            return self._json(404, {"error": "Entry not found"},
                              {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": rev.sha}, head)
        headers = {
            "X-Repo-Commit": rev.sha,
            "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        status, body = 200, data
        wanted = self.headers.get("Range")
        match = _RANGE.match(wanted.strip()) if wanted else None
        if match and (match.group(1) or match.group(2)):
            first, last = match.group(1), match.group(2)
            if first:
                start, end = int(first), min(int(last) if last else len(data) - 1, len(data) - 1)
            else:
                start, end = max(len(data) - int(last), 0), len(data) - 1
            if start >= len(data) or start > end:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{len(data)}"}, head)
            status, body = 206, data[start:end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        self._send(status, body, headers, head)

    # -- responses -------------------------------------------------------------------------------------------
    def _json(self, status: int, payload: Any, headers: Mapping[str, str] | None = None, head: bool = False) -> None:
        self._send(status, json.dumps(payload).encode(), {"Content-Type": "application/json", **(headers or {})},
                   head)

    def _send(self, status: int, body: bytes, headers: Mapping[str, str], head: bool = False) -> None:
        drop = None if head or status >= 300 else self.fake._take_fault(self.command, unquote(self.path), drops=True)
        sent = body[: drop.cut_after] if drop else b"" if head else body
        # Logged before answering: a client that has its answer must find the request in the log.
        self.fake._record(LoggedRequest(
            method=self.command, path=self._path, query=self._query, status=status, range=self.headers.get("Range"),
            body_bytes=len(sent), authorized="Authorization" in self.headers,
        ))
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(sent)
        if drop:
            self.wfile.flush()
            self.close_connection = True

def _select(fields: dict[str, Any], expand: list[str]) -> dict[str, Any]:
    if not expand:
        return fields
    return {"id": fields["id"], **{k: fields[k] for k in expand if k in fields}}


def _first(query: dict[str, list[str]], key: str) -> str | None:
    values = query.get(key)
    return values[0] if values else None


def _card_data(readme: bytes) -> dict[str, Any] | None:
    match = _FRONT_MATTER.match(readme.decode("utf-8", errors="replace"))
    if match is None:
        return None
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def _safetensors_summary(files: Mapping[str, bytes]) -> dict[str, Any] | None:
    """Parameter counts per dtype over the repo's safetensors headers (the Hub's ``safetensors`` field)."""
    counts: dict[str, int] = {}
    for name, data in files.items():
        if not name.endswith(".safetensors") or len(data) < 8:
            continue
        (size,) = struct.unpack("<Q", data[:8])
        try:
            header = json.loads(data[8:8 + size])
        except ValueError:
            continue
        for key, info in header.items():
            if key != "__metadata__" and isinstance(info, dict):
                n = 1
                for dim in info.get("shape", []):
                    n *= int(dim)
                counts[info.get("dtype", "?")] = counts.get(info.get("dtype", "?"), 0) + n
    return {"parameters": counts, "total": sum(counts.values())} if counts else None


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")

