"""The scan's backfill of ``model_tensors`` reads each fingerprint header once, also when it holds no hashes.

A real Store (DuckDB file), real fingerprint files, and a spy that counts calls to the real header reader."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pytest

import scanner.retrieval.scan as retrieval_scan
from scanner.fingerprints.fingerprint import write_fingerprint
from scanner.store import Store
from tests.synthetic_fingerprints import template_fingerprint


@dataclass(frozen=True)
class Scanned:
    model_id: str
    revision: str
    input_set: str
    path: str
    declared_base_models: tuple[str, ...] = ()


def test_backfill_reads_each_header_once_even_without_hashes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fingerprint = template_fingerprint(tmp_path / "template", 16)
    assert fingerprint.meta.tensor_hashes, "the template's validation pass hashed its tensors"
    hashed, bare = tmp_path / "hashed.fp.safetensors", tmp_path / "bare.fp.safetensors"
    write_fingerprint(fingerprint, hashed)
    write_fingerprint(dataclasses.replace(fingerprint, meta=dataclasses.replace(fingerprint.meta, tensor_hashes={})),
                      bare)
    models = [Scanned("org/hashed", "r1", "s", str(hashed)), Scanned("org/bare", "r1", "s", str(bare))]
    reads: list[str] = []
    real_reader = retrieval_scan.read_fingerprint_meta_at

    def spy(address):  # noqa: ANN001, ANN202
        reads.append(str(address))
        return real_reader(address)

    monkeypatch.setattr(retrieval_scan, "read_fingerprint_meta_at", spy)
    with Store(tmp_path / "scan.duckdb") as store:
        assert retrieval_scan.backfill_tensor_hashes(store, models) == {("org/hashed", "r1")}
        assert sorted(reads) == sorted([str(hashed), str(bare)])
        assert store.revisions_with_tensor_hashes() == {("org/hashed", "r1")}
    reads.clear()
    with Store(tmp_path / "scan.duckdb") as store:   # the next scan: a fresh connection to the same file
        assert retrieval_scan.backfill_tensor_hashes(store, models) == set()
        assert reads == [], "a header already read, with or without hashes, is not read again"
        newer = Scanned("org/bare", "r2", "s", str(bare))   # a new revision is a new header
        retrieval_scan.backfill_tensor_hashes(store, [*models, newer])
        assert reads == [str(bare)]
