"""CSV that no spreadsheet misreads, from every writer hubtrace has (issue 34): `hubtrace query --format csv`, the
SQL box's download and the table downloads of `hubtrace serve`.

A bare carriage return inside a cell once went out unquoted: ``mit<CR>=cmd|' /C calc'!A0`` then reads as two rows
in a spreadsheet, the second starting with a formula. Each writer's bytes are read back the way a spreadsheet splits
them (a CSV reader that ends a record at any unquoted CR or LF) on a real database, through the real command line
and the real app.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.web.app import create_app
from scanner.store import Store
from scanner.text_safety import csv_cell
from tests.store_support import Meta, record

FORMULA = ("=", "+", "-", "@")
TRAPS = (
    "mit\r=cmd|' /C calc'!A0",       # the one that got through: a bare CR, then a formula
    "mit\n=cmd|' /C calc'!A0",
    "mit\r\n@SUM(1+1)*cmd|' /C calc'!A0",
    " =1+2", "\t=1+2", "\r=1+2", "\n=1+2", "\r\n+1", " \t\n -2+3", "\u3000=1+2", "\u00a0@x",
)


@pytest.mark.parametrize("text", TRAPS)
def test_a_cell_whose_first_visible_character_starts_a_formula_is_neutralised(text: str) -> None:
    cell = csv_cell(text)
    if text.lstrip().startswith(FORMULA) or text.startswith(("\t", "\r")):
        assert cell.startswith("'")
    assert cell.lstrip("'") == text  # otherwise the text itself, control characters kept for the writer to quote


def spreadsheet_rows(data: bytes) -> list[list[str]]:
    """The records a spreadsheet reads: a record ends at any CR or LF outside quotes."""
    return list(csv.reader(io.StringIO(data.decode("utf-8"), newline="")))


def held(rows: list[list[str]]) -> None:
    """Every record has the header's fields, and none is a formula (a cell starting with one is quoted text)."""
    assert rows and all(len(row) == len(rows[0]) for row in rows), rows
    for row in rows:
        for cell in row:
            assert cell.startswith("'") or not cell.lstrip().startswith(FORMULA), (cell, rows)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Models whose licence is each trap."""
    path = tmp_path_factory.mktemp("csv") / "hub.duckdb"
    with Store(path) as store:
        run = store.start_run({})
        for k, text in enumerate(TRAPS):
            store.upsert_model(replace(record(f"org/m{k:02d}"), license=text), Meta(), run, "ok")
        store.finish_run(run, "succeeded", {})
    return path


SQL = "SELECT model_id, license FROM current_models ORDER BY model_id"


def test_hubtrace_query_csv_holds(db: Path) -> None:
    result = CliRunner().invoke(app, ["query", "--db", str(db), SQL, "--format", "csv"])
    rows = spreadsheet_rows(result.stdout_bytes)
    held(rows)
    assert [row[1].lstrip("'") for row in rows[1:]] == list(TRAPS)  # every licence whole, in its own row


@pytest.mark.parametrize("download", ["/sql.csv", "/tables/current_models.csv"])
def test_serve_downloads_hold(db: Path, download: str) -> None:
    client = create_app(db, host_names=None).test_client()
    answer = client.get(download, query_string={"q": SQL} if download == "/sql.csv" else {})
    assert answer.status_code == 200
    rows = spreadsheet_rows(answer.data)
    held(rows)
    licence = rows[0].index("license")
    assert sorted(row[licence].lstrip("'") for row in rows[1:]) == sorted(TRAPS)
