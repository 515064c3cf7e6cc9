"""Fault injection: damage one kind of persistent state a scan reads, then scan again.

Issue 24: one flipped byte in a stored fingerprint plus a lost ``<db>.retrieval/`` made every later scan exit at the
candidate stage, nothing recorded, every night. Issue 34: a database deleted to start over, its retrieval folder
left beside the new one, made the next scan query nothing and test nothing, in silence. Each case here starts from
the same finished scan of a small hub (copied, so the cases do not share state), damages one thing, and runs the
real scan job on a real local Ray. The next scan must end normally, with every model either fingerprinted and its
candidate pairs tested, or named in ``scan_errors`` of that run; its current pair tests must be the clean scan's
(the same pairs, the same p-values), and a damaged index must be rebuilt and answer again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from jobs.scan_job import run_scan
from scanner.retrieval.hub import index_folder
from scanner.retrieval.scan import similar
from scanner.store import Store
from tests.scan_support import copy_models, query, scan_config

#: A family of two (the chat fine-tune of the base), a camouflaged copy of the chat model, and an independent base.
MODELS = ("aurora-labs/aurora-base", "finch-nlp/aurora-chat", "nimbus/nimbus-1", "ember-ml/ember-small")
DAMAGED = "finch-nlp/aurora-chat"


def _tests(db: Path) -> dict[tuple[str, str], float]:
    """The current phi_MATCH tests: (model_a, model_b) -> log10 p."""
    tested = query(db, "SELECT model_a, model_b, log10_p FROM current_pair_tests WHERE statistic = 'match'")
    return {(a, b): p for a, b, p in tested.iter_rows()}


@pytest.fixture(scope="module")
def baseline(zoo, local_ray, tmp_path_factory) -> Path:
    """A finished scan with candidate retrieval: ``hub/`` and ``out/`` (database, index, fingerprints)."""
    root = tmp_path_factory.mktemp("baseline")
    copy_models(zoo, MODELS, root / "hub")
    run_scan(scan_config(root / "hub", root / "out", pairs={"select": "candidates"}))
    return root


def _copy(baseline: Path, target: Path) -> Path:
    """The baseline's hub and output under ``target``, the database's recorded paths moved with them."""
    shutil.copytree(baseline, target, symlinks=True)
    with Store(target / "out" / "hubtrace.duckdb") as store:
        store.connection.execute("UPDATE fingerprints SET path = replace(path, ?, ?)", [str(baseline), str(target)])
    return target


def _fingerprint(root: Path, model_id: str) -> Path:
    return next((root / "out" / "fingerprints" / model_id).rglob("*.safetensors"))


def _flip_a_byte(root: Path) -> None:
    file = _fingerprint(root, DAMAGED)
    data = bytearray(file.read_bytes())
    data[-100] ^= 0xFF
    file.write_bytes(bytes(data))


def _truncate(root: Path) -> None:
    file = _fingerprint(root, DAMAGED)
    file.write_bytes(file.read_bytes()[:1000])


def _delete(root: Path) -> None:
    _fingerprint(root, DAMAGED).unlink()


def _row_to_another_file(root: Path) -> None:
    with Store(root / "out" / "hubtrace.duckdb") as store:
        store.connection.execute("UPDATE fingerprints SET path = ? WHERE model_id = ?",
                                 [str(root / "hub" / DAMAGED / "config.json"), DAMAGED])


def _entries(root: Path) -> list[Path]:
    return sorted(p for p in index_folder(root / "out" / "hubtrace.duckdb").rglob("*") if p.is_file()
                  and p.parent.name == "entries")


def _damage_entries(root: Path) -> None:
    for entry in _entries(root):
        entry.write_bytes(entry.read_bytes()[: len(entry.read_bytes()) // 2])


def _manifest(root: Path) -> Path:
    return next(index_folder(root / "out" / "hubtrace.duckdb").rglob("manifest.json"))


def _garbage_manifest(root: Path) -> None:
    _manifest(root).write_text("{not json")


def _index_of_another_dimension(root: Path) -> None:
    """A valid faiss index of the wrong dimension, its manifest updated to match (what a bug or a tool could write):
    today a bare AssertionError on every run."""
    import faiss

    from scanner.retrieval.index import _sha256

    manifest = _manifest(root)
    index_file = manifest.parent / "index.faiss"
    wrong = faiss.IndexIDMap2(faiss.IndexFlatIP(7))
    data = json.loads(manifest.read_text())
    rows = sum(m["rows"] for m in data["models"])
    wrong.add_with_ids(np.ones((rows, 7), dtype=np.float32), np.arange(rows, dtype=np.int64))
    faiss.write_index(wrong, str(index_file))
    manifest.write_text(json.dumps({**data, "index_sha256": _sha256(index_file)}))


def _lose_the_index_folder(root: Path) -> None:
    shutil.rmtree(index_folder(root / "out" / "hubtrace.duckdb"))


def _delete_the_database(root: Path) -> None:
    """Start over the way a person does: delete the database, leave the folders beside it. Once, the retrieval
    folder then told the new database that every model had queried the index already: 0 pairs tested, no error."""
    db = root / "out" / "hubtrace.duckdb"
    db.unlink()
    db.with_name(db.name + ".wal").unlink(missing_ok=True)


def _entries_folder_unwritable(root: Path) -> None:
    """No entry can be written (a full or read-only disk; as root, a file where the folder was): once, every stored
    fingerprint was taken for damaged and the whole hub fingerprinted again."""
    entries = index_folder(root / "out" / "hubtrace.duckdb") / "entries"
    shutil.rmtree(entries)
    entries.write_text("not a folder")


DAMAGE: dict[str, Callable[[Path], None]] = {
    "fingerprint byte flipped": _flip_a_byte,
    "fingerprint byte flipped, index folder lost": lambda root: (_flip_a_byte(root), _lose_the_index_folder(root)),
    "fingerprint truncated": _truncate,
    "fingerprint file deleted": _delete,
    "fingerprints row names another file": _row_to_another_file,
    "retrieval entries truncated": _damage_entries,
    "retrieval entries truncated, fingerprint byte flipped": lambda root: (_damage_entries(root), _flip_a_byte(root)),
    "index manifest garbage": _garbage_manifest,
    "index of another dimension": _index_of_another_dimension,
    "index folder lost": _lose_the_index_folder,
    "retrieval entries folder unwritable": _entries_folder_unwritable,
    "database deleted, its folders left": _delete_the_database,
}
INDEX_DAMAGE = {"index manifest garbage", "index of another dimension", "index folder lost",
                "fingerprint byte flipped, index folder lost", "database deleted, its folders left"}
"""The cases whose index cannot be used as it is: the scan must rebuild it, and it must answer again."""


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_next_scan_survives_the_damage_and_loses_nothing(baseline: Path, tmp_path: Path, damage: str) -> None:
    root = _copy(baseline, tmp_path / "case")
    db = root / "out" / "hubtrace.duckdb"
    clean = _tests(db)
    DAMAGE[damage](root)
    summary = run_scan(scan_config(root / "hub", root / "out", pairs={"select": "candidates"}))
    ok = set(query(db, "SELECT model_id FROM current_models WHERE status = 'ok'")["model_id"].to_list())
    fingerprinted = set(query(db, "SELECT model_id FROM fingerprints")["model_id"].to_list())
    errors = query(db, "SELECT model_id, stage FROM scan_errors WHERE run_id = ?", [summary.run_id])
    named = set(errors["model_id"].to_list())
    for model in MODELS:  # fingerprinted (and so in the candidate stage), or named in this run's errors
        assert (model in ok and model in fingerprinted) or model in named, (damage, model, errors)
    after = _tests(db)  # the clean scan's answer: the same pairs tested, the same p-values
    assert after.keys() == clean.keys(), (damage, summary.retrieval, summary.pairs)
    for pair, log10_p in clean.items():
        assert after[pair] == pytest.approx(log10_p, rel=1e-6, abs=1e-9), (damage, pair)
    assert ("aurora-labs/aurora-base", "finch-nlp/aurora-chat") in after  # the family's pair is (still) tested
    if "fingerprint" in damage or "row" in damage:  # the damaged file was seen, said, and replaced in this run
        assert DAMAGED in named and DAMAGED in fingerprinted
        assert "store" in errors.filter(errors["model_id"] == DAMAGED)["stage"].to_list()
    if damage == "retrieval entries folder unwritable":  # recorded, and no sound fingerprint taken for damaged
        assert set(errors["stage"].to_list()) == {"retrieval"}
    if damage in INDEX_DAMAGE:  # rebuilt: every model queried it again, and it answers
        assert summary.retrieval["queried"] == len(MODELS), summary.retrieval
        assert "aurora-labs/aurora-base" in _similar(db, DAMAGED)
    if damage in INDEX_DAMAGE - {"index folder lost", "fingerprint byte flipped, index folder lost"}:
        assert summary.retrieval["rebuilt"], summary.retrieval  # and the scan said why
    if damage == "database deleted, its folders left":
        assert any("index written for another database" in why for why in summary.retrieval["rebuilt"].values())
        assert summary.fingerprinted == len(MODELS) and summary.pairs_tested == len(clean)


def _similar(db: Path, model_id: str) -> list[str]:
    """``hubtrace query --similar``'s answer: the index beside the database, asked without testing anything."""
    with Store(db, read_only=True) as store:
        return similar(store, db, model_id)["model_id"].to_list()


