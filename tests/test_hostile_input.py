"""Hostile input end to end: a hub of models whose ids and cards are crafted against every library that interprets
text, and model folders crafted to hang or exhaust their reader (tests.fixtures.hostile), through scan (real Ray,
real DuckDB), query, graph (every format), report, discrepancies, fingerprint, test and localize.

Every output is read back by a real parser (XML for GraphML/GEXF, pydot for DOT, headless chromium for the page,
html.parser and markdown-it for the report) and must hold the hostile text as text: no element, image, link,
heading, formula or escape sequence that hubtrace did not write itself. Deterministic (fixed corpus, fixed zoo).
"""

from __future__ import annotations

import base64
import csv
import io
import json
import shutil
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

import matplotlib.image
import pydot
import pytest
import ray
import yaml
from click.testing import Result
from markdown_it import MarkdownIt
from rich.console import Console
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from jobs.scan_job import run_scan
from lineage_graph.export import read_graph
from scanner.store import StoreLockedError
from scanner.text_safety import (
    csv_cell,
    dot_string,
    html_text,
    json_document,
    json_visible,
    markdown_text,
    script_json,
    terminal,
    visible,
    xml_text,
)
from scanner.zoo import Zoo
from tests.fixtures.broken import build_broken_corpus
from tests.fixtures.hostile import (
    ACCEPTED,
    HOSTILE_FOLDERS,
    HOSTILE_NAMES,
    HOSTILE_TEXTS,
    SECRET_FILE,
    build_hostile_folders,
    build_hostile_hub,
)
from tests.hang_support import hang_guard
from tests.lineage_support import headless_dom
from tests.scan_support import query, scan_config
from tests.store_support import HOLD_READER, writer_holding

runner = CliRunner()
GOOD, TWIN = "aurora-labs/aurora-base", "tundra-research/tundra-64"
FORMATS = ("graphml", "gexf", "json", "dot", "html", "png")
#: What a terminal would act on: ESC (CSI/OSC sequences), C1 controls, bidi overrides and isolates.
TERMINAL_ACTIVE = ("\x1b", "\x07", "\x9b", "\u202e", "\u202a", "\u2066", "\u2069")
HANG_GUARD_S = 120


