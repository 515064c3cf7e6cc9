"""Which scan database an artefact belongs to.

A scan keeps state beside its database: the retrieval index with its manifest and entries (``<db>.retrieval/``)
and the fingerprint store. Each records the id of the database that wrote it (the ``database_identity`` table),
and a scan trusts only its own: one left by another database, or by a database deleted and started again under
the same name, once told a new database that every model had already queried the index, and the scan tested
nothing. Pure: no file, no SQL."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatabaseIdentity:
    """A database's id, and whether artefacts that record no id (written before ids existed) are its own: true
    for a database that already had scans when it was given its id, false for one made since."""

    database_id: str
    legacy_artefacts: bool = False

    def owns(self, recorded: str | None) -> bool:
        """Whether an artefact that records ``recorded`` (None: no id) belongs to this database."""
        return recorded == self.database_id if recorded is not None else self.legacy_artefacts

    def stranger(self, recorded: str | None) -> str:
        """Why an artefact that records ``recorded`` is not this database's, in words."""
        if recorded is None:
            return "written before databases had ids, and this database is newer"
        return f"written for another database ({recorded}; this one is {self.database_id})"
