"""The scan database: one DuckDB file, one writer, every write an idempotent upsert inside a transaction.

DuckDB lets one process hold a file read-write, and while it does no other process can open the file at all
(not even read-only); several read-only processes can share it when no writer is open. A scan is therefore the
only writer, and investigators open with ``read_only=True`` between scans. Everything a retried or rerun scan
writes is keyed by a primary key and written with ``ON CONFLICT DO UPDATE``, so writing the same thing twice
leaves one row.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from scanner import __version__
from scanner.engine_limits import EngineLimits
from scanner.errors import HubtraceError, without_sql_excerpt
from scanner.stats.versions import statistic_version
from scanner.store.database_identity import DatabaseIdentity
from scanner.store.locks import lock_conflict
from scanner.store.schema import LATEST_VERSION, MIGRATIONS, SCHEMA_VERSION_DDL

if TYPE_CHECKING:
    from scanner.fingerprints.fingerprint import FingerprintMeta
    from scanner.sources import ModelRecord
    from scanner.stats.weight_statistics import WeightProfile

MODEL_STATUSES = ("ok", "error", "superseded")
RUN_STATUSES = ("running", "succeeded", "failed", "abandoned")
PAIR_REASONS = ("comparable", "declared_base")

PairKey = tuple[str, str, str, str]
"""(model_a, revision_a, model_b, revision_b) with (model_a, revision_a) < (model_b, revision_b)."""


#: DuckDB types polars has no faithful type for (VARINT would arrive as raw bytes, INTERVAL not at all): a person's
#: query gets them as DuckDB's own text.
TEXT_TYPES = frozenset({"BIGNUM", "VARINT", "VARIANT", "INTERVAL", "BIT", "UNION"})


class LastError(NamedTuple):
    """A model revision's most recent scan error: where it failed, how, and in which run."""

    stage: str
    error_type: str | None
    reason: str | None
    run_id: str


class StoreError(HubtraceError):
    """The database cannot be opened or used as asked (missing file, newer or older schema, bad values)."""


class StoreLockedError(StoreError):
    """Another process holds the database file: a running scan (read-write), or readers when a scan starts."""


@dataclass(frozen=True)
class PairTestRow:
    """One stored pair test. Either order of the two models is accepted; the store keeps model_a < model_b."""

    model_a: str
    revision_a: str
    model_b: str
    revision_b: str
    statistic: str
    input_set: str
    log10_p: float | None
    n_layers: int
    layers: list[dict] = field(default_factory=list)   # {layer_a, layer_b, log10_p, rho, n_units}
    notes: list[str] = field(default_factory=list)
    reason: str = "comparable"                          # 'comparable' | 'declared_base'
    run_id: str | None = None
    closeness: float | None = None                      # phi_MATCH: mean cosine of matched activations (symmetric)
    value: float | None = None                          # a weight fingerprint's raw value (symmetric)
    cannot_test: str | None = None                      # why the pair could not be tested (log10_p is then NULL)
    block_map: str | None = None                        # a related depth-changed pair's block map, made with the
    #                                                     test (JSON, scanner.pairs.block_map; in terms of the
    #                                                     shallow and the deep model, so symmetric); None: none made

    def normalized(self) -> PairTestRow:
        """The same test with the smaller (model, revision) first; per-block layer indices follow their model."""
        if (self.model_a, self.revision_a) <= (self.model_b, self.revision_b):
            return self
        layers = [{**d, "layer_a": d.get("layer_b"), "layer_b": d.get("layer_a")} for d in self.layers]
        return PairTestRow(self.model_b, self.revision_b, self.model_a, self.revision_a, self.statistic,
                           self.input_set, self.log10_p, self.n_layers, layers, list(self.notes), self.reason,
                           self.run_id, self.closeness, self.value, self.cannot_test, self.block_map)

    @property
    def key(self) -> tuple[str, ...]:
        n = self.normalized()
        return (n.model_a, n.revision_a, n.model_b, n.revision_b, n.statistic, n.input_set)


CANDIDATE_SOURCES = ("retrieval", "family", "declared_base", "identical_tensor")


@dataclass(frozen=True)
class CandidateRow:
    """One pair candidate retrieval chose (scanner.retrieval): its collision score and rank (None where the pair
    came from elsewhere), why it was chosen, and the block map the collisions give (layer of a, layer of b)."""

    model_a: str
    revision_a: str
    model_b: str
    revision_b: str
    input_set: str
    score: int | None
    rank: int | None
    source: str                                      # one of CANDIDATE_SOURCES
    block_map: tuple[tuple[int, int], ...] = ()

    def normalized(self) -> CandidateRow:
        if (self.model_a, self.revision_a) <= (self.model_b, self.revision_b):
            return self
        return CandidateRow(self.model_b, self.revision_b, self.model_a, self.revision_a, self.input_set, self.score,
                            self.rank, self.source, tuple((b, a) for a, b in self.block_map))

    @property
    def key(self) -> PairKey:
        n = self.normalized()
        return (n.model_a, n.revision_a, n.model_b, n.revision_b)


