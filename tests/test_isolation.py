"""Tests see only what they started: a Ray worker's output never lands in another test's captured streams, and no
test joins a cluster or reads Ray state from outside the session (tests/ray_support.py, tests/conftest.py)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
import ray
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app

TRACE_LINES = 42


@ray.remote(num_cpus=0)
class Chatter:
    """A worker that keeps writing a stack trace's worth of lines to its stderr and stdout."""

    def __init__(self) -> None:
        self.lines = 0

    def speak(self, seconds: float) -> int:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for _ in range(TRACE_LINES):
                print("Traceback line from a worker of another test", file=sys.stderr, flush=True)
                print("stdout line from a worker of another test", flush=True)
                self.lines += 2
            time.sleep(0.05)
        return self.lines


def test_a_cli_refusal_stays_one_line_while_a_worker_of_the_session_prints(local_ray, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    """The failure guarded against: ``hubtrace`` run in process (CliRunner swaps ``sys.stderr``) while a Ray worker
    prints. Ray's driver writes its workers' lines to the ``sys.stderr`` of the moment, so without
    ``log_to_driver=False`` both the command's stderr and this test's capture fill with them (each check fails
    then: verified by starting the fixture's Ray with log_to_driver=True)."""
    chatter = Chatter.remote()
    assert ray.get(chatter.speak.remote(0.5)) >= 2 * TRACE_LINES
    talking = chatter.speak.remote(3.0)
    time.sleep(1.0)   # the driver receives worker output within a fraction of a second when it is sent at all
    result = CliRunner().invoke(app, ["query", "--db", str(tmp_path / "none.duckdb"), "SELECT 1"])
    ray.get(talking)
    time.sleep(1.0)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert result.stderr.startswith("hubtrace: error: no scan database") and result.stderr.count("\n") == 1, \
        result.stderr
    assert result.stdout == ""
    captured = capsys.readouterr()
    assert "another test" not in captured.err + captured.out


def test_the_session_joins_no_outside_cluster_and_keeps_its_own_ray_files() -> None:
    """A shell's ``RAY_ADDRESS`` would make every scan join that cluster; Ray's default /tmp/ray holds other runs'
    sessions and ``ray_current_cluster``."""
    assert "RAY_ADDRESS" not in os.environ
    temp = Path(os.environ["RAY_TMPDIR"])
    assert temp.is_dir() and temp.name.startswith("hubtrace-ray-") and temp != Path("/tmp")
