"""Scan wall time of a >= 100-model hub on 1, 2 and 3 raylets of a real multi-node Ray cluster on this machine.

The raylets share this machine's cores, so the point is correctness and the overhead of spreading a scan over
nodes, not speed-up. The hub is bench_scan_throughput's (the 16 zoo models plus noisy fine-tune-like variants
of each: 112 models, 6216 pairs by default). Each run is a fresh `ray.cluster_utils.Cluster`: a head without
CPUs (the driver and the DuckDB file) and N worker raylets with ``--cpus`` logical CPUs in all, split evenly
(at least one each), one actor per CPU; the fingerprint store is a local folder declared shared (every raylet is
on this machine), or, with ``--s3``, a moto S3 server started here. Every pair is tested (``pairs.select: all``).
Each run is checked, not only timed: every model has one fingerprint row whose address is one object (file) in
the store and nothing else is there, every pair has one test row, and no stage failed; the load average before
and after each run is printed (the machine is shared).

    python bench/bench_cluster_scan.py [--nodes 1 2 3] [--variants 6] [--cpus 2] [--s3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from itertools import combinations
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_scan_throughput import build_bench_hub  # noqa: E402

from jobs.config import ScanConfig  # noqa: E402
from jobs.scan_job import run_scan  # noqa: E402
from scanner.fingerprints.store import FingerprintStore  # noqa: E402
from scanner.store import Store  # noqa: E402
from tests.s3_support import environment, make_bucket, s3_server  # noqa: E402


def scan_on(nodes: int, cpus: int, hub: Path, out: Path, store: str) -> tuple[float, object]:
    per_node = max(1, cpus // nodes)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    for i in range(nodes):
        cluster.add_node(num_cpus=per_node, resources={f"raylet{i}": 1})
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    try:
        config = ScanConfig.model_validate({
            "sources": [{"kind": "local", "path": str(hub)}], "output_dir": str(out), "fingerprint_store": store,
            "fingerprint_store_shared": True, "devices": {"mode": "cpu"}, "pairs": {"batch_size": 64, "select": "all"},
            "exports": []})
        summary = run_scan(config)
    finally:
        ray.shutdown()
        cluster.shutdown()
    check_stored_once(config.db_path, store, summary)
    return summary.seconds, summary


def check_stored_once(db: Path, location: str, summary) -> None:
    """Every model stored once (one row, one object, nothing else in the store), every pair tested once."""
    with Store(db, read_only=True) as store:
        fingerprints = store.query("SELECT model_id, path FROM fingerprints")
        pairs = store.query("SELECT model_a, model_b FROM pair_tests")
    models = sorted(fingerprints["model_id"])
    in_store = FingerprintStore(location).existing()
    problems = []
    if len(set(models)) != len(models) or len(models) != summary.models:
        problems.append(f"{len(models)} fingerprint rows for {summary.models} models")
    if set(fingerprints["path"]) != in_store or len(in_store) != len(models):
        problems.append(f"{len(in_store)} objects in the store for {len(models)} rows")
    expected = {tuple(sorted(p)) for p in combinations(models, 2)}
    if pairs.height != len(expected) or set(pairs.iter_rows()) != expected:
        problems.append(f"{pairs.height} pair rows for {len(expected)} pairs")
    if summary.failed or summary.pairs_failed:
        problems.append(f"{summary.failed} models and {summary.pairs_failed} pairs failed")
    if problems:
        raise SystemExit(f"run stored wrongly: {'; '.join(problems)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--variants", type=int, default=6)
    parser.add_argument("--noise", type=float, default=1e-3)
    parser.add_argument("--cpus", type=int, default=os.cpu_count())
    parser.add_argument("--s3", action="store_true", help="fingerprints in a moto S3 server instead of a folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hubtrace-bench-") as tmp, contextlib.ExitStack() as stack:
        hub = Path(tmp) / "hub"
        n = build_bench_hub(hub, args.variants, args.noise)
        if args.s3:
            stack.enter_context(environment(stack.enter_context(s3_server())))
            make_bucket("bench")
        print(f"# hub: {n} models, {n * (n - 1) // 2} pairs; {os.cpu_count()} cores; {args.cpus} logical CPUs "
              f"split over the raylets; fingerprints in {'moto S3' if args.s3 else 'a shared local folder'}")
        print("| raylets | actors | fingerprint s | pairs s | lineage s | wall s | fingerprinted | pairs tested "
              "| failed | load before/after |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for nodes in args.nodes:
            store = f"s3://bench/run{nodes}" if args.s3 else str(Path(tmp) / f"fp{nodes}")
            load_before = os.getloadavg()[0]
            seconds, s = scan_on(nodes, args.cpus, hub, Path(tmp) / f"out{nodes}", store)
            st = s.stage_seconds
            print(f"| {nodes} | {s.actors} | {st['fingerprint']:.1f} | {st['pairs']:.1f} | {st['lineage']:.1f} | "
                  f"{seconds:.1f} | {s.fingerprinted}/{n} | {s.pairs_tested}/{n * (n - 1) // 2} | {s.failed} | "
                  f"{load_before:.1f}/{os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
