"""Helpers shared by the scan tests: a small hub folder cut from the zoo, a scan config, table reads."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import polars as pl

from jobs.config import ScanConfig
from scanner.store import Store
from scanner.zoo import Zoo

#: A family (base, fine-tune, camouflaged copy of the fine-tune, depth prune), the independent twin, and a base
#: whose card falsely declares aurora-base: 15 pairs, 6 of them dependent.
SUBSET = ("aurora-labs/aurora-base", "finch-nlp/aurora-chat", "nimbus/nimbus-1", "kestrel/aurora-lite",
          "tundra-research/tundra-64", "ember-ml/ember-small")


def copy_models(zoo: Zoo, ids: tuple[str, ...], root: Path) -> Path:
    """Copy these zoo models into ``root/<org>/<name>/`` (a folder tree laid out like the Hub)."""
    for model_id in ids:
        shutil.copytree(zoo[model_id].path, root / model_id)
    return root


def scan_config(hub: Path, out: Path, **overrides) -> ScanConfig:
    """A scan of ``hub`` into ``out`` with the demo settings, small batches so there are several stores, every
    comparable pair tested (``pairs.select: all``; tests/test_retrieval_scan.py scans with candidates)."""
    data = {"sources": [{"kind": "local", "path": str(hub)}], "output_dir": str(out),
            "pairs": {"batch_size": 2, "select": "all"}, "ray": {"actors": 2, "max_in_flight": 4},
            "devices": {"mode": "cpu"},
            "exports": ["json"]}
    for key, value in overrides.items():  # a section given in part keeps the defaults above for the rest
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return ScanConfig.model_validate(data)


def query(db: Path, sql: str, params: list | None = None) -> pl.DataFrame:
    """A read-only look at the scan database (only when no scan holds it open)."""
    with Store(db, read_only=True) as store:
        return store.query(sql, params)


def scan_subset(zoo: Zoo, models: tuple[str, ...], root: Path) -> Path:
    """These zoo models as a finished scan leaves them (scan_folder on a copy of them under ``root/hub``)."""
    return scan_folder(copy_models(zoo, models, root / "hub"), root)


def scan_folder(hub: Path, root: Path) -> Path:
    """The models of the hub folder ``hub`` as a finished scan leaves them (models, fingerprint files, every pair's
    test with every block compared, the block maps made with them, the lineage rebuilt, the exports written), by the
    scan's own discovery, fingerprinting, pair task, storing, planning and lineage steps, its output under
    ``root/out``; the pair task run in this process (as a Ray task it would start Ray). Returns the database."""
    from rich.console import Console

    from jobs.actors import compare_batch, fingerprint_record
    from jobs.scan_job import ScanObserver, _Scan, discover
    from scanner.fingerprints.store import FingerprintStore

    config = scan_config(hub, root / "out")
    config.db_path.parent.mkdir(parents=True)
    with Store(config.db_path) as store:
        fingerprints = FingerprintStore(config.fingerprint_location)
        scan = _Scan(config, store, fingerprints, ScanObserver(), Console(file=io.StringIO()))
        for record in discover(config):
            outcome = fingerprint_record(record, fingerprints, config.inputs.spec())
            assert outcome.error is None, outcome.error
            scan._store_fingerprint(outcome)
        jobs = scan.plan().jobs
        scan._store_pair_outcomes(compare_batch(jobs, config.statistic), 0, len(jobs))
        scan.lineage_stage()
        store.finish_run(scan.run_id, "succeeded", scan.summary.to_json_dict())
    return config.db_path
