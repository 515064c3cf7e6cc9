"""Tables and query answers as CSV or JSON (`hubtrace query --format`, `hubtrace serve` downloads), written while
they are read, a row at a time (so a download can stop before the row that would pass its byte cap): RFC 4180 CSV
(CRLF line ends, so a cell holding CR or LF is quoted: a bare CR once let ``mit<CR>=cmd|...`` start a spreadsheet
row with a formula) whose text cells no spreadsheet runs as a formula (`csv_cell`), and a JSON array of row objects
that any parser reads (no NaN or Infinity: `json_document`) with invisible characters as ``\\u`` escapes
(`json_visible`: the same values)."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator
from datetime import date, time
from typing import Any

import polars as pl

from scanner.text_safety import csv_cell, json_document, json_visible


class CsvText:
    """RFC 4180 CSV a row at a time: a header of the columns, then one CRLF-ended line per row; nested values as JSON
    text, bytes as hex."""

    closing = ""

    def __init__(self) -> None:
        self._buffer = io.StringIO()
        self._writer = csv.writer(self._buffer, lineterminator="\r\n")  # so the writer quotes a cell holding CR or LF

    def opening(self, columns: list[str]) -> str:
        self._writer.writerow([csv_cell(c) for c in columns])
        return _drained(self._buffer)

    def rows(self, frame: pl.DataFrame) -> Iterator[str]:
        for row in frame.iter_rows():
            self._writer.writerow([_csv_value(v) for v in row])
            yield _drained(self._buffer)


class JsonText:
    """A JSON array of row objects a row at a time: ``[``, then one object per line, then ``]``."""

    closing = "\n]\n"

    def __init__(self) -> None:
        self._first = True

    def opening(self, columns: list[str]) -> str:
        return "["

    def rows(self, frame: pl.DataFrame) -> Iterator[str]:
        for row in frame.iter_rows(named=True):
            yield ("\n" if self._first else ",\n") + json_visible(json_document(row, default=_json_value))
            self._first = False


FORMATS: dict[str, type[CsvText] | type[JsonText]] = {"csv": CsvText, "json": JsonText}
"""The download formats by name, each a writer of rows as text."""


def csv_chunks(frames: Iterable[pl.DataFrame]) -> Iterator[str]:
    """A header from the first frame's columns, then every row, a frame a chunk."""
    return _chunks(CsvText(), frames)


def json_chunks(frames: Iterable[pl.DataFrame]) -> Iterator[str]:
    """``[`` then one row object per line, then ``]``, a frame a chunk."""
    return _chunks(JsonText(), frames)


def _chunks(text: CsvText | JsonText, frames: Iterable[pl.DataFrame]) -> Iterator[str]:
    opened = False
    for frame in frames:
        yield ("" if opened else text.opening(frame.columns)) + "".join(text.rows(frame))
        opened = True
    if text.closing:
        yield text.closing


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
