"""The bounds of `hubtrace serve` (jobs.web.bounds and jobs.web.downloads apply them), light enough for the command
line to name their defaults without loading Flask or DuckDB."""

from __future__ import annotations

from dataclasses import dataclass, field

from scanner.engine_limits import EngineLimits


@dataclass(frozen=True)
class ServeLimits:
    """The bounds of `hubtrace serve` (its command line sets them; docs/serve.md states them)."""

    query_seconds: float = 30.0
    download_rows: int = 1_000_000
    download_bytes: int = 1 << 30
    sql_slots: int = 2
    download_slots: int = 2
    write_seconds: float = 30.0
    request_seconds: float = 5.0
    first_byte_seconds: float = 5.0
    """How long the system keeps a new connection that has sent nothing from the server (jobs.web.channel)."""
    connections: int = 4096
    connections_per_address: int = 16
    statement_mb: int = 1024
    """The memory (the system's data limit) of each SQL lane's process, jobs.web.statement_process."""
    spool_bytes: int = 4 << 30
    """Bytes of downloads written and waiting for their clients, all together (jobs.web.spool)."""
    min_rate: int = 16 << 10
    """Bytes a second a client must take of a finished answer, on average, once it has had `write_seconds`."""
    engine: EngineLimits = field(default_factory=EngineLimits)
