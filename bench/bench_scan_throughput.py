"""Scan throughput on a hub of >= 100 models: models fingerprinted per minute and pairs tested per minute.

The hub is the 16-model zoo plus fine-tune-like variants of each zoo model: every weight tensor gets seeded
Gaussian noise of ``--noise`` times its own standard deviation (default 1e-3, the size of a short fine-tune's
drift), written as a new ``org/name`` folder with the parent's config and a card naming the parent. Building it
takes seconds (no training). The scan is the real one (local Ray, CPU actors, a fresh DuckDB file); the baseline
is the same work done one model and one pair at a time in this process, without Ray, so the printed ratio is
what the Ray pool buys on this machine after its overheads.

    python bench/bench_scan_throughput.py [--variants 6] [--baseline-models 8] [--baseline-pairs 200]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from jobs.actors import PairJob, compare_batch, fingerprint_record
from jobs.config import ScanConfig
from jobs.scan_job import run_scan
from scanner.fingerprints.inputs import InputSpec
from scanner.fingerprints.store import FingerprintStore
from scanner.sources import ModelRecord, discover_local
from scanner.zoo import build_zoo

ZOO_DIR = Path(".hubtrace-cache/zoo")


def build_bench_hub(root: Path, variants: int, noise: float) -> int:
    """The zoo plus ``variants`` noisy copies of every zoo model under ``root``; returns the model count."""
    zoo = build_zoo(ZOO_DIR)
    count = 0
    for model_id in zoo.ids:
        source = zoo[model_id].path
        shutil.copytree(source, root / model_id)
        count += 1
        weights = load_file(str(source / "model.safetensors"))
        for k in range(variants):
            org, name = model_id.split("/")
            target = root / f"{org}-ft{k}" / name
            target.mkdir(parents=True)
            shutil.copy(source / "config.json", target / "config.json")
            (target / "README.md").write_text(f"---\nbase_model: {model_id}\nbase_model_relation: finetune\n---\n")
            rng = np.random.default_rng([k, count])
            save_file({name: (w + rng.standard_normal(w.shape).astype(w.dtype) * noise * float(w.std())).astype(w.dtype)
                       for name, w in weights.items()}, str(target / "model.safetensors"))
            count += 1
    return count


def baseline(root: Path, work: Path, n_models: int, n_pairs: int) -> tuple[float, float]:
    """Sequential in-process models/min and pairs/min (no Ray)."""
    records = [r for r in discover_local(root) if isinstance(r, ModelRecord)][:n_models]
    started = time.perf_counter()
    store = FingerprintStore(work / "fingerprints")
    outcomes = [fingerprint_record(r, store, InputSpec()) for r in records]
    models_per_min = len(records) / (time.perf_counter() - started) * 60
    done = [o for o in outcomes if o.error is None]
    jobs = [PairJob(a.record.model_id, a.record.revision, a.path, b.record.model_id, b.record.revision, b.path,
                    a.meta.input_set, "comparable")
            for i, a in enumerate(done) for b in done[i + 1:]]
    jobs = (jobs * (n_pairs // max(1, len(jobs)) + 1))[:n_pairs]
    started = time.perf_counter()
    for job in jobs:
        compare_batch([job], "match")  # one pair per call: no fingerprint reuse across pairs
    return models_per_min, len(jobs) / (time.perf_counter() - started) * 60


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", type=int, default=6, help="noisy copies per zoo model (16 x (1 + 6) = 112)")
    parser.add_argument("--noise", type=float, default=1e-3)
    parser.add_argument("--baseline-models", type=int, default=8)
    parser.add_argument("--baseline-pairs", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hubtrace-bench-") as tmp:
        root, work = Path(tmp) / "hub", Path(tmp) / "work"
        n = build_bench_hub(root, args.variants, args.noise)
        base_models, base_pairs = baseline(root, work, args.baseline_models, args.baseline_pairs)
        config = ScanConfig.model_validate({"sources": [{"kind": "local", "path": str(root)}],
                                            "output_dir": str(Path(tmp) / "out"), "devices": {"mode": "cpu"},
                                            "pairs": {"batch_size": 64}, "exports": []})
        summary = run_scan(config)
        fp_s, pair_s = summary.stage_seconds["fingerprint"], summary.stage_seconds["pairs"]
        models_per_min = summary.fingerprinted / fp_s * 60
        pairs_per_min = summary.pairs_tested / pair_s * 60
        print(f"hub: {n} models ({args.variants} noisy variants of each zoo model), {summary.actors} "
              f"{summary.device} actors")
        print(f"scan: {summary.fingerprinted} fingerprinted in {fp_s:.1f} s = {models_per_min:.0f} models/min; "
              f"{summary.pairs_tested} pairs in {pair_s:.1f} s = {pairs_per_min:.0f} pairs/min; "
              f"lineage {summary.stage_seconds['lineage']:.1f} s; total {summary.seconds:.1f} s; "
              f"failed {summary.failed}")
        print(f"baseline, one at a time in-process: {base_models:.0f} models/min, {base_pairs:.0f} pairs/min")
        print(
            f"ratio scan/baseline: models {models_per_min / base_models:.2f}x, "
            f"pairs {pairs_per_min / base_pairs:.2f}x"
        )


if __name__ == "__main__":
    main()
