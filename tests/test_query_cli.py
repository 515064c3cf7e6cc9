"""`hubtrace query` on a real DuckDB file: each preset's rows, read-only SQL in the table, csv and json shapes,
--out, and a one-line refusal (exit 2, no traceback) for every failure: a missing or locked database, bad SQL,
a statement that would write, and arguments that do not name exactly one question."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import Result
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from lineage_graph.persist import rebuild_lineage
from scanner.store import Store
from tests.store_support import scanned_hub, writer_holding

runner = CliRunner()
OK_MODELS = ["copy/ft", "new/model", "org/base", "org/ft", "other/indep"]
COUNTS = ("SELECT (SELECT count(*) FROM models) AS models, (SELECT count(*) FROM pair_tests) AS tests, "
          "(SELECT count(*) FROM scan_runs) AS runs")


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> tuple[Path, str, str]:
    """Two nights of a scanned hub with the lineage rebuilt: the database file and the two run ids."""
    db = tmp_path_factory.mktemp("query") / "scan.duckdb"
    with Store(db) as store:
        night1, night2 = scanned_hub(store)
        rebuild_lineage(store)
    return db, night1, night2


def query(db: Path, *args: str) -> Result:
    return runner.invoke(app, ["query", "--db", str(db), *args])


def rows(db: Path, *args: str) -> list[dict]:
    """What a successful query answers, read back from its JSON."""
    result = query(db, *args, "--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refusal(db: Path, *args: str) -> str:
    """The one line a refused query prints, after checking it is one line on stderr and exit status 2."""
    result = query(db, *args)
    assert result.exit_code == EXIT_REFUSED, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert result.stdout == "" and result.stderr.startswith("hubtrace: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def test_presets_answer_the_investigators_questions(scan) -> None:
    db, night1, night2 = scan
    tree = rows(db, "--derives-from", "org/base")
    assert [(r["model_id"], r["parent"], r["depth"]) for r in tree] == [("org/ft", "org/base", 1),
                                                                       ("copy/ft", "org/ft", 2)]
    assert rows(db, "--derives-from", "copy/ft") == []

    near = rows(db, "--depends-on", "org/ft")  # default threshold -8: the -0.5 pairs are not dependence
    assert [(r["model_id"], r["revision"], r["log10_p"]) for r in near] == [("org/base", "r1", -60.0),
                                                                           ("copy/ft", "r2", -55.0)]
    assert [r["model_id"] for r in rows(db, "--depends-on", "org/ft", "--log10-p-below", "-58")] == ["org/base"]

    (claim,) = rows(db, "--claims-no-parent")
    assert (claim["model_id"], claim["depends_on"], claim["claims_from_scratch"]) == ("copy/ft", "org/ft", True)

    latest = rows(db, "--changes")
    assert sorted((r["kind"], r["model_id"]) for r in latest) == [
        ("new_dependence", "copy/ft"), ("new_error", "new/other"), ("new_model", "new/model"),
        ("new_revision", "copy/ft"), ("repeated_error", "bad/broken")]
    assert {r["run_id"] for r in latest} == {night2}
    first = rows(db, "--changes", "--run", night1)
    assert sum(r["kind"] == "new_model" for r in first) == 5 and {r["run_id"] for r in first} == {night1}

    assert {r["model_id"]: r["new"] for r in rows(db, "--errors")} == {"bad/broken": False, "new/other": True}
    assert [(r["model_id"], r["new"]) for r in rows(db, "--errors", "--run", night1)] == [("bad/broken", True)]
    assert [(r["run_id"], r["new_model_rows"], r["pair_tests"], r["errors"]) for r in rows(db, "--runs")] == [
        (night2, 2, 2, 2), (night1, 5, 6, 1)]


def test_sql_answers_as_json_csv_and_a_table(scan) -> None:
    db, _, _ = scan
    sql = ("SELECT model_id, revision, declared_base_models, created_at FROM current_models "
           "WHERE status = 'ok' ORDER BY model_id")
    answer = rows(db, sql)
    assert [r["model_id"] for r in answer] == OK_MODELS
    ft = answer[OK_MODELS.index("org/ft")]
    assert ft == {"model_id": "org/ft", "revision": "r1", "declared_base_models": ["org/base"],
                  "created_at": "2024-01-02T00:00:00+00:00"}

    result = query(db, sql, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "model_id,revision,declared_base_models,created_at"
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["model_id"] for r in table] == OK_MODELS
    assert table[OK_MODELS.index("org/ft")]["declared_base_models"] == '["org/base"]'  # lists as JSON text
    assert table[OK_MODELS.index("org/base")]["declared_base_models"] == "[]"

    # a table shows every row and column, and long text whole up to 200 characters
    wide = query(db, "SELECT * FROM models")
    assert wide.exit_code == 0, wide.output
    header = wide.stdout.splitlines()[2]
    columns = rows(db, "SELECT column_name FROM (DESCRIBE models)")
    assert len(columns) > 20 and all(c["column_name"] in header for c in columns)
    long = query(db, "SELECT i, repeat('x', 150) || i AS text FROM range(40) t(i)")
    assert long.exit_code == 0, long.output
    assert long.stdout.startswith("shape: (40, 2)") and "…" not in long.stdout
    assert all(f"{'x' * 150}{i} " in long.stdout for i in range(40))


def test_out_writes_the_answer_to_a_file(scan, tmp_path: Path) -> None:
    db, night1, night2 = scan
    out = tmp_path / "runs.json"
    result = query(db, "--runs", "--format", "json", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert result.stdout == f"wrote {out} (2 rows)\n"
    assert [r["run_id"] for r in json.loads(out.read_text())] == [night2, night1]
    assert "hubtrace: error: cannot write" in refusal(db, "--runs", "--out", str(tmp_path / "no" / "dir.csv"))


@pytest.mark.parametrize("sql", [
    "INSERT INTO scan_runs (run_id, started_at, status) VALUES ('x', now(), 'running')",
    "UPDATE models SET status = 'ok'",
    "DELETE FROM pair_tests",
    "CREATE TABLE notes (text VARCHAR)",
    "DROP TABLE scan_errors",
])
def test_write_statements_are_refused_and_change_nothing(scan, sql: str) -> None:
    db, _, _ = scan
    before = rows(db, COUNTS)
    assert "refused: hubtrace query only reads" in refusal(db, sql)
    assert rows(db, COUNTS) == before
    assert "scan_errors" in {r["name"] for r in rows(db, "SHOW TABLES")}


def test_statements_that_write_files_are_refused_unrun(scan, tmp_path: Path) -> None:
    db, _, _ = scan
    target = tmp_path / "leak.csv"
    assert "COPY refused" in refusal(db, f"COPY models TO '{target}'")
    assert "EXPORT refused" in refusal(db, f"EXPORT DATABASE '{tmp_path / 'dump'}'")
    assert list(tmp_path.iterdir()) == []


def test_bad_sql_and_bad_arguments_are_one_line_each(scan, tmp_path: Path) -> None:
    db, _, _ = scan
    assert 'SQL: Parser Error: syntax error at or near "SELEC"' in refusal(db, "SELEC 1")
    assert "Table with name nope does not exist" in refusal(db, "SELECT * FROM nope")
    assert "exactly one SQL statement; got 2" in refusal(db, "SELECT 1; SELECT 2")
    assert "got none" in refusal(db)
    assert "got SQL and --runs" in refusal(db, "SELECT 1", "--runs")
    assert "got --changes and --errors" in refusal(db, "--changes", "--errors")
    assert "--run goes with --changes or --errors" in refusal(db, "--runs", "--run", "x")
    assert "no scan run 'nope'" in refusal(db, "--errors", "--run", "nope")
    assert "unknown format 'xml'" in refusal(db, "--runs", "--format", "xml")
    assert "no scan database at" in refusal(tmp_path / "absent.duckdb", "--runs")


@pytest.mark.parametrize(("sql", "shown"), [
    ("SELECT DATE '294247-01-10' + 1 AS d", "294247-01-11"),  # past polars' last date: its table printer panicked
    ("SELECT 12345678901234567890123::VARINT AS v", "12345678901234567890123"),
    ("SELECT 7::VARIANT AS v", "7"),
    ("SELECT INTERVAL 1 DAY AS i", "1 day"),
])
@pytest.mark.parametrize("fmt", ["table", "csv", "json"])
def test_values_polars_cannot_hold_are_shown_as_text_not_a_panic(scan, sql: str, shown: str, fmt: str) -> None:
    db, _, _ = scan
    result = query(db, sql, "--format", fmt)
    assert result.exit_code == 0, result.output
    assert shown in result.stdout
    assert ("every column is shown as text" in result.stderr) == ("DATE" in sql)  # the others by their type


def test_the_folder_beside_the_database_is_not_a_way_to_other_files(scan, tmp_path: Path) -> None:
    """Issue 24: DuckDB lets SQL read its temp folder with external access off, and the default is <db>.tmp beside
    the database: a link there (or a planted file) was readable. Sealed queries spill to a private folder."""
    db, _, _ = scan
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(db.read_bytes())
    secrets_folder = tmp_path / "secrets"
    secrets_folder.mkdir()
    (secrets_folder / "key.csv").write_text("token\nhunter2\n")
    (tmp_path / "copy.duckdb.tmp").symlink_to(secrets_folder)
    planted = tmp_path / "copy.duckdb.tmp" / "key.csv"
    message = refusal(copy, f"SELECT * FROM read_csv('{planted}')")  # refused unrun: it reads files
    assert "hunter2" not in message and "read_csv() refused: it reads local files" in message
    message = refusal(copy, f"SELECT * FROM '{planted}'")  # a path as a table: no function, DuckDB's own wall
    assert "hunter2" not in message and "disabled" in message


def test_a_database_held_by_a_running_scan_is_one_clear_line(tmp_path: Path) -> None:
    db = tmp_path / "scan.duckdb"
    Store(db).close()
    with writer_holding(db) as writer:
        assert f"open for writing by process {writer.pid}" in refusal(db, "--runs")
    assert rows(db, "--runs") == []  # free again once the scan is gone