def _text_relation(con: duckdb.DuckDBPyConnection, sql: str, every_column: bool,
                   limit: int | None) -> duckdb.DuckDBPyRelation | None:
    """The statement's relation with the columns polars cannot hold (or, ``every_column``, all) cast to VARCHAR, cut
    at ``limit`` rows; None for a statement that returns nothing."""
    relation = con.sql(sql)
    if relation is None:
        return None
    if limit is not None:
        relation = relation.limit(limit)
    columns = []
    for name, dtype in zip(relation.columns, relation.types):
        quoted = '"' + str(name).replace('"', '""') + '"'
        as_text = every_column or str(dtype).split("(")[0] in TEXT_TYPES
        columns.append(f"CAST({quoted} AS VARCHAR) AS {quoted}" if as_text else quoted)
    return relation.project(", ".join(columns))


ARROW_ROWS = 32
"""Rows DuckDB hands over at a time to an `AnswerStream`: few, so a statement of wide rows (a 5 MB value each)
costs a few of them in Python, never a frame of thousands (measured: 32-row batches read 1M narrow rows in 0.3 s,
10,000-row ones in 0.1 s; rendering them as CSV takes seconds)."""


class AnswerStream:
    """A statement's answer as polars frames of at most ``batch_rows`` rows and about ``batch_bytes`` bytes (at least
    one frame, empty for an empty answer, so its columns are known), read on a cursor of its own so the store's
    connection stays free meanwhile. Nothing runs until the first frame is asked for. Iterate once: the cursor
    closes when the frames end or the iteration is abandoned (`close` releases one never iterated). `interrupt`,
    from another thread, stops DuckDB's work on the statement, whichever batch it is on."""

    def __init__(self, cursor: duckdb.DuckDBPyConnection, sql: str, every_column: bool, limit: int | None,
                 batch_rows: int, batch_bytes: int) -> None:
        self._cursor, self._sql, self._every_column, self._limit = cursor, sql, every_column, limit
        self._batch_rows, self._batch_bytes = batch_rows, batch_bytes
        self._begun = False
        """Whether DuckDB has begun an answer (a statement that returns nothing never does)."""

    def __iter__(self) -> Iterator[pl.DataFrame]:
        pending: list[pa.RecordBatch] = []
        rows = size = 0
        for batch in self.arrow_batches():
            pending.append(batch)
            rows, size = rows + batch.num_rows, size + batch.nbytes
            if rows >= self._batch_rows or size >= self._batch_bytes:
                yield pl.from_arrow(pa.Table.from_batches(pending))
                pending, rows, size = [], 0, 0
        if pending:
            yield pl.from_arrow(pa.Table.from_batches(pending))
        elif not self._begun:
            yield pl.DataFrame()

    def arrow_batches(self) -> Iterator[pa.RecordBatch]:
        """The answer as DuckDB hands it over, `ARROW_ROWS` rows (or ``batch_rows``, if fewer) at a time: at least
        one batch, empty for an empty answer, unless the statement returns nothing at all."""
        try:
            relation = _text_relation(self._cursor, self._sql, self._every_column, self._limit)
            if relation is None:
                return
            reader = relation.to_arrow_reader(min(ARROW_ROWS, self._batch_rows))
            self._begun = True
            empty = True
            for batch in reader:
                empty = False
                yield batch
            if empty:
                yield pa.RecordBatch.from_pylist([], schema=reader.schema)
        finally:
            self._cursor.close()

    def interrupt(self) -> None:
        self._cursor.interrupt()

    def close(self) -> None:
        self._cursor.close()


