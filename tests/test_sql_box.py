"""The SQL box (`hubtrace serve`) and `hubtrace query` under a hostile or careless user (issue 34).

The statement check is held against DuckDB's own catalogue of functions (``duckdb_functions()``), so a function a
new release adds is either listed as one that reads or refused, never passed unseen. The engine of a reader is
locked. And one visitor cannot take the server: a real `hubtrace serve` process is asked over HTTP to change its
engine, to run a statement for ever (then to leave while it runs), and for more rows than a download carries.
No zoo, no Ray: an empty scan database and SQL over ``range()``.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from scanner.store import Store, StoreError, queries
from scanner.store.read_only_sql import (
    FILE_TABLE_FUNCTIONS,
    HARMLESS_SIDE_EFFECTS,
    READING_TABLE_FUNCTIONS,
    REFUSED_TABLE_FUNCTIONS,
    check_read_only,
)
from tests.serve_support import Server, get, page_url, serving

SLOW = "SELECT sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"
"""A statement DuckDB works on for hours (10^12 rows), and never holds much memory for."""


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "scan.duckdb"
    Store(path).close()
    return path


@pytest.fixture(scope="module")
def catalogue() -> dict[str, set[str]]:
    """function_type -> the names DuckDB defines of that type."""
    with duckdb.connect() as con:
        rows = con.execute("SELECT DISTINCT lower(function_name), function_type, coalesce(has_side_effects, false) "
                           "FROM duckdb_functions() WHERE internal").fetchall()
    kinds: dict[str, set[str]] = {}
    for name, kind, side_effects in rows:
        kinds.setdefault(kind, set()).add(name)
        if side_effects:
            kinds.setdefault("side effects", set()).add(name)
    return kinds


def refusal(store: Store, sql: str) -> str:
    with pytest.raises(StoreError) as refused:
        check_read_only(store.connection, sql, local_files=store.allow_local_files)
    return str(refused.value)


def test_every_table_function_of_duckdb_is_listed_as_reading_reading_files_or_refused(catalogue) -> None:
    tables = catalogue["table"] | catalogue["table_macro"]
    listed = [READING_TABLE_FUNCTIONS, FILE_TABLE_FUNCTIONS, set(REFUSED_TABLE_FUNCTIONS)]
    assert not (set.intersection(*map(set, listed[:2])) or (listed[0] | listed[1]) & listed[2])  # one list each
    unlisted = tables - set().union(*listed)
    assert not unlisted, f"new DuckDB table functions: list each as reading, reading files or refused: {unlisted}"
    assert not set().union(*listed) - tables  # and nothing listed that DuckDB no longer has


def test_every_function_with_side_effects_is_refused_unless_listed_harmless(db: Path, catalogue) -> None:
    acting = catalogue["side effects"] - catalogue["table"]
    assert HARMLESS_SIDE_EFFECTS <= acting  # the list names only functions DuckDB marks
    assert acting - HARMLESS_SIDE_EFFECTS >= {"setseed", "nextval", "setval", "write_log"}
    with Store(db, read_only=True) as store:
        for name in acting - HARMLESS_SIDE_EFFECTS:
            assert refusal(store, f"SELECT {name}(1)") == (f"{name}() refused: DuckDB marks it as acting beyond the "
                                                           "query, and queries here only read")
        for name in HARMLESS_SIDE_EFFECTS:
            check_read_only(store.connection, f"SELECT {name}()")
    with duckdb.connect() as con:  # and no macro reaches one of them unseen
        macros = con.execute("SELECT function_name, macro_definition FROM duckdb_functions() "
                             "WHERE function_type IN ('macro', 'table_macro') AND internal").fetchall()
    for name, definition in macros:
        called = set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", definition.lower()))
        assert not called & ((acting - HARMLESS_SIDE_EFFECTS) | set(REFUSED_TABLE_FUNCTIONS)), (name, definition)


def test_each_table_function_is_refused_or_passed_as_listed(db: Path) -> None:
    for local_files in (False, True):  # one after the other: DuckDB opens a file with one configuration at a time
        with Store(db, read_only=True, allow_local_files=local_files) as store:
            for name, why in REFUSED_TABLE_FUNCTIONS.items():
                said = refusal(store, f"SELECT * FROM {name}()")
                assert said == f"{name}() refused: it {why}; queries here only read"
            for name in FILE_TABLE_FUNCTIONS:
                if local_files:
                    check_read_only(store.connection, f"SELECT * FROM {name}('x')", local_files=True)
                else:
                    assert "it reads local files" in refusal(store, f"SELECT * FROM {name}('/etc/passwd')")
            for name in READING_TABLE_FUNCTIONS:
                check_read_only(store.connection, f"SELECT * FROM {name}()")


@pytest.mark.parametrize("sql", [
    "SELECT * FROM enable_logging(storage := 'file', storage_path := '/x')",   # the attack of issue 34
    "SELECT * FROM enable_profiling(save_location := '/tmp/profile.json')",
    "SELECT 1 WHERE EXISTS (SELECT * FROM main.enable_logging())",            # nested, schema-qualified
    "WITH c AS (SELECT * FROM system.main.checkpoint()) SELECT * FROM c",
    "SELECT 1 UNION ALL SELECT count(*) FROM force_checkpoint()",
    "EXPLAIN SELECT * FROM enable_profiling()",
    "SELECT * FROM query('SELECT 1')",
    "SELECT (SELECT SETSEED(0.5))",
    "SELECT * FROM no_such_function()",
])
def test_a_statement_calling_a_function_that_acts_is_refused_unrun(db: Path, sql: str) -> None:
    with Store(db, read_only=True) as store:
        assert "refused" in refusal(store, sql)
        assert store.query("SELECT current_setting('enable_profiling') AS p")["p"][0] in (None, "")


@pytest.mark.parametrize("sql", [
    "SELECT unnest([1, 2]) AS n", "SELECT generate_series(1, 3) AS s", "SELECT range(3) AS r",
    "SELECT a.range + 1 FROM range(3) a", "SELECT random() < 2, uuid() IS NOT NULL", "SUMMARIZE models",
    "SELECT * FROM pragma_table_info('models')", "SELECT count(*) FROM duckdb_tables()",
])
def test_a_statement_that_only_reads_runs(db: Path, sql: str) -> None:
    with Store(db, read_only=True) as store:
        assert queries.read_only_query(store, sql).height >= 1


def test_a_reader_cannot_change_the_engine_even_past_the_check(db: Path) -> None:
    with Store(db, read_only=True) as store:
        for sql in ("SET threads = 64", "SET memory_limit = '100GB'", "RESET lock_configuration",
                    "SELECT * FROM enable_logging(storage := 'file', storage_path := '/tmp/x')",
                    "SELECT * FROM enable_profiling()"):
            with pytest.raises(duckdb.Error, match="configuration has been locked"):
                store.connection.execute(sql)
        assert store.query("SELECT current_setting('TimeZone') AS tz")["tz"][0] == "UTC"
        with Store(db, read_only=True) as second:  # a second reader of the same engine finds it so
            assert second.query("SELECT current_setting('lock_configuration') AS l")["l"][0]


def test_query_cuts_at_its_limit_and_says_so(db: Path) -> None:
    runner = CliRunner()
    cut = runner.invoke(app, ["query", "--db", str(db), "SELECT * FROM range(100005)", "--format", "json"])
    assert cut.exit_code == 0 and len(json.loads(cut.stdout)) == 100_000  # the default cap
    assert cut.stderr == ("hubtrace: note: the answer has more than 100,000 rows; these are the first 100,000 "
                          "(--limit N for more, --limit 0 for all)\n")
    whole = runner.invoke(app, ["query", "--db", str(db), "SELECT * FROM range(100005)", "--format", "csv",
                                "--limit", "0"])
    assert whole.stdout_bytes.count(b"\r\n") == 100_006 and whole.stderr == ""
    exact = runner.invoke(app, ["query", "--db", str(db), "SELECT * FROM range(7)", "--limit", "7"])
    assert exact.exit_code == 0 and exact.stderr == ""  # not cut: nothing said
    preset = runner.invoke(app, ["query", "--db", str(db), "--runs", "--limit", "1"])
    assert preset.exit_code == 0 and preset.stderr == ""


# the server --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(db: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve-log") / "stderr.txt"
    with serving(db, log, "--query-seconds", "1", "--download-rows", "5") as running:
        yield running


def sql_page(server: Server, sql: str, path: str = "/sql") -> tuple[int, str]:
    answer = get(page_url(server.url, path, q=sql))
    return answer.status, answer.text


def test_the_engine_attack_is_refused_and_the_server_answers_on(server: Server) -> None:
    for sql in ("SELECT * FROM enable_logging(storage := 'file', storage_path := '/x')",
                "SELECT * FROM enable_profiling(save_location := '/tmp/hubtrace-profile.json')"):
        status, text = sql_page(server, sql)
        assert status == 400 and "refused: it changes the engine" in text
    for path in ("/", "/tables", "/discrepancies"):  # once, the next request aborted the process
        assert get(page_url(server.url, path)).status == 200
    assert server.process.poll() is None


def test_a_statement_is_stopped_at_the_time_limit_page_and_download(server: Server) -> None:
    status, text = sql_page(server, SLOW)
    assert status == 400 and "stopped: it ran for the 1 s a statement may take here" in text
    status, text = sql_page(server, SLOW, "/sql.csv")
    assert status == 400 and "stopped: it ran for the 1 s" in text
    assert sql_page(server, "SELECT 42 AS answer")[0] == 200  # the connection answers the next statement


def test_the_engine_memory_is_bounded(db: Path, tmp_path: Path) -> None:
    with serving(db, tmp_path / "stderr.txt", "--query-seconds", "600", "--memory-limit", "200MB",
                 "--spill", "100MB") as server:  # only memory can stop this statement
        status, text = sql_page(server, "SELECT list(range) FROM range(100000000)")  # 800 MB of list
        assert status == 400 and "Out of Memory" in text  # the engine has 200 MB: refused, not grown
        assert sql_page(server, "SELECT 42 AS answer")[0] == 200


def test_a_download_carries_at_most_the_row_cap(server: Server) -> None:
    answer = get(page_url(server.url, "/sql.csv", q="SELECT range AS n FROM range(1000)"))
    assert answer.status == 200 and answer.headers["X-Hubtrace-Row-Cap"] == "5"
    assert answer.text == "n\r\n0\r\n1\r\n2\r\n3\r\n4\r\n"
    assert len(json.loads(get(page_url(server.url, "/sql.json", q="SELECT * FROM range(1000)")).text)) == 5
    assert "up to\n  5 rows" in sql_page(server, "SELECT range FROM range(1000)")[1]


def _until(status: int, url: str, seconds: float = 120.0) -> int:
    """Ask ``url`` until it answers ``status`` (or ``seconds`` pass: a guard against a hang, not a speed limit)."""
    deadline = time.monotonic() + seconds
    answered = get(url).status
    while answered != status and time.monotonic() < deadline:
        time.sleep(0.1)
        answered = get(url).status
    return answered


def test_a_statement_whose_client_left_is_stopped(db: Path, tmp_path: Path) -> None:
    log = tmp_path / "stderr.txt"
    with serving(db, log, "--query-seconds", "600", "--sql-slots", "1") as server:
        parts = urlsplit(page_url(server.url, "/sql", q=SLOW))
        with socket.create_connection((parts.hostname, parts.port)) as client:
            client.sendall(f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
            client.settimeout(3.0)
            with pytest.raises(TimeoutError):  # no answer: the statement runs (a refusal answers at once)
                client.recv(1)
        # the client has gone: an hour of work must end now, and its one lane answer the next statement
        assert _until(200, page_url(server.url, "/sql", q="SELECT 1")) == 200
        assert get(page_url(server.url, "/")).status == 200
    assert re.search(r"hubtrace serve: stopped a statement of /sql after \d+\.\d s: its client went away",
                     log.read_text())


def test_a_busy_sql_box_says_so_and_pages_still_answer(db: Path, tmp_path: Path) -> None:
    """The slow statement's client holds the one lane while the others ask, then leaves (which stops it: the test
    above), so the test waits for no time limit."""
    with serving(db, tmp_path / "stderr.txt", "--query-seconds", "600", "--sql-slots", "1") as server:
        parts, quick = urlsplit(page_url(server.url, "/sql", q=SLOW)), page_url(server.url, "/sql", q="SELECT 1")
        with socket.create_connection((parts.hostname, parts.port)) as client:
            client.sendall(f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
            assert _until(503, quick) == 503
            busy = get(quick)
            assert busy.status == 503 and "answering 1 other statements" in busy.text
            assert get(page_url(server.url, "/")).status == 200  # while the lane is taken
        assert _until(200, quick) == 200  # the lane is free again once its client has gone


# issue 44: what the parser does not know, and values polars cannot hold ----------------------------------------

UNKNOWN_TO_PYTHON = {
    "UPDATE EXTENSIONS": "a kind of statement hubtrace does not know",  # StatementType 29: no member in the enum
    "SELECT " + "abs(" * 400 + "1" + ")" * 400: "nests expressions or queries too deeply",  # RecursionError
}


@pytest.mark.parametrize("sql", list(UNKNOWN_TO_PYTHON), ids=["update-extensions", "nested-400-deep"])
def test_a_statement_python_cannot_read_is_refused_in_one_line(db: Path, server: Server, sql: str) -> None:
    """Once a traceback: ValueError (29 is not a valid StatementType) and RecursionError, rc 1 in `hubtrace query`
    and 500 in serve."""
    said = UNKNOWN_TO_PYTHON[sql]
    result = CliRunner().invoke(app, ["query", "--db", str(db), sql])
    assert result.exit_code == 2 and result.stderr.startswith("hubtrace: error: this statement refused: ")
    assert said in result.stderr and result.stderr.count("\n") == 1
    status, text = sql_page(server, sql)
    assert status == 400 and "Refused." in text and said in text
    assert get(page_url(server.url, "/sql.csv", q=sql), timeout=60).status == 400


def test_the_sql_box_names_none_of_the_servers_own_folders(server: Server) -> None:
    """Once its errors showed the server's home directory (DuckDB looks for extensions there) and its private
    temporary folder (a query may name it: DuckDB lets SQL read it)."""
    def error(sql: str) -> str:
        status, text = sql_page(server, sql)
        assert status == 400, text
        return text.split('<p class="error"', 1)[1].split("</p>", 1)[0]  # (the statement is shown above as typed)

    home = str(Path.home())
    said = error("SELECT * FROM duckdb_extensions()")
    assert "~/.duckdb" in said and home + "/" not in said
    setting = get(page_url(server.url, "/sql.json", q="SELECT current_setting('temp_directory') AS t"), timeout=60)
    temp = json.loads(setting.text)[0]["t"]  # a result may name it (a setting is data); an error does not
    said = error(f"SELECT * FROM '{temp}/missing.csv'")
    assert "&lt;temporary folder&gt;/missing.csv" in said and temp not in said


@pytest.mark.parametrize("sql", [
    "SELECT DATE '5881580-07-10' AS d", "SELECT TIMESTAMP '290000-01-01' AS t", "SELECT * FROM test_all_types()",
], ids=["date", "timestamp", "test_all_types"])
def test_values_polars_cannot_hold_are_answered_as_text_on_the_page_and_in_downloads(server: Server, sql: str) -> None:
    """Once the client waited for ever: polars panics (PanicException, a BaseException) turning such a value into
    Python, and the page's thread died with the request unanswered."""
    page = get(page_url(server.url, "/sql", q=sql), timeout=60)
    assert page.status == 200 and "rows" in page.text and "Traceback" not in page.text
    as_csv = get(page_url(server.url, "/sql.csv", q=sql), timeout=60)
    assert as_csv.status == 200 and len(as_csv.text.splitlines()) >= 2
    as_json = json.loads(get(page_url(server.url, "/sql.json", q=sql), timeout=60).text)
    assert as_json and all(isinstance(row, dict) for row in as_json)
    if "5881580" in sql:
        assert "5881580-07-10" in page.text and "5881580-07-10" in as_csv.text and as_json[0]["d"] == "5881580-07-10"
    assert get(page_url(server.url, "/"), timeout=60).status == 200 and server.process.poll() is None
