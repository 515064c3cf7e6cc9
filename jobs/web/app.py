"""The app: Flask with every template autoescaped and every printed string made visible (`text.shown`), GET
only, one read-only store per worker thread, and response headers that let a page load nothing but the app's own
stylesheet (no script, no frame, no other site). Served by waitress (jobs/cli/serve.py)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flask import Flask, Response, abort, render_template, request
from jinja2 import StrictUndefined
from werkzeug.exceptions import HTTPException

from jobs.web import bounds, text
from jobs.web.database import EXTENSION, Database
from jobs.web.limits import ServeLimits
from jobs.web.priority import PAGES, PagesFirst
from jobs.web.views import discrepancies, family, home, model, pair, search, sql, tables
from scanner.store import Store

LOCAL_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})
"""Host names a loopback-bound app answers to (with the address it is bound to): a request with any other Host
header is refused, so a web page the person visits cannot reach the app through a name of its own that it points
at 127.0.0.1 (DNS rebinding)."""

CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'self'; base-uri 'none'; "
       "frame-ancestors 'none'")
"""What a page may load: the app's stylesheet and images inlined by hubtrace (the report's charts); never a script."""


class HubtraceFlask(Flask):
    jinja_options = {"autoescape": True, "finalize": text.shown, "undefined": StrictUndefined}
    """Autoescape every template, whatever its file name; hub text made visible; a misspelt variable an error."""


def create_app(db: Path, *, host_names: Collection[str] | None = LOCAL_NAMES,
               limits: ServeLimits | None = None) -> Flask:
    """The app on one scan database, which must open read-only now (a `StoreError` says why not). ``host_names``:
    the only Host header names it answers (None: any, for an app bound to an address others reach); ``limits``:
    the bounds of each request's work (jobs.web.bounds)."""
    limits = limits or ServeLimits()
    Store(db, read_only=True, limits=limits.engine).close()
    app = HubtraceFlask(__name__)
    if host_names is not None:
        app.before_request(_addressed_to(frozenset(host_names)))
    app.before_request(_not_from_another_site)
    database = app.extensions[EXTENSION] = Database(Path(db), limits.engine)
    pages = app.extensions[PAGES] = PagesFirst()
    app.extensions.update(bounds.sql_and_download_gates(limits, database, pages, _private_folder()))
    app.jinja_env.filters.update(text.FILTERS)
    app.jinja_env.globals["database_name"] = Path(db).name
    for view in (home, discrepancies, search, model, pair, family, sql, tables):
        app.register_blueprint(view.blueprint)
    app.after_request(_headers)
    app.register_error_handler(HTTPException, _error_page)
    app.wsgi_app = _guarded(app.wsgi_app, pages)
    return app


def _private_folder() -> Path:
    """A folder of the server's own, removed when it exits: where the SQL lanes' processes spill."""
    folder = Path(tempfile.mkdtemp(prefix="hubtrace-serve-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


class _Panicked(RuntimeError):
    """A BaseException that is not an Exception (polars' PanicException) raised while answering a request."""


_PASSED_THROUGH = (Exception, GeneratorExit, KeyboardInterrupt, SystemExit)


@contextmanager
def _panics_as_errors() -> Iterator[None]:
    """Turn a BaseException that is no Exception (polars' PanicException, raised in Rust) into an error: Flask and
    waitress handle only Exception, and one that escapes them leaves the request unanswered, its client waiting
    for ever. An error is answered with 500, or ends a streamed response early."""
    try:
        yield
    except _PASSED_THROUGH:
        raise
    except BaseException as exc:
        raise _Panicked(f"{type(exc).__name__}: {exc}") from exc


def _guarded(wsgi_app: Callable[..., Iterable[bytes]], pages: PagesFirst) -> Callable[..., Iterable[bytes]]:
    """The app, with `_panics_as_errors` around each response, while it is made and while it is streamed; the thread
    counted as making a page while the response is made (not while a download streams: jobs.web.priority)."""
    def guarded(environ: dict, start_response: Callable) -> Iterable[bytes]:
        with _panics_as_errors(), pages.page():
            body = wsgi_app(environ, start_response)
        file_wrapper = environ.get("wsgi.file_wrapper")
        if file_wrapper is not None and isinstance(body, file_wrapper):
            return body  # a spooled download: waitress sends the file itself, without a thread (jobs.web.spool)
        return _GuardedBody(body)
    return guarded


class _GuardedBody:
    """A response body iterated under `_panics_as_errors`."""

    def __init__(self, body: Iterable[bytes]) -> None:
        self._body = body

    def __iter__(self) -> Iterator[bytes]:
        with _panics_as_errors():
            yield from self._body

    def close(self) -> None:
        close = getattr(self._body, "close", None)
        if close is not None:
            close()


def _addressed_to(names: frozenset[str]) -> Callable[[], None]:
    def check() -> None:
        if _host_name(request.headers.get("Host", "")) not in names:
            abort(403, description="This app answers only requests addressed to this machine "
                                   f"({', '.join(sorted(names))}).")
    return check


def _not_from_another_site() -> None:
    """Refuse what a page of another site asks for (an image or a link pointing here, the SQL box among them): the
    browser says so in Sec-Fetch-Site. Links within the app (same-origin), an address typed or bookmarked (none, or
    no header from a client that is not a browser) and the stylesheet (it reads no database) pass."""
    if request.endpoint == "static":
        return
    if request.headers.get("Sec-Fetch-Site", "none") not in ("same-origin", "none"):
        abort(403, description="This app answers its own pages and addresses typed in, not requests another site "
                               "makes.")


def _host_name(header: str) -> str | None:
    """The name in a Host header, without port or IPv6 brackets (None for one that does not parse)."""
    try:
        return urlsplit("//" + header).hostname
    except ValueError:
        return None


def _headers(response: Response) -> Response:
    """Every response: nothing loaded from elsewhere, no sniffing, no referrer; a view may set a CSP of its own."""
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def _error_page(error: HTTPException) -> Any:
    """A refusal as a page that says what went wrong and where to go, with its status; never a traceback."""
    return render_template("error.html", title=error.name, message=error.description), error.code or 500
