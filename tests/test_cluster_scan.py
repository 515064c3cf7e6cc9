"""A scan on a real multi-node Ray cluster on this machine (a head and three worker raylets with distinct
resources, `ray.cluster_utils.Cluster`), fingerprints in a real S3-compatible server (moto) that every node
reaches through the AWS_* environment, and worker nodes killed mid-scan: one while it fingerprints, one while
pairs are tested. Nothing is lost or duplicated: the killed nodes' models and pairs finish on the others.
"""

from __future__ import annotations

import json
import time
from itertools import combinations

import fsspec
import pytest
import ray
from ray.cluster_utils import Cluster

from jobs.actors import PairJob, compare_batch_task
from jobs.cluster import StoreProbe
from jobs.config import ConfigError
from jobs.pool import FingerprintPool
from jobs.scan_job import ScanObserver, run_scan
from scanner.sources import ModelRecord
from tests.ray_support import ray_for_tests
from tests.s3_support import make_bucket
from tests.scan_support import SUBSET, copy_models, query, scan_config

BUCKET = "hubtrace-cluster"
#: A base, its fine-tune, a camouflaged copy of the fine-tune and a depth prune: 6 pairs, all dependent.
MODELS = SUBSET[:4]
#: Node deaths are noticed within ~2 s instead of Ray's default ~30 s.
FAST_HEALTH_CHECKS = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}


@pytest.fixture(scope="module")
def cluster(s3_env):
    """Head without CPUs (the driver only), three one-CPU worker nodes, each with its own resource label."""
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "resources": {"head": 1}, "include_dashboard": False, "_system_config": FAST_HEALTH_CHECKS})
    workers = [cluster.add_node(num_cpus=1, resources={f"worker{i}": 1}) for i in range(3)]
    try:
        with ray_for_tests(address=cluster.address):
            cluster.wait_for_nodes()
            yield cluster, workers
    finally:
        cluster.shutdown()


class _KillNodes(ScanObserver):
    """Removes (kills) the worker node of a busy fingerprinting actor, then, after the first stored pair batch,
    another worker node while pair tasks run on it."""

    def __init__(self, cluster: Cluster, workers: list) -> None:
        self.cluster, self.alive = cluster, list(workers)
        self.killed_fingerprinting: tuple[str, str] | None = None   # (node id, model id)
        self.killed_in_pairs: str | None = None

    def _kill(self, node_id: str) -> None:
        node = next(n for n in self.alive if n.node_id == node_id)
        self.alive.remove(node)
        self.cluster.remove_node(node, allow_graceful=False)

    def on_fingerprint_submitted(self, pool: FingerprintPool, record: ModelRecord) -> None:
        if self.killed_fingerprinting:
            return
        for status in ray.get([a.status.remote() for a in pool.actors]):
            if status.current is not None:
                self._kill(status.node_id)
                self.killed_fingerprinting = (status.node_id, status.current)
                return

    def on_pairs_stored(self, stored: int, total: int) -> None:
        if self.killed_in_pairs is None and stored < total and len(self.alive) > 1:
            self.killed_in_pairs = self.alive[0].node_id
            self._kill(self.killed_in_pairs)


def test_a_local_store_is_refused_at_start_on_a_multi_node_cluster(cluster, zoo, tmp_path):
    config = scan_config(copy_models(zoo, SUBSET[:2], tmp_path / "hub"), tmp_path / "out")
    with pytest.raises(ConfigError, match="fingerprint_store .* is a local path, but the Ray cluster has 4 nodes"):
        run_scan(config)
    assert not (tmp_path / "out").exists()  # refused before any work or any file


