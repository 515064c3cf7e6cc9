"""The demo scan submitted with `ray job submit` to a real cluster started with `ray start --head`.

The cluster runs in its own temp dir on free ports, with its own auth token, in the foreground (``--block``) of a
process group this test owns, so it is stopped by killing that group: ``ray stop`` would stop every Ray on the
machine, other people's included.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.scan_support import SUBSET, copy_models, query

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
#: A hang guard, not a speed requirement: the job takes about 30 s here.
JOB_DEADLINE_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray(*args: str, env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ray"), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def cluster():
    """(environment for the ray CLI, dashboard address) of a fresh 2-CPU head node."""
    temp = Path("/tmp") / f"rayjob-{os.getpid()}-{_free_port()}"  # short: Ray's socket paths have a length limit
    dashboard = _free_port()
    # Ray 2.59+ wants token auth on local clusters; a per-test token keeps ~/.ray/auth_token untouched.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2", "--port", str(_free_port()),
         "--temp-dir", str(temp), "--include-dashboard", "true", "--dashboard-host", "127.0.0.1",
         "--dashboard-port", str(dashboard), "--dashboard-agent-listen-port", str(_free_port()),
         "--ray-client-server-port", str(_free_port())],
        env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        for _ in range(120):
            if _ray("job", "list", "--address", address, env=env, timeout=60).returncode == 0:
                break
            assert head.poll() is None, "ray start --head exited"
            time.sleep(1)
        yield env, address
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the head and every process it started share its process group
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_demo_scan_runs_under_ray_job_submit(cluster, zoo, tmp_path):
    env, address = cluster
    models = SUBSET[:3]
    hub = copy_models(zoo, models, tmp_path / "hub")
    db, out = tmp_path / "scan.duckdb", tmp_path / "out"
    submission = f"hubtrace-test-{os.getpid()}"
    submitted = _ray("job", "submit", "--address", address, "--submission-id", submission, "--working-dir", ".",
                     "--no-wait", "--", "python", "-m", "jobs.scan", "--config", "configs/demo.yaml",
                     "--local", str(hub), "--db", str(db), "--output", str(out), env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    status, deadline = "", time.monotonic() + JOB_DEADLINE_S
    while not any(s in status for s in ("succeeded", "failed", "stopped")):  # "Job '…' succeeded"
        assert time.monotonic() < deadline, f"job still not finished after {JOB_DEADLINE_S} s: {status}"
        time.sleep(2)
        status = _ray("job", "status", "--address", address, submission, env=env).stdout.lower()
    logs = _ray("job", "logs", "--address", address, submission, env=env).stdout
    assert "succeeded" in status, status + logs
    assert "hubtrace scan" in logs  # the summary table printed by the job

    assert sorted(query(db, "SELECT model_id FROM current_models WHERE status = 'ok'")["model_id"]) == sorted(models)
    assert query(db, "SELECT count(*) AS n FROM current_pair_tests")["n"][0] == 3
    runs = query(db, "SELECT status, config FROM scan_runs")
    assert runs["status"].to_list() == ["succeeded"]
    assert str(hub) in runs["config"][0]
