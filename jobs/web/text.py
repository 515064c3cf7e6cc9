"""How values look on a page. Hub text is data: every string a template prints goes through `shown` (Jinja's
``finalize``), so invisible and reordering characters are written visibly before autoescaping turns markup
characters into entities; a p-value is always written from its log10 and never as 0."""

from __future__ import annotations

import math
from datetime import date, datetime
from typing import Any

from markupsafe import Markup, escape

from scanner.pairs.results import format_p
from scanner.text_safety import json_document, visible

SHORT_ID_CHARS = 100
"""Ids longer than this end in an ellipsis in lists (the model page shows the whole id)."""


def shown(value: Any) -> Any:
    """Jinja's finalize: text with invisible characters made visible; markup the app built itself passes; None
    prints as nothing."""
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return visible(value)
    return value


def multiline(text: str) -> Markup:
    """Text for a textarea: escaped and visible like any other, its line breaks and tabs kept."""
    return escape(visible(text, keep="\n\r\t"))


def breakable(text: str) -> Markup:
    """An id that may wrap after each ``/`` (organisation, name) and nowhere else: escaped and visible."""
    return Markup(str(escape(visible(text))).replace("/", "/<wbr>"))  # escape() leaves no "/" in an entity


def p_value(log10_p: float | None) -> str:
    """A p-value from its log10 (1e-5000 stays readable), or says there is none."""
    if log10_p is None or not math.isfinite(log10_p):
        return "none"
    return format_p(log10_p)


def percent(probability: float | None) -> str:
    return "—" if probability is None or not math.isfinite(probability) else f"{probability:.0%}"


def fixed(value: float | None, digits: int = 3) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def count(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def moment(value: datetime | date | None) -> str:
    """A stored time in UTC to the minute, a date as a date."""
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M UTC")
    return value.isoformat()


def short(text: str | None, limit: int = SHORT_ID_CHARS) -> str:
    if text is None:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cell(value: Any) -> str:
    """Any value a query returns, as one table cell's text (lists and structs as JSON)."""
    if value is None:
        return "NULL"
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, list | dict | tuple):
        return json_document(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


DISCREPANCY_WORDS = {
    "false_from_scratch": "claims training from scratch, yet its weights depend on another model",
    "undeclared_base": "declares no base model, yet its weights depend on another model",
    "declared_base_independent": "its declared base shows no dependence in the weights",
    "relation_contradicted": "its declared relation to its base is contradicted (blocks or units were dropped)",
}
"""lineage_graph.discrepancies.KINDS in words."""


def discrepancy(kind: str) -> str:
    return DISCREPANCY_WORDS.get(kind, kind)


FILTERS = {"breakable": breakable, "discrepancy": discrepancy, "multiline": multiline, "p_value": p_value,
           "percent": percent, "fixed": fixed, "count": count, "moment": moment, "short": short, "cell": cell}
"""The template filters the app registers, by name."""