def test_nodes_killed_mid_scan_lose_and_duplicate_nothing(cluster, zoo, tmp_path):
    ray_cluster, workers = cluster
    make_bucket(BUCKET)
    location = f"s3://{BUCKET}/scans/test"
    root = copy_models(zoo, MODELS, tmp_path / "hub")
    config = scan_config(root, tmp_path / "out", fingerprint_store=location, pairs={"batch_size": 1},
                         ray={"actors": 2, "max_in_flight": 2})
    killer = _KillNodes(ray_cluster, workers)
    summary = run_scan(config, observer=killer)

    assert killer.killed_fingerprinting is not None, "no actor was caught mid-fingerprint"
    assert killer.killed_in_pairs is not None
    assert (summary.fingerprinted, summary.failed, summary.pairs_failed) == (len(MODELS), 0, 0)
    db = config.db_path
    fingerprints = query(db, "SELECT model_id, path FROM fingerprints")
    assert sorted(fingerprints["model_id"]) == sorted(MODELS)
    fs, _ = fsspec.core.url_to_fs(location)
    fs.invalidate_cache()
    in_bucket = {fs.unstrip_protocol(p) for p in fs.find(f"{BUCKET}/scans/test") if p.endswith(".safetensors")}
    assert set(fingerprints["path"]) == in_bucket  # one object per model, every address in the DB is in S3
    owner = json.loads(fs.cat_file(f"{BUCKET}/scans/test/hubtrace-database.json"))  # and whose store it is
    assert owner["database_id"] == query(db, "SELECT database_id FROM database_identity")["database_id"][0]
    assert all(p.startswith(f"{location}/") for p in in_bucket)
    assert query(db, "SELECT count(*) AS n FROM scan_errors")["n"][0] == 0

    tests = query(db, "SELECT model_a, model_b, log10_p FROM pair_tests")
    assert tests.height == len(MODELS) * (len(MODELS) - 1) // 2
    assert {(a, b) for a, b, _ in tests.iter_rows()} == {tuple(sorted(p)) for p in combinations(MODELS, 2)}
    by_pair = {(a, b): p for a, b, p in tests.iter_rows()}
    assert by_pair[("aurora-labs/aurora-base", "finch-nlp/aurora-chat")] <= -20  # a real result, not a placeholder
    killed = {killer.killed_fingerprinting[0], killer.killed_in_pairs}
    deadline = time.monotonic() + 60  # the GCS marks a killed raylet dead after its heartbeats time out
    while killed & _alive_nodes() and time.monotonic() < deadline:
        time.sleep(1)
    assert not killed & _alive_nodes()  # the head and one surviving worker did the rest
    assert len(_alive_nodes()) == 2


def test_a_node_that_cannot_write_to_the_store_is_refused_at_start(cluster, tmp_path):
    """A worker node started with another S3 endpoint (nothing listens there): one refusal naming that node,
    before any work or any database file."""
    ray_cluster, _ = cluster
    bucket = f"{BUCKET}-probe"
    make_bucket(bucket)
    bad = ray_cluster.add_node(num_cpus=1, resources={"no_store": 1},
                               env_vars={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"})
    ray_cluster.wait_for_nodes()
    try:
        (tmp_path / "hub").mkdir()
        config = scan_config(tmp_path / "hub", tmp_path / "out", fingerprint_store=f"s3://{bucket}/probe")
        with pytest.raises(ConfigError, match=f"s3://{bucket}/probe is not writable from 1 of ") as refused:
            run_scan(config)
        assert bad.node_id[:12] in str(refused.value) and "\n" not in str(refused.value)
        assert not config.db_path.exists()
    finally:
        ray_cluster.remove_node(bad)


def _alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def test_a_node_that_joins_later_probes_the_store_on_first_use(cluster, tmp_path):
    """Raylets added after the start probe: on one that cannot reach the store (another endpoint), the real pair
    task returns a ``store`` error for each pair of its batch, naming the node, the probe runs once for the node
    (its answer is a file the node's later tasks read); on a late node that can reach the store, the probe passes.
    (Fingerprint actors call the same check, `jobs.actors._unreachable_store`; an actor is not started here: its
    torch import would double this test's time.) Called through
    the real task on the real nodes, not through a whole scan: which node a scan's tasks land on is Ray's choice."""
    ray_cluster, _ = cluster
    bucket = f"{BUCKET}-late"
    make_bucket(bucket)
    location = f"s3://{bucket}/late"
    probe = StoreProbe(location, "scan-late", frozenset(_alive_nodes()), folder=str(tmp_path / "probes"))
    bad = ray_cluster.add_node(num_cpus=1, resources={"late_bad": 1},
                               env_vars={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"})
    good = ray_cluster.add_node(num_cpus=1, resources={"late_good": 1})
    ray_cluster.wait_for_nodes()
    job = PairJob("org/a", "r", f"{location}/org/a/r/s.safetensors", "org/b", "r", f"{location}/org/b/r/s.safetensors",
                  "s", "comparable")
    try:
        on_bad = compare_batch_task.options(num_cpus=0, resources={"late_bad": 1})
        first, second = ray.get([on_bad.remote([job, job], "match", probe=probe) for _ in range(2)])
        for outcome in first + second:
            assert outcome.error is not None and outcome.error.stage == "store"
            assert f"node {bad.node_id[:12]} joined after the scan started" in outcome.error.reason
            assert location in outcome.error.reason and "\n" not in outcome.error.reason
        answers = sorted(p for p in (tmp_path / "probes").iterdir() if not p.name.endswith(".lock"))
        assert len(answers) == 1 and answers[0].read_text()  # one probe for the node, its failure kept

        on_good = compare_batch_task.options(num_cpus=0, resources={"late_good": 1})
        outcome, = ray.get(on_good.remote([job], "match", probe=probe))
        assert outcome.error is not None and outcome.error.stage == "compare"  # past the probe: the pair is missing
        assert "does not exist" in outcome.error.reason
        answers = sorted(p for p in (tmp_path / "probes").iterdir() if not p.name.endswith(".lock"))
        assert len(answers) == 2 and "" in {p.read_text() for p in answers}
    finally:
        ray_cluster.remove_node(bad)
        ray_cluster.remove_node(good)
