"""Whose fingerprint store a scan writes to, settled before it trusts a file there.

The fingerprint store records the scan database it belongs to (`scanner.fingerprints.store.StoreOwner`). A store
that no database claimed yet, or that this one claimed, is used as it is. One that another database still uses (its
rows name files there: two configurations naming one folder or bucket) is refused, since each database would trust
files the other rewrites. One whose database is gone (deleted and started again under the same name) or no longer
uses it (a copy of an output folder) is taken over: its files are not trusted, and any fingerprint this database
had recorded in it is made anew.
"""

from __future__ import annotations

import socket
from pathlib import Path

from jobs.config import ConfigError
from scanner.fingerprints.store import OWNER_FILE, FingerprintStore, StoreOwner
from scanner.store import Store, StoreError, StoreLockedError


def claim_fingerprint_store(fingerprints: FingerprintStore, store: Store, db_path: Path) -> str | None:
    """Make ``fingerprints`` the store of ``store``'s database. Returns what a person must know when it belonged
    to a database that is gone (None otherwise); raises ConfigError when another database still uses it."""
    identity = store.identity()
    here = StoreOwner(identity.database_id, str(db_path.resolve()), socket.gethostname())
    recorded = fingerprints.owner()
    note = None
    if recorded is not None and recorded.database_id != identity.database_id:
        in_use = _still_in_use(recorded, here, fingerprints.location)
        if in_use is not None:
            raise ConfigError(
                f"fingerprint_store {fingerprints.location} belongs to another scan database, {recorded.database} "
                f"(id {recorded.database_id}), which {in_use}; give each database its own fingerprint_store (if that "
                f"database is gone, delete {fingerprints.location}/{OWNER_FILE} and scan again)")
        forgotten = store.forget_fingerprints_under(fingerprints.location)
        note = (f"fingerprint_store {fingerprints.location} belonged to the scan database {recorded.database}, which "
                f"is gone: none of its files is trusted, every fingerprint this database needs is made anew"
                + (f" ({forgotten} it had recorded there)" if forgotten else ""))
    if recorded != here:
        fingerprints.set_owner(here)
    return note


def _still_in_use(recorded: StoreOwner, here: StoreOwner, location: str) -> str | None:
    """Why the database a store records may still be using it (None: it is gone or uses it no more), in words."""
    if recorded.database_id is None:
        return None  # a record that cannot be read: no database can show it is its own
    if recorded.host != here.host:
        return f"a scan on host {recorded.host} made, and this host cannot look at"
    path = Path(recorded.database)
    if path == Path(here.database) or not path.is_file():
        return None  # replaced by this database, or deleted
    try:
        with Store(path, read_only=True) as other:
            other_id, used = other.identity().database_id, other.fingerprints_under(location)
    except StoreLockedError:
        return "a process holds open now, so this scan cannot tell whether it still uses the store"
    except StoreError:
        return None  # no longer a scan database this hubtrace reads
    return f"still records {used} fingerprints there" if other_id == recorded.database_id and used else None
