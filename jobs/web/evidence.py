"""The pair page's body: `hubtrace report A B`'s own document (lineage_graph.report: verdict, direction, per-block
chart, block and unit maps, metadata, every statistic, how to reproduce), written once per pair into a private
folder and kept: the database cannot change while the app holds it open, so neither can the report. Reports are
kept up to `REPORT_CACHE_BYTES`, not a count: a report holds its models' card text (a licence, declared bases,
ids), which a hub's uploader chooses, so 128 reports of a hostile hub once meant hundreds of megabytes."""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

from cachetools import LRUCache, cached
from markupsafe import Markup

from jobs.web.database import store
from lineage_graph.report import write_report
from lineage_graph.stored import pair_lineage
from scanner.text_safety import html_text

REPORT_FOLDER = "report-folder"
"""What the report's own command line writes into, in place of the private folder the page was drawn in."""
REPORT_CACHE_BYTES = 16 << 20
"""Bytes the kept reports may take in memory, all databases and visitors together (a usual report takes 30 to 60 KB:
about 300 of them); the least recently visited go first."""

_reports: LRUCache = LRUCache(REPORT_CACHE_BYTES, getsizeof=sys.getsizeof)
"""Reports by (database, first id, second id), each weighing what ``sys.getsizeof`` counts of it (a str's characters
at the width CPython stores them in); a report bigger than the whole bound is drawn for each visit and never kept."""

_drawing = threading.Lock()
"""One report drawn at a time: matplotlib's font and figure machinery is not made for threads."""


def report_body(db: Path, model_a: str, model_b: str) -> Markup | None:
    """The report's HTML body (every text in it escaped by lineage_graph.document), or None when the last lineage
    rebuild did not judge this pair."""
    first, second = sorted((model_a, model_b))
    body = _body(str(db), first, second)
    return None if body is None else Markup(body)  # lineage_graph.document escaped every text


@cached(_reports, lock=threading.Lock())
def _body(db: str, first: str, second: str) -> str | None:
    with _drawing, tempfile.TemporaryDirectory(prefix="hubtrace-pair-") as tmp:
        reader = store()
        lineage = pair_lineage(reader, first, second)
        if lineage is None:
            return None
        out = Path(tmp) / "report"
        try:
            page = write_report(reader, lineage, first, second, out, Path(db)).html.read_text(encoding="utf-8")
        except KeyError:  # a model of the pair is no longer current
            return None
    body = page.split("<body>", 1)[1].rsplit("</body>", 1)[0]
    return body.replace(html_text(str(out)), REPORT_FOLDER)
