"""Artefacts beside a scan database record its id, and nothing of another database is trusted (issue 34).

Real DuckDB files, a real faiss index, real entry and fingerprint files of a tiny Llama; no zoo, no Ray. The whole
scan with a deleted database is in tests/test_fault_injection.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.config import ConfigError
from jobs.ownership import claim_fingerprint_store
from scanner.fingerprints.fingerprint import Fingerprint, write_fingerprint
from scanner.fingerprints.store import OWNER_FILE, FingerprintStore
from scanner.retrieval.index import RetrievalIndex, entry_path, load_or_make_entry, read_entry
from scanner.retrieval.signatures import DEFAULT_PARAMS
from scanner.store import Store
from scanner.store.database_identity import DatabaseIdentity
from tests.store_support import Meta, record
from tests.synthetic_fingerprints import template_fingerprint


@pytest.fixture(scope="module")
def fingerprint(tmp_path_factory: pytest.TempPathFactory) -> Fingerprint:
    return template_fingerprint(tmp_path_factory.mktemp("tiny"), tokens=64)


def test_a_new_database_gets_an_id_an_old_one_keeps_its_artefacts(tmp_path: Path) -> None:
    with Store(tmp_path / "a.duckdb") as a, Store(tmp_path / "b.duckdb") as b:
        first, second = a.identity(), b.identity()
        assert first.database_id != second.database_id and not first.legacy_artefacts
        assert a.identity() == first  # one id for the life of the file
    assert first.owns(first.database_id) and not first.owns(second.database_id)
    assert not first.owns(None)  # an artefact written before ids: not a new database's
    assert DatabaseIdentity("x", legacy_artefacts=True).owns(None)


def test_an_entry_or_index_of_another_database_is_made_anew(fingerprint: Fingerprint, tmp_path: Path) -> None:
    address = tmp_path / "fp.safetensors"
    write_fingerprint(fingerprint, address)
    folder = tmp_path / "db.retrieval"
    old, new = DatabaseIdentity("old-database"), DatabaseIdentity("new-database")
    entry = load_or_make_entry(folder, address, DEFAULT_PARAMS, old)
    assert read_entry(entry_path(folder, address)).database_id == "old-database"
    index = RetrievalIndex(folder, entry.input_set, owner=old)
    index.sync({("org/model", "r1"): lambda: entry})
    index.save()
    assert json.loads(next(folder.rglob("manifest.json")).read_text())["database_id"] == "old-database"

    assert RetrievalIndex(folder, entry.input_set, owner=old).models  # its own database reads it back
    stranger = RetrievalIndex(folder, entry.input_set, owner=new)
    assert stranger.index is None and not stranger.models  # so every model queries it again
    assert stranger.rebuilt_because == ("index written for another database (old-database; this one is "
                                        "new-database)")
    remade = load_or_make_entry(folder, address, DEFAULT_PARAMS, new)
    assert remade.database_id == "new-database" == read_entry(entry_path(folder, address)).database_id
    assert RetrievalIndex(folder, entry.input_set, owner=DatabaseIdentity("x", legacy_artefacts=True)).index is None


def _recorded(store: Store, fingerprints: FingerprintStore, model_id: str) -> str:
    """A model whose fingerprint the database records in the store (a file there, a row here)."""
    address = fingerprints.address(model_id, "r1", "set")
    Path(address).parent.mkdir(parents=True, exist_ok=True)
    Path(address).write_bytes(b"a fingerprint")
    store.upsert_model(record(model_id), Meta(), store.start_run({}), "ok")
    store.put_fingerprint(model_id, "r1", "set", address, None, None, None)
    return address


def test_a_fingerprint_store_is_claimed_once_and_refused_to_a_second_live_database(tmp_path: Path) -> None:
    fingerprints = FingerprintStore(tmp_path / "fingerprints")
    fingerprints.prepare()
    with Store(tmp_path / "a.duckdb") as a:
        assert claim_fingerprint_store(fingerprints, a, tmp_path / "a.duckdb") is None  # nobody's: now a's
        _recorded(a, fingerprints, "org/model")
        assert claim_fingerprint_store(fingerprints, a, tmp_path / "a.duckdb") is None  # a's own
        owner = fingerprints.owner()
        assert owner is not None and owner.database_id == a.identity().database_id
    with Store(tmp_path / "b.duckdb") as b, pytest.raises(ConfigError) as refused:
        claim_fingerprint_store(fingerprints, b, tmp_path / "b.duckdb")
    assert refused.value.lines() == [
        f"fingerprint_store {fingerprints.location} belongs to another scan database, {tmp_path / 'a.duckdb'} "
        f"(id {owner.database_id}), which still records 1 fingerprints there; give each database its own "
        f"fingerprint_store (if that database is gone, delete {fingerprints.location}/{OWNER_FILE} and scan again)"]
    assert fingerprints.owner() == owner  # refused: nothing changed


def test_a_fingerprint_store_of_a_deleted_database_is_taken_over_and_not_trusted(tmp_path: Path) -> None:
    fingerprints = FingerprintStore(tmp_path / "fingerprints")
    fingerprints.prepare()
    db = tmp_path / "scan.duckdb"
    with Store(db) as old:
        claim_fingerprint_store(fingerprints, old, db)
        _recorded(old, fingerprints, "org/model")
    db.unlink()  # start over: a new database of the same name
    with Store(db) as new:
        note = claim_fingerprint_store(fingerprints, new, db)
        assert fingerprints.owner().database_id == new.identity().database_id
    assert note == (f"fingerprint_store {fingerprints.location} belonged to the scan database {db}, which is gone: "
                    "none of its files is trusted, every fingerprint this database needs is made anew")


def test_a_database_whose_store_was_taken_over_forgets_its_fingerprints_there(tmp_path: Path) -> None:
    fingerprints = FingerprintStore(tmp_path / "fingerprints")
    fingerprints.prepare()
    with Store(tmp_path / "a.duckdb") as a:
        claim_fingerprint_store(fingerprints, a, tmp_path / "a.duckdb")
        _recorded(a, fingerprints, "org/model")
    (tmp_path / "copy-of-the-folder").mkdir()  # b claims it while a is moved away: a's rows now name its files
    (tmp_path / "a.duckdb").rename(tmp_path / "copy-of-the-folder" / "a.duckdb")
    with Store(tmp_path / "b.duckdb") as b:
        assert claim_fingerprint_store(fingerprints, b, tmp_path / "b.duckdb") is not None
    with Store(tmp_path / "copy-of-the-folder" / "a.duckdb") as a:  # back: b rewrote what it liked meanwhile
        note = claim_fingerprint_store(fingerprints, a, tmp_path / "copy-of-the-folder" / "a.duckdb")
        assert note is not None and note.endswith("(1 it had recorded there)")
        assert a.fingerprints_under(fingerprints.location) == 0  # made anew by its next fingerprint stage
