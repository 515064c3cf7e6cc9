"""Checked reads of what a model folder declares in YAML (card front matter, mergekit configs).

Such files come from anywhere: a malformed field is dropped with a note saying why, never raised, so one bad field
costs its own value and nothing else.
"""

from __future__ import annotations

from typing import Any


def optional_string(value: Any, field: str, notes: list[str]) -> str | None:
    """``value`` if it is a string or absent; anything else is None, with a note."""
    if value is None or isinstance(value, str):
        return value
    notes.append(f"{field} is a {type(value).__name__}, not a string; ignored")
    return None


def first_line(error: Exception) -> str:
    """An error's first line, at most 200 characters (a YAML error quotes the offending text at length)."""
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__
