"""Who holds a scan database, in one line that says it right.

DuckDB refuses to open a file another process holds and names that process's PID, but not whether it holds the
file read-write (a running scan) or read-only (an investigator's query, graph or report). Linux says which in
/proc/locks (DuckDB takes a POSIX WRITE lock for a writer, READ for a reader); DuckDB's own message hints at a
reader too ("you would be able to open this database in read-only mode").
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from scanner.text_safety import terminal

_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (?P<exe>.*?) \(PID (?P<pid>\d+)\)")
_PROC_LOCK = re.compile(r"^\d+:\s+POSIX\s+\S+\s+(?P<kind>READ|WRITE)\s+(?P<pid>\d+)\s+\S+:(?P<inode>\d+)\s")
COMMAND_CHARS = 120
"""A holder's command line is shown up to this many characters."""


def lock_conflict(path: Path, message: str) -> str | None:
    """The one-line explanation of a DuckDB lock error on path, or None when message is not a lock conflict."""
    held = _LOCK_HOLDER.search(message)
    if held is None:
        return None
    pid = int(held["pid"])
    kind = _proc_lock_kind(path, pid) or ("READ" if "read-only mode" in message else None)
    who = f"process {pid}" + (f" ({command})" if (command := _command_line(pid)) else "")
    if kind == "WRITE":
        return (f"the scan database {path} is open for writing by {who}, normally a scan still running; DuckDB lets "
                f"no other process open it, not even read-only, until that ends: wait, or query a copy of the file")
    if kind == "READ":
        return (f"the scan database {path} is open read-only by {who} (a query, graph, report or discrepancies "
                f"command); a scan needs the file to itself: wait for that command to end or stop it")
    return f"the scan database {path} is held by {who}; DuckDB lets one writer or several readers open it at a time"


def _proc_lock_kind(path: Path, pid: int) -> str | None:
    """READ or WRITE: the POSIX lock pid holds on path's inode, from /proc/locks (None where unknown)."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text(encoding="ascii", errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        m = _PROC_LOCK.match(line)
        if m and int(m["pid"]) == pid and int(m["inode"]) == inode:
            return m["kind"]
    return None


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    text = terminal(" ".join(part.decode("utf-8", errors="replace") for part in raw.split(b"\0") if part))
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 1] + "…"
