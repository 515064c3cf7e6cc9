"""The scan database as the app reads it: one sealed read-only `Store` per worker thread, because a DuckDB
connection must not be shared between threads, and the server answers several requests at once. They share one
engine, whose memory, threads and spill space the app bounds (`EngineLimits`) and whose settings no statement can
change (the store locks them)."""

from __future__ import annotations

import threading
from pathlib import Path

from flask import current_app

from scanner.engine_limits import EngineLimits
from scanner.store import Store

EXTENSION = "hubtrace_database"
"""The key of the app's `Database` in ``app.extensions``."""


class Database:
    """Opens the file read-only (no other file reachable from SQL) once per thread that asks, and closes them all."""

    def __init__(self, path: Path, limits: EngineLimits) -> None:
        self.path, self.limits = path, limits
        self._local = threading.local()
        self._opened: list[Store] = []
        self._lock = threading.Lock()

    def store(self) -> Store:
        store = getattr(self._local, "store", None)
        if store is None:
            store = self._local.store = Store(self.path, read_only=True, limits=self.limits)
            with self._lock:
                self._opened.append(store)
        return store

    def close(self) -> None:
        with self._lock:
            for store in self._opened:
                store.close()
            self._opened.clear()


def store() -> Store:
    """This thread's reader of the app's database (inside a request)."""
    return current_app.extensions[EXTENSION].store()