def hubtrace(*args: str | Path) -> Result:
    with hang_guard(HANG_GUARD_S):
        result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def refusal(*args: str | Path) -> str:
    """The one line a refused command prints (exit 2, no traceback)."""
    with hang_guard(HANG_GUARD_S):
        result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == EXIT_REFUSED, (args, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    assert result.stderr.startswith("hubtrace: error: ") and result.stderr.count("\n") == 1, result.stderr
    assert not any(c in result.stderr for c in TERMINAL_ACTIVE), result.stderr
    return result.stderr


@pytest.fixture(scope="module")
def hub(zoo: Zoo, tmp_path_factory) -> tuple[Path, list[str], dict]:
    """Copies of aurora-base under hostile ids and cards, the hostile folders, and an independent model."""
    root = tmp_path_factory.mktemp("hostile") / "hub"
    ids = build_hostile_hub(root, zoo[GOOD].path)
    folders = build_hostile_folders(root, zoo[GOOD].path)
    shutil.copytree(zoo[TWIN].path, root / TWIN)
    return root, ids, folders


@pytest.fixture(scope="module")
def scanned(hub, tmp_path_factory):
    """One real scan (local Ray, one actor) of the hostile hub, exporting every format; (config, summary, console
    output)."""
    root, _ids, _folders = hub
    config = scan_config(root, tmp_path_factory.mktemp("hostile-out"), exports=list(FORMATS),
                         ray={"actors": 1, "max_in_flight": 2}, pairs={"batch_size": 50})
    console = io.StringIO()
    summary = run_scan(config, console=Console(file=console, width=200))
    return config, summary, console.getvalue()


# -- the escapes themselves --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", HOSTILE_TEXTS + HOSTILE_NAMES)
def test_each_escape_holds_the_text_as_text(text: str) -> None:
    assert not any(c in terminal(text) for c in TERMINAL_ACTIVE)
    assert ET.fromstring(f"<a>{xml_escape(xml_text(text))}</a>").text == xml_text(text)  # XML 1.0 holds it
    assert "<" not in script_json({"t": text}) and json.loads(script_json({"t": text})) == {"t": text}
    rendered = MarkdownIt("commonmark", {"html": True}).render(markdown_text(text))
    assert rendered == f"<p>{_html_escape(visible(text))}</p>\n"
    assert not csv_cell(text).startswith(("=", "+", "-", "@"))
    graph = pydot.graph_from_dot_data(f"digraph {{ {dot_string(text)} [label={dot_string(text)}]; }}")[0]
    assert len(graph.get_nodes()) == 1


#: Characters drawn as nothing (Unicode's Default_Ignorable_Code_Point: soft hyphen, combining grapheme joiner, Hangul
#: fillers, Khmer inherent vowels, Mongolian selectors and U+180E, invisible operators, variation selectors, tags,
#: shorthand and musical format controls) and noncharacters: issue 24 found 21 of 25 such passing raw.
INVISIBLE = ("\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b\u180e\u200b\u200d\u2060\u2064\u206a\u3164\ufe00"
             "\ufe0f\ufeff\uffa0\U0001bca0\U0001d173\U000e0001\U000e0041\U000e0100\U000e01ef")
NONCHARACTERS = "\ufdd0\ufdef\ufffe\uffff\U0001fffe\U0010ffff"


def test_invisible_and_noncharacter_code_points_are_made_visible_everywhere() -> None:
    for char in INVISIBLE + NONCHARACTERS:
        text = f"acme/ba{char}se"
        for escaped in (visible(text), terminal(text), xml_text(text), html_text(text), markdown_text(text)):
            assert char not in escaped, (hex(ord(char)), escaped)
        assert ET.fromstring(f"<a>{xml_escape(xml_text(text))}</a>").text == xml_text(text)
        assert json.loads(json_visible(json.dumps(text, ensure_ascii=False))) == text  # the same JSON value
        assert char not in json_visible(json.dumps(text, ensure_ascii=False))
    assert len(INVISIBLE) == 25


def test_json_documents_have_no_nan_or_infinity() -> None:
    text = json_document({"p": float("nan"), "q": [float("inf"), -float("inf")], "r": 0.5})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in a JSON document")) == \
        {"p": None, "q": [None, None], "r": 0.5}


def _html_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


# -- scan, store, query ------------------------------------------------------------------------------------------


def test_scan_keeps_hostile_text_verbatim_and_refuses_hostile_folders(scanned, hub) -> None:
    config, summary, console = scanned
    _root, ids, folders = hub
    assert summary.failed == len(folders) and summary.fingerprinted == len(ids) + 1
    stored = dict(query(config.db_path, "SELECT model_id, license FROM current_models WHERE status = 'ok'").iter_rows())
    assert set(stored) == set(ids) | {TWIN}
    assert {stored[i] for i in ids} == set(HOSTILE_TEXTS[: len(ids)])  # data, stored as it came
    errors = dict(query(config.db_path, "SELECT model_id, reason FROM scan_errors").iter_rows())
    assert set(errors) == set(folders)
    for model_id, entry in folders.items():
        assert entry.reason in errors[model_id], (model_id, errors[model_id])
    assert "[export]" not in console and set(summary.exports) == set(FORMATS)
    assert not any(c in console for c in TERMINAL_ACTIVE)


def test_query_outputs_hold_hostile_text_safely(scanned, hub, tmp_path: Path) -> None:
    config, _summary, _console = scanned
    _root, ids, _folders = hub
    db = config.db_path
    sql = "SELECT model_id, license, tags FROM current_models WHERE model_id LIKE 'hostile/%' ORDER BY model_id"
    table = hubtrace("query", "--db", db, sql).stdout
    assert not any(c in table for c in TERMINAL_ACTIVE)
    answer = json.loads(hubtrace("query", "--db", db, sql, "--format", "json").stdout)
    assert [r["model_id"] for r in answer] == sorted(ids)  # JSON escapes, the value is exact
    cells = [cell for row in csv.reader(io.StringIO(hubtrace("query", "--db", db, sql, "--format", "csv").stdout))
             for cell in row]
    assert cells and not any(cell.startswith(("=", "+", "-", "@")) for cell in cells)
    # nothing dropped: every model but those refused at discovery (links out of the tree) has its row
    refused_early = query(db, "SELECT count(*) FROM scan_errors WHERE stage = 'discover'").item()
    assert json.loads(hubtrace("query", "--db", db, "SELECT count(*) AS n FROM models", "--format", "json").stdout) \
        == [{"n": len(ids) + 1 + len(HOSTILE_FOLDERS) - refused_early}]
    injected = json.loads(hubtrace("query", "--db", db, "--depends-on", ids[9], "--format", "json").stdout)
    assert {r["model_id"] for r in injected} == set(ids) - {ids[9]}  # the SQL-quote id is a parameter, not SQL

    target = tmp_path / "written.csv"
    assert "refused" in refusal("query", "--db", db, f"EXPLAIN ANALYZE COPY models TO '{target}'")
    assert "refused" in refusal("query", "--db", db, f"EXPLAIN (ANALYZE) COPY models TO '{target}'")
    assert not target.exists()
    secret = tmp_path / "secret.txt"
    secret.write_text("local file\n")
    for reading in (f"SELECT * FROM read_text('{secret}')", f"SELECT * FROM read_csv('{secret}')",
                    f"SELECT * FROM glob('{tmp_path}/*')"):
        assert "refused: it reads local files" in refusal("query", "--db", db, reading)
    assert "LOAD refused" in refusal("query", "--db", db, "INSTALL httpfs")
    opened = json.loads(hubtrace("query", "--db", db, f"SELECT content FROM read_text('{secret}')",
                                 "--allow-local-files", "--format", "json").stdout)
    assert opened == [{"content": "local file\n"}]


def test_a_second_scan_names_the_reader_before_ray_starts(scanned, tmp_path: Path) -> None:
    config, _summary, _console = scanned
    with writer_holding(config.db_path, HOLD_READER) as reader:
        with pytest.raises(StoreLockedError, match=rf"open read-only by process {reader.pid} "):
            run_scan(config, console=Console(file=io.StringIO()))
        assert not ray.is_initialized()
        (tmp_path / "scan.yaml").write_text(yaml.safe_dump(config.to_json_dict()))
        with hang_guard(HANG_GUARD_S):
            result = runner.invoke(app, ["scan", "--config", str(tmp_path / "scan.yaml")])
        assert result.exit_code == EXIT_REFUSED and result.stderr.count("\n") == 1, result.output
        assert f"open read-only by process {reader.pid}" in result.stderr


# -- graph exports -----------------------------------------------------------------------------------------------


def _exported(scanned, fmt: str) -> Path:
    return Path(scanned[1].exports[fmt])


def test_every_graph_format_parses_with_every_model(scanned, hub) -> None:
    _root, ids, _folders = hub
    data = json.loads(_exported(scanned, "json").read_text())
    nodes = {n["id"] for n in data["nodes"]}
    assert set(ids) <= nodes  # exact ids: JSON holds any text
    for fmt, read in (("graphml", read_graph), ("gexf", read_graph)):
        ET.parse(_exported(scanned, fmt))  # well-formed XML 1.0 (control characters would make it fail)
        assert set(read(_exported(scanned, fmt)).nodes) == {xml_text(n) for n in nodes}, fmt
    dot = pydot.graph_from_dot_file(str(_exported(scanned, "dot")))
    assert len(dot) == 1
    drawn = [n for sub in dot[0].get_subgraphs() for n in sub.get_nodes()]
    assert len(drawn) == len(nodes) and len(dot[0].get_edges()) == len(data["links"])
    image = matplotlib.image.imread(_exported(scanned, "png"))
    assert image.ndim == 3 and image.shape[0] > 100


class _Elements(HTMLParser):
    """Every start tag with its attributes, and every text run, of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[tuple[str | None, str]] = []  # (innermost open tag, text)
        self._open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in {"img", "meta", "input", "br", "hr"}:
            self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in self._open:
            del self._open[len(self._open) - 1 - self._open[::-1].index(tag):]

    def handle_data(self, data: str) -> None:
        self.text.append((self._open[-1] if self._open else None, data))

    def inside(self, *tags: str) -> list[str]:
        return [text for tag, text in self.text if tag in tags]


def elements(page: str) -> _Elements:
    parser = _Elements()
    parser.feed(page)
    parser.close()
    return parser


PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "div", "h2", "p", "input", "label", "svg", "defs",
             "marker", "path", "g", "rect", "text", "tspan", "line", "script", "ul", "li"}  # ul/li: the link legend


@pytest.mark.slow
def test_lineage_page_draws_every_model_and_nothing_injected(scanned, tmp_path: Path) -> None:
    page = _exported(scanned, "html")
    nodes = {n["id"] for n in json.loads(_exported(scanned, "json").read_text())["nodes"]}
    with hang_guard(HANG_GUARD_S):
        dom = headless_dom(page, tmp_path / "p")
    found = elements(dom)
    drawn = {attrs["data-id"] for tag, attrs in found.tags if tag == "g" and "data-id" in attrs}
    assert drawn == {visible(n) for n in nodes}  # every node drawn, its id shown with invisible characters visible
    assert {tag for tag, _ in found.tags} <= PAGE_TAGS, {tag for tag, _ in found.tags} - PAGE_TAGS
    assert sum(tag == "script" for tag, _ in found.tags) == 2
    assert not [(t, a) for t, attrs in found.tags for a in attrs if a.startswith("on")]
    assert sum(tag == "line" for tag, _ in found.tags) >= 1


# -- evidence reports --------------------------------------------------------------------------------------------


REPORT_SECTIONS = {"Discrepancies", "Per-block evidence", "Block map", "Models and revisions",
                   "Every statistic on record", "Reproduce"}


@pytest.mark.parametrize("pair", [(0, 1), (4, 6), (11, 9)])
def test_report_shows_card_text_and_only_its_own_images(scanned, hub, tmp_path: Path, pair) -> None:
    config, _summary, _console = scanned
    _root, ids, _folders = hub
    out = tmp_path / "report"
    hubtrace("report", ids[pair[0]], ids[pair[1]], "--db", config.db_path, "--out", out)
    own = sorted(p.read_bytes() for p in out.glob("*.png"))
    secret = Path(SECRET_FILE).read_bytes()

    page = (out / "report.html").read_text(encoding="utf-8")
    found = elements(page)
    images = [attrs["src"] for tag, attrs in found.tags if tag == "img"]
    assert sorted(base64.b64decode(src.removeprefix("data:image/png;base64,")) for src in images) == own
    assert not {tag for tag, _ in found.tags} & {"script", "a", "svg", "iframe", "object", "embed", "link", "form"}
    assert not [(t, a) for t, attrs in found.tags for a in attrs if a.startswith("on")]
    assert len(found.inside("h1")) == 1 and set(found.inside("h2")) <= REPORT_SECTIONS
    assert found.inside("b").count("Verdict:") == 1  # card text cannot forge a second verdict
    assert secret[:64].decode(errors="replace") not in page and base64.b64encode(secret[:48]).decode() not in page

    markdown = (out / "report.md").read_text(encoding="utf-8")
    rendered = elements(MarkdownIt("commonmark", {"html": True}).enable("table").render(markdown))
    assert sorted(attrs["src"] for tag, attrs in rendered.tags if tag == "img") == sorted(
        name for name in ("blocks.png", "unit_map.png") if (out / name).exists())
    assert not {tag for tag, _ in rendered.tags} & {"script", "a", "svg", "iframe", "object", "embed", "h3", "h4"}
    assert len(rendered.inside("h1")) == 1 and set(rendered.inside("h2")) <= REPORT_SECTIONS
    assert rendered.inside("strong").count("Verdict:") == 1
    assert not any(c in markdown for c in TERMINAL_ACTIVE)


def test_discrepancies_print_hostile_text_inert(scanned) -> None:
    config, _summary, _console = scanned
    text = hubtrace("discrepancies", "--db", config.db_path).stdout
    assert text and not any(c in text for c in TERMINAL_ACTIVE)
    listed = json.loads(hubtrace("discrepancies", "--db", config.db_path, "--json").stdout)
    assert all(isinstance(d["model_id"], str) for d in listed)


# -- hostile folders through every command that opens a model -----------------------------------------------------


def test_every_command_refuses_hostile_folders_in_one_line(hub, zoo: Zoo, tmp_path: Path) -> None:
    root, _ids, folders = hub
    good = zoo[GOOD].path
    for model_id, entry in folders.items():
        folder = root / model_id
        for command in (["test", folder, good], ["test", "--fingerprint", folder, good],
                        ["fingerprint", folder, "--out", tmp_path / "fp.safetensors"], ["localize", folder, good]):
            assert entry.reason in refusal(*command), (model_id, command)
        followed = ["fingerprint", folder, "--out", tmp_path / "followed.safetensors", "--follow-links"]
        if entry.followed == ACCEPTED:
            hubtrace(*followed)
        else:
            assert (entry.followed or entry.reason) in refusal(*followed), model_id
    assert not (tmp_path / "fp.safetensors").exists()


def test_fingerprint_refuses_the_broken_corpus_like_test_does(zoo: Zoo, tmp_path: Path) -> None:
    reasons = build_broken_corpus(tmp_path, zoo[GOOD].path)
    for model_id, reason in reasons.items():
        assert reason.lower() in refusal("fingerprint", tmp_path / model_id, "--out", tmp_path / "x.fp").lower()
    assert not (tmp_path / "x.fp").exists()