@cache
def _sealed_temp_directory() -> str:
    """Where sealed readers spill: a private folder of this process, removed when it exits. DuckDB lets SQL read its
    temp folder even with external access off, and the default, <db>.tmp beside the database, could be a link to
    anywhere; one folder for all of a process's sealed readers, as DuckDB wants one configuration per file."""
    folder = tempfile.mkdtemp(prefix="hubtrace-query-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def private_folders_hidden(text: str) -> str:
    """An error message of a sealed reader as a stranger may read it: this process's own folders (DuckDB's temporary
    folder, the home directory, which DuckDB names when it looks for extensions) named by what they are, not where
    they are."""
    for folder, name in ((_sealed_temp_directory(), "<temporary folder>"), (str(Path.home()), "~")):
        if folder and folder != "/":
            text = re.sub(re.escape(folder.rstrip("/")) + r"(?=/|$|[\s\"'])", lambda _, n=name: n, text)
    return text


def _now() -> datetime:
    return datetime.now(UTC)


def new_run_id() -> str:
    """Sortable by start time and unique across machines: ``20250101T020000Z-1a2b3c``."""
    return f"{_now():%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def _check(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise StoreError(f"{what} must be one of {', '.join(allowed)}; got {value!r}")


_PAIR_SCHEMA = pa.schema([
    ("model_a", pa.string()), ("revision_a", pa.string()), ("model_b", pa.string()), ("revision_b", pa.string()),
    ("statistic", pa.string()), ("input_set", pa.string()), ("log10_p", pa.float64()), ("n_layers", pa.int32()),
    ("layers", pa.string()), ("notes", pa.list_(pa.string())), ("reason", pa.string()), ("run_id", pa.string()),
    ("closeness", pa.float64()), ("value", pa.float64()), ("statistic_version", pa.int32()),
    ("cannot_test", pa.string()),
])
_PAIR_COLUMNS = ", ".join(_PAIR_SCHEMA.names)
_CANDIDATE_SCHEMA = pa.schema([
    ("model_a", pa.string()), ("revision_a", pa.string()), ("model_b", pa.string()), ("revision_b", pa.string()),
    ("input_set", pa.string()), ("score", pa.int32()), ("rank", pa.int32()), ("source", pa.string()),
    ("block_map", pa.string()),
])

_MODEL_COLUMNS = ("source", "location", "architecture", "model_type", "hidden_size", "intermediate_size",
                  "n_layers", "n_experts", "vocab_size", "tokenizer_hash", "parameter_count",
                  "declared_base_models", "declared_relation", "claims_from_scratch", "license", "tags",
                  "created_at", "last_modified", "mlp_kind", "attention", "merge_config")
_META_COLUMNS = ("architecture", "model_type", "hidden_size", "intermediate_size", "n_layers", "n_experts",
                 "vocab_size", "tokenizer_hash", "parameter_count", "mlp_kind", "attention")


FILE_HEADERS_BYTES = 3 * 4096
"""A DuckDB file starts with three 4 KiB headers; its blocks follow (``pragma_database_size`` counts them)."""


class Store:
    """The scan database. Use as a context manager; ``read_only=True`` for investigators (no writes, no
    migrations, and the file must already exist; no other file readable unless ``allow_local_files``; the engine's
    settings locked once the connection is set up, so no statement can change them). ``limits``: a reader's
    memory, threads and spill space (`EngineLimits`; DuckDB's defaults without)."""

    def __init__(self, path: str | Path, *, read_only: bool = False, allow_local_files: bool = False,
                 limits: EngineLimits | None = None) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self.allow_local_files = allow_local_files
        self.limits = limits
        if read_only and not self.path.is_file():
            raise StoreError(f"no scan database at {self.path} (run a scan first, or check --db)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        recovering = not read_only and self._wal.exists()
        self._con = self._connect()
        self._depth = 0
        try:
            self._check_whole()
            self._settle_settings()
            if read_only:
                self._check_version()
            else:
                self._migrate()
            if recovering:  # what a killed writer left in the log goes into the file now, not at some later close
                self.checkpoint()
        except duckdb.Error as exc:  # a damaged file can fail any first read
            self._con.close()
            raise StoreError(f"{self.path} is not a readable scan database: {without_sql_excerpt(exc)}") from exc
        except BaseException:
            self._con.close()
            raise

    @property
    def _wal(self) -> Path:
        """DuckDB's write-ahead log beside the file: changes committed but not yet written into it."""
        return self.path.with_name(self.path.name + ".wal")

    @property
    def _sealed(self) -> bool:
        """Whether SQL on this connection may reach nothing but the database (`_config`)."""
        return self.read_only and not self.allow_local_files

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.limits is not None:  # a limit DuckDB cannot read is the limit's fault, not the file's
            try:
                duckdb.connect(":memory:", config=self.limits.config()).close()
            except duckdb.Error as exc:
                raise StoreError(f"DuckDB cannot use these limits (memory {self.limits.memory}, {self.limits.threads} "
                                 f"threads, spill {self.limits.spill}): {without_sql_excerpt(exc)}") from exc
        try:
            return duckdb.connect(str(self.path), read_only=self.read_only, config=self._config())
        except duckdb.IOException as exc:
            conflict = lock_conflict(self.path, str(exc))
            if conflict is None:
                raise StoreError(f"cannot open the scan database {self.path}: {exc}") from exc
            raise StoreLockedError(conflict) from exc
        except duckdb.Error as exc:
            raise StoreError(f"{self.path} is not a readable DuckDB database: {exc}") from exc

    def _config(self) -> dict[str, Any]:
        """Readers touch nothing but this file: no other local file, no extension installed or loaded on demand
        (so a query cannot read /etc/passwd or fetch code), unless allow_local_files says otherwise."""
        config: dict[str, Any] = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
        if self._sealed:
            config["enable_external_access"] = False
            config["temp_directory"] = _sealed_temp_directory()
        if self.limits is not None:
            config.update(self.limits.config())
        return config

    def _check_whole(self) -> None:
        """Refuse a file too short to hold the blocks its header says are in use (a copy cut short, a full disk):
        DuckDB opens one and fails later, on whichever read reaches the missing part. A block's number is its place
        in the file, so the used ones need at least that many blocks after the headers (free blocks at the end may
        have been cut off by DuckDB itself). A write-ahead log beside the file may hold blocks not yet in it, so
        the check waits until there is none."""
        if self._wal.exists() or not self.path.is_file():
            return
        (block_size, used), = self._rows("SELECT block_size, used_blocks FROM pragma_database_size() "
                                         "WHERE database_name = current_database()")
        size, needed = self.path.stat().st_size, FILE_HEADERS_BYTES + block_size * used
        if used and size < needed:
            raise StoreError(f"the scan database {self.path} is truncated: {size:,} bytes, where the blocks its "
                             f"header counts in use need {needed:,}; restore it from a copy, or delete it (and "
                             f"{self.path.name}.retrieval/ beside it) to start anew")

    def _settle_settings(self) -> None:
        """Timestamps in UTC on every connection of the engine (cursors too); a reader's engine then takes no
        further setting (``lock_configuration``: no SET, and no table function that changes the engine, such
        as ``enable_logging``, can run). A later reader of the same engine finds it locked, and in UTC."""
        if self._rows("SELECT current_setting('lock_configuration')")[0][0]:
            if self._rows("SELECT current_setting('TimeZone')")[0][0] != "UTC":
                raise StoreError(f"{self.path} is already open in this process with settings hubtrace did not make")
            return
        self._con.execute("SET GLOBAL TimeZone = 'UTC'")
        if self.read_only:
            self._con.execute("SET lock_configuration = true")

    # schema ---------------------------------------------------------------------------------------------------
    def schema_version(self) -> int:
        """The newest migration applied to this file (0 for a file hubtrace never wrote)."""
        if not self._rows("SELECT 1 FROM information_schema.tables WHERE table_name = 'schema_version'"):
            return 0
        return int(self._rows("SELECT coalesce(max(version), 0) FROM schema_version")[0][0])

    def _check_version(self) -> None:
        version = self.schema_version()
        if version > LATEST_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this hubtrace ({__version__}, schema "
                f"{LATEST_VERSION}) reads; upgrade hubtrace to read it")
        if version < LATEST_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, this hubtrace needs {LATEST_VERSION}: open it once "
                f"read-write (any scan does) to migrate it")

    def _migrate(self) -> None:
        self._con.execute(SCHEMA_VERSION_DDL)
        version = self.schema_version()
        if version > LATEST_VERSION:
            raise StoreError(
                f"{self.path} has schema version {version}, newer than this hubtrace ({__version__}, schema "
                f"{LATEST_VERSION}) knows; upgrade hubtrace before writing to it")
        for migration in MIGRATIONS:
            if migration.version <= version:
                continue
            with self.transaction():
                for statement in migration.statements():
                    self._con.execute(statement)
                self._con.execute("INSERT INTO schema_version VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                  [migration.version, migration.description, _now(), __version__])

    def identity(self) -> DatabaseIdentity:
        """This database's id, which every artefact kept beside it records (scanner.store.database_identity)."""
        (database_id, legacy), = self._rows("SELECT database_id, legacy_artefacts FROM database_identity")
        return DatabaseIdentity(database_id, legacy)

    # plumbing -------------------------------------------------------------------------------------------------
    @property
    def connection(self) -> duckdb.DuckDBPyConnection:
        """The raw connection, for callers that own a multi-statement write (lineage rebuild)."""
        return self._con

    def _rows(self, sql: str, params: list | dict | None = None) -> list[tuple]:
        # Fetch everything: DuckDB 2.0 refuses further work on a connection while a result is half read.
        return self._con.execute(sql, params or []).fetchall()

    @contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """All writes inside commit together or not at all; nested uses join the outermost transaction."""
        if self._depth:
            self._depth += 1
            try:
                yield self._con
            finally:
                self._depth -= 1
            return
        self._con.execute("BEGIN TRANSACTION")
        self._depth = 1
        try:
            yield self._con
        except BaseException:
            self._depth = 0
            self._con.execute("ROLLBACK")
            raise
        self._depth = 0
        self._con.execute("COMMIT")

    def query(self, sql: str, params: list | dict | None = None) -> pl.DataFrame:
        """Run one SQL statement and return its rows as a polars frame (empty frames keep their columns)."""
        relation = self._con.sql(sql, params=params or None)
        return pl.DataFrame() if relation is None else relation.pl()

    def query_as_text(self, sql: str, *, every_column: bool = False, limit: int | None = None) -> pl.DataFrame:
        """`query` for a person's SQL: the columns of types polars has no faithful one for (`TEXT_TYPES`), or with
        ``every_column`` all of them, cast to VARCHAR by DuckDB (column names quoted: they come from the query).
        ``limit``: at most that many rows, and DuckDB stops there (a page that shows 500 rows reads 501)."""
        relation = _text_relation(self._con, sql, every_column, limit)
        return pl.DataFrame() if relation is None else relation.pl()

    def stream_as_text(self, sql: str, *, every_column: bool = False, limit: int | None = None,
                       batch_rows: int = 10_000, batch_bytes: int = 4 << 20) -> AnswerStream:
        """`query_as_text` a batch of rows (and bytes) at a time (`AnswerStream`), so a big answer never sits in
        memory whole."""
        return AnswerStream(self._con.cursor(), sql, every_column, limit, batch_rows, batch_bytes)

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # runs -----------------------------------------------------------------------------------------------------
    def start_run(self, config: dict) -> str:
        """Record a scan as running, with this process and host, and return its id. Every other run still marked
        running is marked abandoned first: this process holds the file for writing, and DuckDB lets no other
        process open it meanwhile, so their processes are gone (killed, or their machine lost)."""
        run_id = new_run_id()
        host, pid = socket.gethostname(), os.getpid()
        with self.transaction() as con:
            for other, other_host, other_pid in con.execute(
                    "SELECT run_id, host, pid FROM scan_runs WHERE status = 'running'").fetchall():
                if (other_host, other_pid) == (host, pid):
                    continue  # a run of this very process (a caller that has not finished it yet)
                process = f"process {other_pid} on {other_host}" if other_pid is not None else "its process"
                con.execute("UPDATE scan_runs SET status = 'abandoned', summary = ? WHERE run_id = ?",
                            [json.dumps({"abandoned": f"{process} ended without finishing the run; found by run "
                                                      f"{run_id}"}), other])
            con.execute(
                "INSERT INTO scan_runs (run_id, started_at, status, config, hubtrace_version, host, pid) "
                "VALUES (?, ?, 'running', ?, ?, ?, ?)",
                [run_id, _now(), json.dumps(config, default=str), __version__, host, pid])
        return run_id

    def finish_run(self, run_id: str, status: str, summary: dict) -> None:
        """Record the run's end and write everything into the file (`checkpoint`): a run ends with a whole file."""
        _check(status, RUN_STATUSES, "run status")
        updated = self._rows(
            "UPDATE scan_runs SET finished_at = ?, status = ?, summary = ? WHERE run_id = ? RETURNING run_id",
            [_now(), status, json.dumps(summary, default=str), run_id])
        if not updated:
            raise StoreError(f"no scan run {run_id!r} in {self.path}")
        self.checkpoint()

    def checkpoint(self) -> None:
        """Write every committed change into the database file and empty its write-ahead log, so the file alone is
        the whole database (people copy and move a database as one file). DuckDB does this when the last
        connection closes; a run that ends, or a log a killed writer left, should not wait for that."""
        self._con.execute("CHECKPOINT")

    # models and fingerprints ----------------------------------------------------------------------------------
    def known_revision(self, model_id: str) -> str | None:
        """The revision of the model's current (not superseded) row, or None for a model never seen."""
        rows = self._rows(
            "SELECT revision FROM current_models WHERE model_id = ? ORDER BY last_seen_run DESC NULLS LAST LIMIT 1",
            [model_id])
        return rows[0][0] if rows else None

    def upsert_model(self, record: ModelRecord, meta: FingerprintMeta | None, run_id: str, status: str) -> None:
        """Store a model at one revision. A different revision already stored for the model is marked
        'superseded', with its pair tests (kept as history). Fields the fingerprint would give stay as they were
        when ``meta`` is None (an error at a revision that once fingerprinted keeps its dimensions)."""
        _check(status, ("ok", "error"), "model status")
        values: dict[str, Any] = {
            "source": record.source, "location": str(record.location),
            "declared_base_models": list(record.base_models), "declared_relation": record.base_model_relation,
            "claims_from_scratch": bool(record.claims_from_scratch), "license": record.license,
            "tags": list(record.tags), "created_at": record.created_at, "last_modified": record.last_modified,
            "merge_config": record.merge.to_json() if record.merge is not None else None,
        }
        for column in _META_COLUMNS:
            values[column] = getattr(meta, column, None) if meta is not None else None
        columns = ("model_id", "revision", *_MODEL_COLUMNS, "status", "first_seen_run", "last_seen_run")
        params = [record.model_id, record.revision, *(values[c] for c in _MODEL_COLUMNS), status, run_id, run_id]
        updates = ", ".join(
            [f"{c} = coalesce(excluded.{c}, models.{c})" if c in _META_COLUMNS else f"{c} = excluded.{c}"
             for c in _MODEL_COLUMNS] + ["status = excluded.status", "last_seen_run = excluded.last_seen_run"])
        with self.transaction() as con:
            con.execute("UPDATE models SET status = 'superseded' WHERE model_id = ? AND revision <> ? "
                        "AND status <> 'superseded'", [record.model_id, record.revision])
            con.execute("UPDATE pair_tests SET superseded = true WHERE NOT superseded AND "
                        "((model_a = $m AND revision_a <> $r) OR (model_b = $m AND revision_b <> $r))",
                        {"m": record.model_id, "r": record.revision})
            con.execute(f"INSERT INTO models ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
                        f"ON CONFLICT (model_id, revision) DO UPDATE SET {updates}", params)
            # A model that returned to an earlier revision: its old tests against current partners hold again.
            con.execute(
                "UPDATE pair_tests SET superseded = false WHERE superseded AND ("
                "(model_a = $m AND revision_a = $r AND (model_b, revision_b) IN "
                "  (SELECT (model_id, revision) FROM current_models)) OR "
                "(model_b = $m AND revision_b = $r AND (model_a, revision_a) IN "
                "  (SELECT (model_id, revision) FROM current_models)))",
                {"m": record.model_id, "r": record.revision})
            hashes = getattr(meta, "tensor_hashes", None)
            if hashes:
                self._put_tensor_hashes(con, record.model_id, record.revision, hashes)

    def put_fingerprint(self, model_id: str, revision: str, input_set: str, path: str | Path,
                        file_sha256: str | None, n_tokens: int | None, run_id: str | None) -> None:
        self._con.execute(
            "INSERT INTO fingerprints VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
            "path = excluded.path, file_sha256 = excluded.file_sha256, n_tokens = excluded.n_tokens, "
            "hubtrace_version = excluded.hubtrace_version, run_id = excluded.run_id, created_at = excluded.created_at",
            [model_id, revision, input_set, str(path), file_sha256, n_tokens, __version__, run_id, _now()])

    def forget_fingerprint(self, model_id: str, revision: str, input_set: str) -> None:
        """Drop a fingerprint's row (its file was found damaged or missing): the next fingerprint stage makes it anew,
        as for a revision never fingerprinted."""
        self._con.execute("DELETE FROM fingerprints WHERE model_id = ? AND revision = ? AND input_set = ?",
                          [model_id, revision, input_set])

    def fingerprints_under(self, location: str) -> int:
        """How many fingerprints this database records under a store location (whether it uses that store)."""
        return self._rows("SELECT count(*) FROM fingerprints WHERE starts_with(path, ?)",
                          [location.rstrip("/") + "/"])[0][0]

    def forget_fingerprints_under(self, location: str) -> int:
        """Drop the rows of every fingerprint recorded under a store location (a store another database took over
        meanwhile); returns how many. The next fingerprint stage makes them anew."""
        return len(self._rows("DELETE FROM fingerprints WHERE starts_with(path, ?) RETURNING model_id",
                              [location.rstrip("/") + "/"]))

    def recorded_fingerprint_path(self, model_id: str, revision: str, input_set: str) -> str | None:
        """The fingerprint file recorded for this model, revision and input set (it may have gone since)."""
        rows = self._rows("SELECT path FROM fingerprints WHERE model_id = ? AND revision = ? AND input_set = ?",
                          [model_id, revision, input_set])
        return rows[0][0] if rows else None

    def fingerprints_on(self, input_set_prefix: str) -> list[tuple[str, str, str]]:
        """(model_id, revision, recorded path) of every fingerprint whose input set starts with this prefix."""
        return [tuple(r) for r in self._rows(
            "SELECT model_id, revision, path FROM fingerprints WHERE starts_with(input_set, ?)", [input_set_prefix])]

    def current_revisions(self) -> dict[str, tuple[str, str]]:
        """model_id -> (revision, status) of every current (not superseded) model."""
        return {m: (rev, status) for m, rev, status in self._rows(
            "SELECT model_id, revision, status FROM current_models")}

    def last_errors(self) -> dict[tuple[str, str], LastError]:
        """(model_id, revision) -> its most recent scan error."""
        return {(m, rev): LastError(*rest) for m, rev, *rest in self._rows(
            "SELECT model_id, revision, stage, error_type, reason, run_id FROM scan_errors "
            "QUALIFY row_number() OVER (PARTITION BY model_id, revision ORDER BY \"at\" DESC) = 1")}

    def fingerprinted_ok_models(self, input_set_prefix: str
                                ) -> list[tuple[str, str, str, str, tuple[str, ...], str | None, str]]:
        """(model_id, revision, input_set, path, declared bases, file sha256, kind) of each current 'ok' model with a
        fingerprint on an input set starting with this prefix, by model id: the candidates for pair tests. The kind
        is "<mlp kind>, <attention>" (a row from before they were stored counts as "gated, causal")."""
        return [(m, rev, s, p, tuple(bases or ()), sha, kind) for m, rev, s, p, bases, sha, kind in self._rows(
            "SELECT m.model_id, m.revision, f.input_set, f.path, m.declared_base_models, f.file_sha256, "
            "coalesce(m.mlp_kind, 'gated') || ', ' || coalesce(m.attention, 'causal') "
            "FROM current_models m JOIN fingerprints f USING (model_id, revision) "
            "WHERE m.status = 'ok' AND starts_with(f.input_set, ?) ORDER BY m.model_id", [input_set_prefix])]

    # pair tests -----------------------------------------------------------------------------------------------
    def tested_pair_keys(self, statistic: str, input_set: str) -> set[PairKey]:
        """Pairs with a current (not superseded) test of this statistic on this input set, made by the statistic's
        present version (a test an earlier version made is tested again)."""
        rows = self._rows("SELECT model_a, revision_a, model_b, revision_b FROM current_pair_tests "
                          "WHERE statistic = ? AND input_set = ? AND coalesce(statistic_version, 1) = ?",
                          [statistic, input_set, statistic_version(statistic)])
        return {(a, ra, b, rb) for a, ra, b, rb in rows}

    def put_pair_tests(self, rows: Iterable[PairTestRow]) -> None:
        """Store a batch of tests in one transaction (all or none), with the block maps made with them. A test of a
        pair at the same revisions, statistic and input set replaces the stored one (a map, the pair's stored map);
        one of a superseded revision is stored as superseded."""
        latest: dict[tuple[str, ...], PairTestRow] = {}
        for row in rows:
            _check(row.reason, PAIR_REASONS, "pair test reason")
            latest[row.key] = row.normalized()   # a retried batch may repeat a pair: the last one wins
        if not latest:
            return
        batch = list(latest.values())
        table = pa.table({
            "model_a": [r.model_a for r in batch], "revision_a": [r.revision_a for r in batch],
            "model_b": [r.model_b for r in batch], "revision_b": [r.revision_b for r in batch],
            "statistic": [r.statistic for r in batch], "input_set": [r.input_set for r in batch],
            "log10_p": [r.log10_p for r in batch], "n_layers": [r.n_layers for r in batch],
            "layers": [json.dumps(r.layers) for r in batch], "notes": [list(r.notes) for r in batch],
            "reason": [r.reason for r in batch], "run_id": [r.run_id for r in batch],
            "closeness": [r.closeness for r in batch], "value": [r.value for r in batch],
            "statistic_version": [statistic_version(r.statistic) for r in batch],
            "cannot_test": [r.cannot_test for r in batch],
        }, schema=_PAIR_SCHEMA)
        with self.transaction() as con:
            con.register("_pair_batch", table)
            try:
                con.execute(
                    f"INSERT OR REPLACE INTO pair_tests ({_PAIR_COLUMNS}, hubtrace_version, tested_at, superseded) "
                    f"SELECT b.*, $version, $now, "
                    f"  coalesce(ma.status = 'superseded', false) OR coalesce(mb.status = 'superseded', false) "
                    f"FROM _pair_batch b "
                    f"LEFT JOIN models ma ON ma.model_id = b.model_a AND ma.revision = b.revision_a "
                    f"LEFT JOIN models mb ON mb.model_id = b.model_b AND mb.revision = b.revision_b",
                    {"version": __version__, "now": _now()})
                maps = [(r.model_a, r.revision_a, r.model_b, r.revision_b, r.input_set, r.block_map)
                        for r in batch if r.block_map is not None]
                if maps:
                    con.executemany("INSERT OR REPLACE INTO block_maps VALUES (?, ?, ?, ?, ?, ?, now())", maps)
            finally:
                with suppress(duckdb.TransactionException):  # aborted: the rollback drops the view
                    con.unregister("_pair_batch")

    # candidate pairs ------------------------------------------------------------------------------------------
    def put_candidate_pairs(self, rows: Iterable[CandidateRow], run_id: str | None) -> None:
        """Store retrieved pairs in one transaction; a pair found again keeps its best score and rank, its first
        source unless a retrieval score now explains it, and its latest block map."""
        batch = {}
        for row in rows:
            _check(row.source, CANDIDATE_SOURCES, "candidate source")
            batch[row.key] = row.normalized()
        if not batch:
            return
        rows_ = list(batch.values())
        table = pa.table({
            "model_a": [r.model_a for r in rows_], "revision_a": [r.revision_a for r in rows_],
            "model_b": [r.model_b for r in rows_], "revision_b": [r.revision_b for r in rows_],
            "input_set": [r.input_set for r in rows_], "score": [r.score for r in rows_],
            "rank": [r.rank for r in rows_], "source": [r.source for r in rows_],
            "block_map": [json.dumps([list(p) for p in r.block_map]) for r in rows_],
        }, schema=_CANDIDATE_SCHEMA)
        with self.transaction() as con:
            con.register("_candidate_batch", table)
            try:
                con.execute(
                    "INSERT INTO candidate_pairs SELECT b.*, $run, $now FROM _candidate_batch b "
                    "ON CONFLICT DO UPDATE SET score = greatest(excluded.score, candidate_pairs.score), "
                    "rank = least(excluded.rank, candidate_pairs.rank), "
                    "source = CASE WHEN excluded.source = 'retrieval' THEN 'retrieval' "
                    "ELSE candidate_pairs.source END, "
                    "block_map = CASE WHEN excluded.source = 'retrieval' THEN excluded.block_map "
                    "ELSE candidate_pairs.block_map END",
                    {"run": run_id, "now": _now()})
            finally:
                with suppress(duckdb.TransactionException):
                    con.unregister("_candidate_batch")

    def current_candidate_pairs(self, input_set: str) -> list[CandidateRow]:
        """Candidate pairs whose two revisions are both current, on one input set."""
        rows = self._rows("SELECT model_a, revision_a, model_b, revision_b, input_set, score, rank, source, block_map "
                          "FROM current_candidate_pairs WHERE input_set = ?", [input_set])
        return [CandidateRow(a, ra, b, rb, s, score, rank, source, tuple(tuple(p) for p in json.loads(bm or "[]")))
                for a, ra, b, rb, s, score, rank, source, bm in rows]

    # tensor hashes --------------------------------------------------------------------------------------------
    def put_tensor_hashes(self, model_id: str, revision: str, hashes: dict[str, str]) -> None:
        """Store a revision's weight tensor sha256s (replacing any stored for it): a backfill for models that were
        fingerprinted before the table existed; a scan stores them with the model (upsert_model). Empty
        ``hashes`` records that the revision's fingerprint holds none, so the backfill never reads it again."""
        with self.transaction() as con:
            self._put_tensor_hashes(con, model_id, revision, hashes)
            if not hashes:
                con.execute("INSERT INTO no_tensor_hashes VALUES (?, ?, ?) ON CONFLICT DO NOTHING",
                            [model_id, revision, _now()])

    @staticmethod
    def _put_tensor_hashes(con: duckdb.DuckDBPyConnection, model_id: str, revision: str,
                           hashes: dict[str, str]) -> None:
        names = sorted(hashes)
        table = pa.table({"model_id": [model_id] * len(names), "revision": [revision] * len(names),
                          "tensor": names, "sha256": [hashes[n] for n in names]})
        con.execute("DELETE FROM model_tensors WHERE model_id = ? AND revision = ?", [model_id, revision])
        con.register("_tensor_batch", table)
        try:
            con.execute("INSERT INTO model_tensors SELECT model_id, revision, tensor, sha256 FROM _tensor_batch")
        finally:
            with suppress(duckdb.TransactionException):
                con.unregister("_tensor_batch")

    def revisions_with_tensor_hashes(self) -> set[tuple[str, str]]:
        """(model_id, revision) of every revision whose tensor hashes are stored."""
        return {(m, r) for m, r in self._rows("SELECT DISTINCT model_id, revision FROM model_tensors")}

    def revisions_with_known_tensor_hashes(self) -> set[tuple[str, str]]:
        """(model_id, revision) of every revision whose tensor hashes are stored or known to be absent: those the
        backfill need not read."""
        return {(m, r) for m, r in self._rows("SELECT DISTINCT model_id, revision FROM model_tensors UNION "
                                              "SELECT model_id, revision FROM no_tensor_hashes")}

    def shared_tensor_pairs(self, new: Iterable[tuple[str, str]],
                            skip_words: Iterable[str] = ()) -> set[tuple[tuple[str, str], tuple[str, str]]]:
        """Pairs of current revisions, at least one of them in ``new``, that hold a byte-identical tensor whose
        name contains none of ``skip_words`` (case-insensitive): one join on the sha256 index, so a nightly
        increment costs what its new revisions hold, not what the hub holds. Each pair ((a), (b)) with a < b."""
        new = sorted(set(new))
        if not new:
            return set()
        keys = pa.table({"model_id": [k[0] for k in new], "revision": [k[1] for k in new]})
        skip = "|".join(re.escape(w.lower()) for w in skip_words)
        with self.transaction() as con:
            con.register("_new_revisions", keys)
            try:
                rows = con.execute(
                    "WITH cur AS (SELECT t.* FROM model_tensors t JOIN current_models m USING (model_id, revision) "
                    "  WHERE $skip = '' OR NOT regexp_matches(lower(t.tensor), $skip)),"
                    " fresh AS (SELECT c.* FROM cur c JOIN _new_revisions n USING (model_id, revision)) "
                    "SELECT DISTINCT f.model_id, f.revision, c.model_id, c.revision FROM fresh f "
                    "JOIN cur c ON c.sha256 = f.sha256 AND (c.model_id, c.revision) <> (f.model_id, f.revision)",
                    {"skip": skip}).fetchall()
            finally:
                with suppress(duckdb.TransactionException):
                    con.unregister("_new_revisions")
        return {(min((a, ra), (b, rb)), max((a, ra), (b, rb))) for a, ra, b, rb in rows}

    # weight profiles --------------------------------------------------------------------------------------------
    def put_weight_profile(self, model_id: str, revision: str, profile: WeightProfile) -> None:
        """A model's weight profile (scanner.stats.weight_statistics), its norm weights and MLP value sample as float32
        bytes."""
        layers, kinds, width = profile.norms.shape
        self._con.execute(
            "INSERT OR REPLACE INTO weight_profiles (model_id, revision, n_layers, norm_kinds, hidden_size, norms, "
            "attn_std, ghostspec, made_at, mlp_values, mlp_layout) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [model_id, revision, layers, kinds, width, profile.norms.astype(np.float32).tobytes(),
             profile.attn_std.ravel().tolist(), profile.ghostspec.ravel().tolist(), _now(),
             profile.mlp_values.astype(np.float32).tobytes(), profile.mlp_layout])

    def weight_profiles(self, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], WeightProfile]:
        """The stored profiles of these (model, revision) keys (those that have one)."""
        from scanner.stats.weight_statistics import WeightProfile  # scipy: only for the scans that ask for these

        wanted = sorted(set(keys))
        if not wanted:
            return {}
        table = pa.table({"model_id": [k[0] for k in wanted], "revision": [k[1] for k in wanted]})
        with self.transaction() as con:
            con.register("_profile_keys", table)
            try:
                rows = con.execute(
                    "SELECT w.model_id, w.revision, w.n_layers, w.norm_kinds, w.hidden_size, w.norms, w.attn_std, "
                    "w.ghostspec, w.mlp_values, w.mlp_layout FROM weight_profiles w "
                    "JOIN _profile_keys USING (model_id, revision)").fetchall()
            finally:
                with suppress(duckdb.TransactionException):
                    con.unregister("_profile_keys")
        return {(m, r): WeightProfile(
                    norms=np.frombuffer(norms, dtype=np.float32).astype(np.float64).reshape(layers, kinds, width),
                    attn_std=np.asarray(attn_std, dtype=np.float64).reshape(layers, -1),
                    ghostspec=np.asarray(ghostspec, dtype=np.float64).reshape(layers, -1),
                    mlp_values=np.frombuffer(values or b"", dtype=np.float32).copy(), mlp_layout=layout or "")
                for m, r, layers, kinds, width, norms, attn_std, ghostspec, values, layout in rows}

    def weight_statistic_rows(self, statistic: str, match_statistic: str = "match") -> list[tuple]:
        """Every current test of ``statistic`` with the log10 p of the same pair's ``match_statistic`` test (None
        where it has none): (model_a, revision_a, model_b, revision_b, input_set, value, match log10 p, log10 p,
        notes, reason, run_id). The empirical null of a weight fingerprint is read from these."""
        return [tuple(r) for r in self._rows(
            "SELECT w.model_a, w.revision_a, w.model_b, w.revision_b, w.input_set, w.value, m.log10_p, w.log10_p, "
            "w.notes, w.reason, w.run_id FROM current_pair_tests w LEFT JOIN current_pair_tests m "
            "ON m.statistic = ? AND (m.model_a, m.revision_a, m.model_b, m.revision_b, m.input_set) = "
            "(w.model_a, w.revision_a, w.model_b, w.revision_b, w.input_set) WHERE w.statistic = ? "
            "ORDER BY w.model_a, w.model_b", [match_statistic, statistic])]

    # errors ---------------------------------------------------------------------------------------------------
    def record_error(self, run_id: str, model_id: str, revision: str | None, location: str | None, stage: str,
                     error_type: str, reason: str) -> None:
        """One row per (run, model, stage): a retried stage that fails again overwrites its row."""
        self._con.execute(
            'INSERT INTO scan_errors (run_id, model_id, stage, revision, location, error_type, reason, "at") '
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET revision = excluded.revision, "
            'location = excluded.location, error_type = excluded.error_type, reason = excluded.reason, '
            '"at" = excluded."at"',
            [run_id, model_id, stage, revision, None if location is None else str(location), error_type, reason,
             _now()])