def test_similar_on_an_unusable_index_says_so_instead_of_an_empty_table(baseline: Path, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from jobs.cli import EXIT_REFUSED, app

    root = _copy(baseline, tmp_path / "case")
    _index_of_another_dimension(root)
    result = CliRunner().invoke(app, ["query", "--db", str(root / "out" / "hubtrace.duckdb"), "--similar", DAMAGED])
    assert result.exit_code == EXIT_REFUSED, result.output
    assert "cannot be used (index of dimension 7" in result.stderr and result.stderr.count("\n") == 1


def test_without_retrieval_a_damaged_fingerprint_fails_its_pairs_once_and_is_made_again(
    baseline: Path, tmp_path: Path
) -> None:
    """``pairs.select: all`` reads fingerprints only in the pair tasks: the damaged file fails its pairs with a
    FingerprintError row, its row is forgotten, and the following scan fingerprints it anew and tests them."""
    root = _copy(baseline, tmp_path / "case")
    db = root / "out" / "hubtrace.duckdb"
    _flip_a_byte(root)
    first = run_scan(scan_config(root / "hub", root / "out"))  # select: all; the one untested pair involves it
    errors = query(db, "SELECT model_id, stage, error_type FROM scan_errors WHERE run_id = ?", [first.run_id])
    assert DAMAGED in errors["model_id"].to_list() and "FingerprintError" in errors["error_type"].to_list()
    assert DAMAGED not in query(db, "SELECT model_id FROM fingerprints")["model_id"].to_list()
    second = run_scan(scan_config(root / "hub", root / "out"))
    assert second.fingerprinted == 1 and second.pairs_failed == 0
    tested = query(db, "SELECT model_a, model_b FROM current_pair_tests")
    models = set(tested["model_a"].to_list()) | set(tested["model_b"].to_list())
    assert DAMAGED in models and len(tested) == len(MODELS) * (len(MODELS) - 1) // 2


def test_a_scan_that_tests_nothing_while_pairs_are_untested_says_so(baseline: Path, tmp_path: Path) -> None:
    """New models, and no pair chosen (a min score no pair reaches; no card declares a base): once, such a run
    looked like a success. It must say so in its summary and in scan_runs; a rerun with nothing new counts them."""
    models = ("aurora-labs/aurora-base", "nimbus/nimbus-1", "ember-ml/ember-small")
    for model in models:
        shutil.copytree(baseline / "hub" / model, tmp_path / "hub" / model, ignore=shutil.ignore_patterns("README.md"))
    config = scan_config(tmp_path / "hub", tmp_path / "out", pairs={"select": "candidates", "min_score": 10**6})
    first = run_scan(config)
    assert first.pairs_tested == 0 and first.pairs["untested_comparable"] == 3
    assert first.warnings == ["no pair tested, though 3 comparable pairs have none and 3 revisions were "
                              "fingerprinted in this run: candidate retrieval chose none of them (3 revisions "
                              "queried the index, min score 1000000)"]
    stored = json.loads(query(config.db_path, "SELECT summary FROM scan_runs WHERE run_id = ?",
                              [first.run_id])["summary"][0])
    assert stored["warnings"] == first.warnings and stored["pairs"]["untested_comparable"] == 3
    again = run_scan(config)  # nothing new: testing nothing is what it should do, and it still counts them
    assert again.warnings == [] and again.pairs["untested_comparable"] == 3
