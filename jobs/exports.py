"""Tables and query answers as CSV or JSON (`hubtrace query --format`, `hubtrace serve` downloads), written while
they are read (a frame at a time): RFC 4180 CSV (CRLF line ends, so a cell holding CR or LF is quoted: a bare CR
once let ``mit<CR>=cmd|...`` start a spreadsheet row with a formula) whose text cells no spreadsheet runs as a
formula (`csv_cell`), and a JSON array of row objects that any parser reads (no NaN or Infinity:
`json_document`) with invisible characters as ``\\u`` escapes (`json_visible`: the same values)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from datetime import date, time
from typing import Any

import polars as pl

from scanner.text_safety import csv_cell, json_document, json_visible


def csv_chunks(frames: Iterable[pl.DataFrame]) -> Iterator[str]:
    """A header from the first frame's columns, then every row; nested values as JSON text, bytes as hex."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")  # so the writer quotes a cell holding CR or LF
    header = False
    for frame in frames:
        if not header:
            writer.writerow([csv_cell(c) for c in frame.columns])
            header = True
        for row in frame.iter_rows():
            writer.writerow([_csv_value(v) for v in row])
        yield _drained(buffer)


def json_chunks(frames: Iterable[pl.DataFrame]) -> Iterator[str]:
    """``[`` then one row object per line, then ``]``."""
    yield "["
    first = True
    for frame in frames:
        rows = [json_visible(json_document(row, default=_json_value)) for row in frame.iter_rows(named=True)]
        if rows:
            yield ("\n" if first else ",\n") + ",\n".join(rows)
            first = False
    yield "\n]\n"


def _csv_value(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return csv_cell(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, list | tuple | dict):
        return csv_cell(json_document(value, default=_json_value))  # as the JSON download writes it: NaN as null
    return _json_value(value) if isinstance(value, date | time) else str(value)


def _json_value(value: object) -> str:
    """Dates and times as ISO 8601; anything else JSON has no type for (decimals, bytes as hex) as text."""
    if isinstance(value, bytes):
        return value.hex()
    return value.isoformat() if isinstance(value, date | time) else str(value)


def _drained(buffer: io.StringIO) -> str:
    text = buffer.getvalue()
    buffer.seek(0)
    buffer.truncate()
    return text
