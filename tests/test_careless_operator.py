"""What an operator does by accident, each case of issue 34 that once ended in a traceback or a lie: a config with
several mistakes, a Llama config.json carrying a stray ``text_config``, a database of a newer schema given to
``test --null-db`` or ``serve``, a scan into a truncated database or into a folder that cannot be made, and a scan
killed with ``kill -9``.

Each refusal is one ``hubtrace: error:`` line a problem and exit status 2, through the real command line; the
killed scan is a real process killed with SIGKILL. No zoo and no Ray: tiny random models and real DuckDB files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from scanner.store import LATEST_VERSION, Store, StoreError, queries
from tests.serve_support import HUBTRACE
from tests.tiny_models import FAMILIES, save_random

runner = CliRunner()


def refused(args: list[str]) -> list[str]:
    """The command's stderr lines, once it is checked to be a refusal: exit 2, every line a ``hubtrace: error:``."""
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_REFUSED, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("hubtrace: error: ") for line in lines), result.stderr
    return lines


def test_a_config_with_several_mistakes_says_each_on_its_own_line(tmp_path: Path) -> None:
    config = tmp_path / "x.yaml"
    config.write_text("sources:\n  - kind: hub\n    limitt: 3\nstatistic: up\nray: {actor: 2}\n")
    lines = refused(["scan", "--config", str(config)])
    assert len(lines) == 3 and not any("\\x0a" in line for line in lines)
    assert all(line.startswith(f"hubtrace: error: {config}: invalid scan config: ") for line in lines)
    assert [line.split(": ")[4] for line in lines] == ["sources[0].limitt", "statistic", "ray.actor"]


@pytest.mark.parametrize("text_config", [{"hidden_size": 64}, [1], "x"])
def test_a_llama_config_with_a_text_config_key_is_one_line(tmp_path: Path, text_config: object) -> None:
    model = tmp_path / "llama"
    save_random(FAMILIES["llama"].config(), model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "text_config": text_config}))
    lines = refused(["fingerprint", str(model), "--out", str(tmp_path / "fp.safetensors")])
    assert len(lines) == 1 and "config.json is not a valid llama config: its text_config is a" in lines[0]


@pytest.fixture
def newer_db(tmp_path: Path) -> Path:
    """A database a newer hubtrace wrote: one more schema step, which renamed a column this hubtrace reads."""
    db = tmp_path / "newer.duckdb"
    Store(db).close()
    with duckdb.connect(str(db)) as con:
        con.execute("ALTER TABLE pair_tests RENAME COLUMN value TO raw_value")
        con.execute("INSERT INTO schema_version VALUES (?, 'from the future', now(), '99.0')", [LATEST_VERSION + 1])
    return db


def test_a_null_db_of_a_newer_schema_is_one_line(newer_db: Path, tmp_path: Path) -> None:
    for side in ("a", "b"):
        save_random(FAMILIES["llama"].config(), tmp_path / side)
    lines = refused(["test", str(tmp_path / "a"), str(tmp_path / "b"), "--stat", "attn-std",
                     "--null-db", str(newer_db)])
    assert len(lines) == 1 and f"schema version {LATEST_VERSION + 1}, newer than this hubtrace" in lines[0]
    with pytest.raises(StoreError, match="upgrade hubtrace to read it"):
        Store(newer_db, read_only=True)


def test_serve_refuses_a_database_of_a_newer_schema_before_it_listens(newer_db: Path) -> None:
    command = [str(HUBTRACE)] if HUBTRACE.exists() else [sys.executable, "-m", "jobs.cli.app"]
    # once, it served every page as a 500; the timeout only keeps a server that starts from hanging the suite
    done = subprocess.run([*command, "serve", "--db", str(newer_db), "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == EXIT_REFUSED and done.stdout == ""
    assert done.stderr.splitlines() == [line for line in done.stderr.splitlines()
                                        if line.startswith("hubtrace: error: ")]
    assert len(done.stderr.splitlines()) == 1 and "newer than this hubtrace" in done.stderr


def test_a_truncated_database_is_refused_before_the_scan_starts(tmp_path: Path) -> None:
    db = tmp_path / "scan.duckdb"
    with Store(db) as store:  # a file of several blocks, then its last block cut off (a copy or a full disk)
        store.connection.execute("CREATE TABLE filler AS SELECT range AS n, md5(range::VARCHAR) AS s "
                                 "FROM range(200000)")
        store.connection.execute("CHECKPOINT")
        (block_size,), = store.connection.execute("SELECT block_size FROM pragma_database_size()").fetchall()
    whole = db.read_bytes()
    db.write_bytes(whole[: len(whole) - block_size])  # DuckDB still opens this, and fails on a later read
    (tmp_path / "hub").mkdir()
    lines = refused(["scan", "--local", str(tmp_path / "hub"), "--db", str(db), "--output", str(tmp_path / "out")])
    assert len(lines) == 1 and f"the scan database {db} is truncated" in lines[0]
    assert f"{len(whole) - block_size:,} bytes, where the blocks its header counts in use need {len(whole):,}" \
        in lines[0]
    for read_only in (True, False):
        with pytest.raises(StoreError, match="truncated"):
            Store(db, read_only=read_only)


def test_a_scan_into_a_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "hub").mkdir()
    (tmp_path / "a-file").write_text("in the way")
    lines = refused(["scan", "--local", str(tmp_path / "hub"), "--output", str(tmp_path / "a-file" / "out")])
    assert len(lines) == 1 and f"cannot create the folder {tmp_path / 'a-file' / 'out'}" in lines[0]
    assert "Not a directory" in lines[0]


KILLED_SCAN = """
import os, signal, sys
from scanner.store import Store
store = Store(sys.argv[1])
print(store.start_run({"sources": []}), os.getpid(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_scan_killed_with_sigkill_is_marked_abandoned_by_the_next_run(tmp_path: Path) -> None:
    db = tmp_path / "scan.duckdb"
    killed = subprocess.run([sys.executable, "-c", KILLED_SCAN, str(db)], capture_output=True, text=True,
                            cwd=Path(__file__).parents[1])
    assert killed.returncode == -signal.SIGKILL
    dead_run, dead_pid = killed.stdout.split()
    with Store(db, read_only=True) as store:  # killed mid-run: it says running, and would for ever
        assert queries.runs(store).filter(run_id=dead_run)["status"].to_list() == ["running"]
    with Store(db) as store:
        mine = store.start_run({})
        runs = {r["run_id"]: r for r in store.query("SELECT run_id, status, summary, pid FROM scan_runs")
                .rows(named=True)}
    assert runs[dead_run]["status"] == "abandoned" and runs[mine]["status"] == "running"
    note = json.loads(runs[dead_run]["summary"])["abandoned"]
    assert f"process {dead_pid} on " in note and mine in note
    assert runs[mine]["pid"] == os.getpid()
    result = runner.invoke(app, ["query", "--db", str(db), "--runs", "--format", "json"])
    assert {(r["run_id"], r["status"]) for r in json.loads(result.stdout)} == {(dead_run, "abandoned"),
                                                                               (mine, "running")}
