"""The scan job end to end with real Ray and a real DuckDB file: broken models, incremental reruns, a worker
SIGKILLed mid-fingerprint, the driver SIGKILLed mid-scan, and a Hub source served over HTTP by the fake Hub.

The checks on p-values are deterministic (fixed canonical inputs, fixed zoo); the zoo's weakest dependent pair
measures log10 p = -52 against the -20 asserted here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from itertools import combinations
from pathlib import Path

import pytest
import ray
import yaml

from jobs.pool import FingerprintPool, WorkersNotStartedError
from jobs.scan_job import ScanObserver, run_scan
from scanner.sources import ModelRecord
from scanner.store import Store, queries
from tests.fixtures.broken import build_broken_corpus
from tests.fixtures.fake_hub import FakeHub
from tests.ray_support import ray_for_tests
from tests.scan_support import SUBSET, copy_models, query, scan_config

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the in-process scans of this module (the scans join it instead of starting their own).

    Its two GPUs are logical (Ray schedules them; there is no CUDA here): scans with ``devices.mode: auto`` get
    GPU actors that must still fall back to the CPU instead of waiting forever.
    """
    with ray_for_tests(address="local", num_cpus=2, num_gpus=2, include_dashboard=False):
        yield


@pytest.fixture(scope="module")
def hub(zoo, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """The zoo subset plus the broken corpus, side by side in one org/name tree."""
    root = copy_models(zoo, SUBSET, tmp_path_factory.mktemp("hub"))
    broken = build_broken_corpus(root, zoo["aurora-labs/aurora-base"].path)
    return root, broken


@pytest.fixture(scope="module")
def first_scan(hub, local_ray, tmp_path_factory):
    root, _broken = hub
    config = scan_config(root, tmp_path_factory.mktemp("out"))
    return config, run_scan(config)


def test_scan_fingerprints_every_good_model_and_records_each_broken_one_once(first_scan, hub, zoo):
    config, summary = first_scan
    _root, broken = hub
    db = config.db_path
    assert summary.fingerprinted == len(SUBSET)
    assert summary.failed == len(broken)

    errors = query(db, "SELECT model_id, stage, reason FROM scan_errors WHERE run_id = ?", [summary.run_id])
    assert sorted(errors["model_id"]) == sorted(broken), "exactly one scan_errors row per broken model"
    for model_id, stage, reason in errors.iter_rows():
        assert broken[model_id].lower() in reason.lower(), (model_id, stage, reason)

    fingerprints = query(db, "SELECT model_id, path FROM fingerprints")
    assert sorted(fingerprints["model_id"]) == sorted(SUBSET)
    assert all(Path(p).is_file() and Path(p).is_relative_to(Path(config.fingerprint_location).resolve())
               for p in fingerprints["path"])
    ok = query(db, "SELECT model_id FROM current_models WHERE status = 'ok'")
    assert sorted(ok["model_id"]) == sorted(SUBSET)

    tests = query(db, "SELECT model_a, model_b, log10_p, reason, n_layers FROM current_pair_tests")
    expected = {tuple(sorted(p)) for p in combinations(SUBSET, 2)}
    assert {(a, b) for a, b, *_ in tests.iter_rows()} == expected
    assert tests.height == len(expected) == summary.pairs_tested
    for a, b, log10_p, _reason, n_layers in tests.iter_rows():
        if zoo.dependent(a, b):
            assert log10_p <= -20, (a, b, log10_p)
        assert n_layers >= 3
    declared = tests.filter(tests["reason"] == "declared_base")
    assert {(a, b) for a, b, *_ in declared.iter_rows()} == {("aurora-labs/aurora-base", "ember-ml/ember-small"),
                                                            ("aurora-labs/aurora-base", "finch-nlp/aurora-chat")}

    run = query(db, "SELECT status FROM scan_runs WHERE run_id = ?", [summary.run_id])
    assert run["status"].to_list() == ["succeeded"]
    family = next(m for m in summary.families.values() if "aurora-labs/aurora-base" in m)
    assert {"finch-nlp/aurora-chat", "nimbus/nimbus-1", "kestrel/aurora-lite"} <= set(family)
    assert "tundra-research/tundra-64" not in family
    assert Path(summary.exports["json"]).is_file()


def test_block_maps_are_made_with_the_pair_tests_and_the_lineage_only_reads_them(first_scan, tmp_path, monkeypatch):
    """The depth prune kestrel/aurora-lite (3 of its base's 4 blocks) is related to three models of the subset: each
    pair's any-order block map is stored with its test (made on the pair workers) and reads as a prune; rebuilding
    the lineage from the stored tables matches no unit (every way to a matching refuses here) and still casts the
    maps' direction votes."""
    from lineage_graph.block_maps import reading
    from lineage_graph.persist import rebuild_lineage
    from scanner.pairs import block_map as pair_block_map
    from scanner.pairs import localize
    from scanner.stats import independence, matching

    config, _summary = first_scan
    lite, base = "kestrel/aurora-lite", "aurora-labs/aurora-base"
    maps = query(config.db_path, "SELECT model_a, model_b, pairs FROM block_maps")
    relatives = (base, "finch-nlp/aurora-chat", "nimbus/nimbus-1")
    assert {(a, b) for a, b, _ in maps.iter_rows()} == {tuple(sorted((lite, m))) for m in relatives}
    for _a, _b, text in maps.iter_rows():
        links = pair_block_map.decoded(text)
        assert reading(links, 3, 4) == "prune", links
        assert sorted(link.shallow for link in links) == [0, 1, 2]

    def refuse(*_args, **_kwargs):
        raise AssertionError("the lineage stage matched units")

    for module, name in ((localize, "localize"), (pair_block_map, "localize"), (pair_block_map, "any_order_map"),
                         (matching, "match_similarity"), (independence, "match_for"), (localize, "match_similarity")):
        monkeypatch.setattr(module, name, refuse)
    copy = tmp_path / "scan.duckdb"
    copy.write_bytes(config.db_path.read_bytes())
    with Store(copy) as store:
        lineage = rebuild_lineage(store)
    edge = next(e for e in lineage.edges if e.pair == (base, lite))
    assert edge.direction.parent == base and any(r.startswith("block_map:") for r in edge.direction.reasons)


def test_rerun_is_incremental_and_a_new_revision_supersedes_its_old_tests(first_scan, hub):
    config, first = first_scan
    root, broken = hub
    db = config.db_path
    again = run_scan(config)
    assert (again.fingerprinted, again.pairs_tested) == (0, 0)
    # the good models are skipped; every broken one fails again visibly (not retried: its files are unchanged)
    assert dict(again.failures) == dict(first.failures) and again.failed == len(broken)
    assert again.skipped == len(SUBSET)
    assert again.not_retried == len(broken) - first.failures["discover"]
    errors = query(db, "SELECT model_id, stage, reason FROM scan_errors WHERE run_id = ?", [again.run_id])
    before = query(db, "SELECT model_id, stage, reason FROM scan_errors WHERE run_id = ?", [first.run_id])
    assert sorted(errors.iter_rows()) == sorted(before.iter_rows())
    with Store(db, read_only=True) as store:  # what `hubtrace query --errors` prints: each one seen before
        listed = queries.run_errors(store, again.run_id)
    assert sorted(listed["model_id"]) == sorted(broken) and not any(listed["new"])
    assert set(query(db, "SELECT DISTINCT run_id FROM fingerprints")["run_id"]) == {first.run_id}
    assert set(query(db, "SELECT DISTINCT run_id FROM pair_tests")["run_id"]) == {first.run_id}

    changed = "finch-nlp/aurora-chat"
    weights = root / changed / "model.safetensors"
    stat = weights.stat()
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # same bytes, new local revision
    third = run_scan(config)
    assert third.fingerprinted == 1 and third.failures == again.failures
    refreshed = query(db, "SELECT model_id FROM fingerprints WHERE run_id = ?", [third.run_id])
    assert refreshed["model_id"].to_list() == [changed]
    assert third.pairs_tested == len(SUBSET) - 1
    new = query(db, "SELECT model_a, model_b FROM pair_tests WHERE run_id = ?", [third.run_id])
    assert all(changed in (a, b) for a, b in new.iter_rows())
    superseded = query(db, "SELECT model_a, model_b FROM pair_tests WHERE superseded")
    assert superseded.height == len(SUBSET) - 1 and all(changed in (a, b) for a, b in superseded.iter_rows())
    current = query(db, "SELECT count(*) AS n FROM current_pair_tests")["n"][0]
    assert current == len(SUBSET) * (len(SUBSET) - 1) // 2
    statuses = query(db, "SELECT status FROM models WHERE model_id = ? ORDER BY last_seen_run", [changed])
    assert sorted(statuses["status"]) == ["ok", "superseded"]


class _KillFirstBusyWorker(ScanObserver):
    """SIGKILLs the first worker process it sees fingerprinting a model, once.

    Each actor is polled on its own (an actor still importing torch answers late and must not hold up the others),
    and the watch at a submission ends only when every model submitted so far is done: no model is fingerprinted
    unwatched, so on any machine the kill lands while a model is in a worker.
    """

    def __init__(self) -> None:
        self.killed: tuple[int, str] | None = None
        self.submitted = 0

    def on_fingerprint_submitted(self, pool: FingerprintPool, record: ModelRecord) -> None:
        self.submitted += 1
        if self.killed:
            return
        asked = [actor.status.remote() for actor in pool.actors]
        done: dict[int, int] = {}
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ready, _ = ray.wait(asked, num_returns=1, timeout=0.05)
            for ref in ready:
                index = asked.index(ref)
                status = ray.get(ref)
                if status.current is not None:
                    os.kill(status.pid, signal.SIGKILL)
                    self.killed = (status.pid, status.current)
                    return
                done[index] = status.done
                asked[index] = pool.actors[index].status.remote()
            if len(done) == len(pool.actors) and sum(done.values()) >= self.submitted:
                return  # every submitted model finished between two polls: watch the next submission


def test_a_worker_killed_mid_fingerprint_is_retried_and_the_scan_completes(zoo, local_ray, tmp_path):
    models = SUBSET[:4]
    root = copy_models(zoo, models, tmp_path / "hub")
    killer = _KillFirstBusyWorker()
    summary = run_scan(scan_config(root, tmp_path / "out", devices={"mode": "auto"}), observer=killer)
    assert killer.killed is not None, "no worker was caught mid-fingerprint"
    assert (summary.device, summary.actors) == ("gpu", 2)  # one actor per (logical) GPU, computing on the CPU
    assert summary.fingerprinted == len(models) and summary.failed == 0
    db = tmp_path / "out" / "hubtrace.duckdb"
    assert sorted(query(db, "SELECT model_id FROM fingerprints")["model_id"]) == sorted(models)
    assert query(db, "SELECT count(*) AS n FROM current_pair_tests")["n"][0] == len(models) * (len(models) - 1) // 2


@ray.remote(num_cpus=1)
class _Squatter:
    """Holds a CPU of the cluster, as a leaked lease or another job's actor does."""

    def ready(self) -> bool:
        return True


def _squat(cpus: int) -> list:
    squatters = [_Squatter.remote() for _ in range(cpus)]
    ray.get([s.ready.remote() for s in squatters])
    return squatters


def test_an_actor_the_cluster_has_no_room_for_gets_no_model_and_the_scan_says_so(zoo, local_ray, tmp_path):
    """One of the cluster's two CPUs held elsewhere: the second actor never starts. Models queued on it once waited
    for it for ever (a scan of the suite hung so); they must go to the actor that did start."""
    models = SUBSET[:3]
    root = copy_models(zoo, models, tmp_path / "hub")
    squatters = _squat(1)
    try:
        summary = run_scan(scan_config(root, tmp_path / "out"))
    finally:
        for squatter in squatters:
            ray.kill(squatter)
    assert summary.actors == 2 and summary.fingerprinted == len(models) and summary.failed == 0
    assert summary.warnings == ["1 of 2 fingerprint actors never started (the cluster had no room for them); the "
                                "models were fingerprinted on the others"]
    db = tmp_path / "out" / "hubtrace.duckdb"
    assert query(db, "SELECT count(*) AS n FROM current_pair_tests")["n"][0] == len(models) * (len(models) - 1) // 2


def test_a_scan_none_of_whose_actors_can_start_stops_with_the_reason(zoo, local_ray, tmp_path):
    root = copy_models(zoo, SUBSET[:1], tmp_path / "hub")
    config = scan_config(root, tmp_path / "out", ray={"actor_start_timeout_s": 2})
    squatters = _squat(2)
    try:
        with pytest.raises(WorkersNotStartedError) as refused:
            run_scan(config)
    finally:
        for squatter in squatters:
            ray.kill(squatter)
    assert str(refused.value) == ("none of the 2 fingerprint actors started within 2 s (ray.actor_start_timeout_s), "
                                  "each asking for 1 CPU(s); the cluster has 0 CPU, 2 GPU free of 2 CPU, 2 GPU")
    run = query(config.db_path, "SELECT status, summary FROM scan_runs")
    assert run["status"].to_list() == ["failed"] and str(refused.value) in run["summary"][0]


def test_a_driver_killed_mid_scan_reruns_to_the_same_tables_without_duplicates(zoo, local_ray, tmp_path):
    models = SUBSET[:5]
    root = copy_models(zoo, models, tmp_path / "hub")
    out = tmp_path / "out"
    config = scan_config(root, out, pairs={"batch_size": 1})
    config_file = tmp_path / "scan.yaml"
    config_file.write_text(yaml.safe_dump(config.to_json_dict()))
    driver = subprocess.Popen([sys.executable, "-m", "jobs.scan", "--config", str(config_file)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in driver.stdout:
            if "[pairs] stored 1/" in line:
                os.kill(driver.pid, signal.SIGKILL)
                break
        driver.wait()
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # the local Ray the killed driver started, if any is left
        except ProcessLookupError:
            pass
    assert driver.returncode == -signal.SIGKILL
    killed_run = query(config.db_path, "SELECT run_id, status FROM scan_runs")
    assert killed_run["status"].to_list() == ["running"]
    stored_before = query(config.db_path, "SELECT count(*) AS n FROM pair_tests")["n"][0]
    assert stored_before >= 1

    summary = run_scan(config)
    n_pairs = len(models) * (len(models) - 1) // 2
    assert summary.failed == 0
    assert summary.pairs["already_tested"] == stored_before
    assert summary.pairs_tested == n_pairs - stored_before
    tests = query(config.db_path, "SELECT model_a, model_b, superseded FROM pair_tests")
    assert tests.height == n_pairs and not any(tests["superseded"])
    assert {(a, b) for a, b, _ in tests.iter_rows()} == {tuple(sorted(p)) for p in combinations(models, 2)}
    assert sorted(query(config.db_path, "SELECT model_id FROM fingerprints")["model_id"]) == sorted(models)
    assert sorted(query(config.db_path, "SELECT model_id FROM models")["model_id"]) == sorted(models)


def test_a_hub_source_is_fetched_at_the_listed_sha_and_rescanned_only_when_it_changes(zoo, local_ray, tmp_path,
                                                                                      monkeypatch):
    """The scan from a ``kind: hub`` source over real HTTP (paged listing, pinned downloads in the actors)."""
    base, chat, twin = "aurora-labs/aurora-base", "finch-nlp/aurora-chat", "tundra-research/tundra-64"
    monkeypatch.setenv("HUBTRACE_TEST_TOKEN", "hf_test")
    with FakeHub(page_size=2) as hub:
        shas = {model_id: hub.add_folder(model_id, zoo[model_id].path) for model_id in (base, chat, twin)}
        source = {"kind": "hub", "endpoint": hub.endpoint, "token_env": "HUBTRACE_TEST_TOKEN"}
        config = scan_config(tmp_path / "no-local-folder", tmp_path / "out", sources=[source])
        first = run_scan(config)
        first_requests = hub.requests
        hub.clear_log()
        again = run_scan(config)
        second_requests = hub.requests
    assert (first.models, first.fingerprinted, first.failed) == (3, 3, 0)
    assert all(r.authorized for r in first_requests)  # the token reached the listing and the actors' downloads
    downloads = [r.path.strip("/").split("/", 4) for r in first_requests if "/resolve/" in r.path]
    assert {f"{org}/{name}" for org, name, *_ in downloads} == set(shas)
    assert all(revision == shas[f"{org}/{name}"] for org, name, _, revision, _ in downloads)  # pinned to the sha

    db = config.db_path
    models = query(db, "SELECT model_id, revision, source, declared_base_models, declared_relation "
                       "FROM current_models WHERE status = 'ok'")
    assert {m: (rev, src) for m, rev, src, *_ in models.iter_rows()} == {m: (sha, "hub") for m, sha in shas.items()}
    assert {m: (bases, rel) for m, _, _, bases, rel in models.iter_rows()} == {
        base: ([], None), chat: ([base], "finetune"), twin: ([], None)}
    fingerprints = query(db, "SELECT model_id, revision, path FROM fingerprints")
    assert {m: rev for m, rev, _ in fingerprints.iter_rows()} == shas
    assert all(Path(p).is_file() for p in fingerprints["path"])
    tests = query(db, "SELECT model_a, model_b, log10_p, reason FROM current_pair_tests")
    by_pair = {(a, b): (log10_p, reason) for a, b, log10_p, reason in tests.iter_rows()}
    assert set(by_pair) == {tuple(sorted(p)) for p in combinations(shas, 2)}
    assert by_pair[(base, chat)][0] <= -20 and by_pair[(base, chat)][1] == "declared_base"
    assert by_pair[(base, twin)][0] > -20 and by_pair[(chat, twin)][0] > -20

    assert (again.models, again.skipped, again.fingerprinted, again.pairs_tested, again.failed) == (3, 3, 0, 0, 0)
    assert {r.path for r in second_requests} == {"/api/models"}  # the listing alone: no model info, no download


def test_scan_of_a_local_folder_needs_no_config(zoo, local_ray, tmp_path, monkeypatch):
    """`hubtrace scan --local DIR`, as a newcomer types it: configs/local-folder.yaml's defaults, output under
    hubtrace-out/local of the working directory."""
    from typer.testing import CliRunner

    from jobs.cli import app

    pair = ("aurora-labs/aurora-base", "finch-nlp/aurora-chat")
    root = copy_models(zoo, pair, tmp_path / "models")
    monkeypatch.chdir(tmp_path)

    result = CliRunner().invoke(app, ["scan", "--local", str(root)])

    assert result.exit_code == 0, result.output
    out = tmp_path / "hubtrace-out" / "local"
    assert sorted(query(out / "hubtrace.duckdb", "SELECT model_id FROM fingerprints")["model_id"]) == list(pair)
    tests = query(out / "hubtrace.duckdb", "SELECT log10_p FROM current_pair_tests")
    assert tests.height == 1 and tests["log10_p"][0] <= -20
    assert {p.name for p in (out / "exports").iterdir()} == {"lineage.html", "lineage.graphml", "lineage.json"}
