"""What a process's DuckDB engine may use. Apart from the store (which applies them when it opens a database), so
a command line can name the defaults without loading DuckDB."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineLimits:
    """What one process's reading connections to a database may use, all of them together (DuckDB shares one
    engine among a process's connections to a file): memory, threads, and the temporary files a query may spill to
    (DuckDB's own defaults are 80% of RAM, every core and most of the disk). One thread means DuckDB starts no
    workers of its own: each statement runs on the thread that asked for it, so requests still run side by side,
    and a statement runs at its thread's priority (jobs.web.bounds lowers the SQL box's)."""

    memory: str = "1GB"
    threads: int = 1
    spill: str = "1GB"

    def config(self) -> dict[str, Any]:
        return {"memory_limit": self.memory, "threads": self.threads, "max_temp_directory_size": self.spill}
