"""`hubtrace serve` as a person meets it: a real server process on a real database, asked over HTTP and looked at in
headless chromium. A scanned hub written through the Store's API (with models whose ids and cards are the hostile
corpus) serves the checks of every page, the downloads, the sealed SQL box and the refusals; a real scan of six zoo
models serves the evidence pages and the screenshots at desktop and phone size."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import socket
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest

from lineage_graph.export import lineage_graph
from lineage_graph.persist import read_lineage, rebuild_lineage
from lineage_graph.stored import family_lineage, pair_lineage
from scanner.store import Store
from scanner.text_safety import visible
from scanner.zoo import Zoo
from tests.fixtures.hostile import HOSTILE_TEXTS
from tests.scan_support import SUBSET, scan_subset
from tests.serve_support import Server, get, hostile_hub, page_url, served_geometry, serving

BASE, CHAT, NIMBUS = "aurora-labs/aurora-base", "finch-nlp/aurora-chat", "nimbus/nimbus-1"
INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")
"""Characters no served page may hold raw (the text_safety.visible set a page would show or obey)."""


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """Two nights of a scanned hub, then the hostile models; the lineage rebuilt. The file and the hostile ids."""
    db = tmp_path_factory.mktemp("serve") / "hub.duckdb"
    with Store(db) as store:
        hostile = hostile_hub(store)
        rebuild_lineage(store)
    return db, hostile


@pytest.fixture(scope="module")
def server(hub: tuple[Path, list[str]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serving(hub[0], tmp_path_factory.mktemp("serve-log") / "stderr.txt") as running:
        yield running


def page(server: Server, path: str, status: int = 200, **params: str) -> str:
    answer = get(page_url(server.url, path, **params))
    assert answer.status == status, (path, params, answer.status, answer.text[:2000])
    assert "Traceback" not in answer.text
    return answer.text


def test_binds_this_machine_only_and_answers_only_get(server: Server) -> None:
    assert server.url.startswith("http://127.0.0.1:")
    port = int(server.url.rstrip("/").rsplit(":", 1)[1])
    assert _listening(port) == {"127.0.0.1"}  # not 0.0.0.0: nothing else on the network reaches it
    front = get(server.url)
    assert front.status == 200 and "default-src 'none'" in front.headers["Content-Security-Policy"]
    assert "script-src" not in front.headers["Content-Security-Policy"]  # no page runs a script
    # a page elsewhere that points a name of its own at 127.0.0.1 (DNS rebinding) reaches nothing
    rebound = get(server.url, headers={"Host": f"evil.example:{server.url.rsplit(':', 1)[1]}"})
    assert rebound.status == 403 and "addressed to this machine" in rebound.text
    assert get(server.url, method="POST").status == 405
    assert get(page_url(server.url, "/sql", q="SELECT 1"), method="POST").status == 405
    # another site's page (an <img> or a link pointing at the SQL box) is refused; the app's own links are not
    sql_box = page_url(server.url, "/sql", q="SELECT 1")
    for site in ("cross-site", "same-site"):
        refused = get(sql_box, headers={"Sec-Fetch-Site": site})
        assert refused.status == 403 and "not requests another site makes" in refused.text
    assert get(sql_box, headers={"Sec-Fetch-Site": "same-origin"}).status == 200


def _listening(port: int) -> set[str]:
    """The local addresses listening on this TCP port, from Linux's socket table (/proc/net/tcp and tcp6)."""
    found = set()
    for table in (Path("/proc/net/tcp"), Path("/proc/net/tcp6")):
        for line in table.read_text().splitlines()[1:] if table.exists() else []:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(socket.inet_ntop(socket.AF_INET if len(address) == 8 else socket.AF_INET6,
                                           bytes.fromhex(address)[::-1] if len(address) == 8 else
                                           b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, 32, 8))))
    return found


def test_front_page_lists_families_largest_first_with_roots(server: Server, hub: tuple[Path, list[str]]) -> None:
    front = page(server, "/")
    hostile_family = re.search(r'href="/family\?id=(hostile[^"]+)"', front)
    assert hostile_family and front.index(hostile_family.group(0)) < front.index('href="/family?id=org/base"')
    org = front.split('href="/family?id=org/base"', 1)[1].split("</tr>", 1)[0]
    assert 'href="/model?id=org/base"' in org and '<td class="num">3</td>' in org  # its root and its size
    assert "models" in front and f"{len(hub[1]) + 6}</strong> models" in front
    assert 'href="/sql"' in front and 'href="/tables"' in front and 'type="search"' in front


def test_search_finds_a_model_by_any_part_of_its_id(server: Server) -> None:
    assert 'href="/model?id=other/indep"' in page(server, "/search", q="her/ind")
    assert 'href="/model?id=org/base"' in page(server, "/search", q="G/BA")  # any case
    found = page(server, "/search", q="ft")
    assert 0 < found.index('href="/model?id=org/ft"') < found.index('href="/model?id=copy/ft"')  # shorter first
    assert "No model id contains" in page(server, "/search", q="%_no such model_%")


def test_model_page_lists_relatives_with_p_values_and_direction(server: Server) -> None:
    model = page(server, "/model", id="org/ft")
    relatives = model.split("<h2>Relatives</h2>", 1)[1].split("</table>", 1)[0]
    base = relatives.split('href="/model?id=org/base"', 1)[1].split("</tr>", 1)[0]
    assert "its parent" in base and "1.00e-60" in base and 'href="/pair?a=org/ft&amp;b=org/base"' in base
    assert "1.00e-55" in relatives.split('href="/model?id=copy/ft"', 1)[1].split("</tr>", 1)[0]
    assert "why this direction" in relatives and "dates:" in relatives
    assert "has no p-value of its own" in model  # closeness and confidence say they are no p-values
    unrelated = model.split("Tested, no dependence found", 1)[1].split("</table>", 1)[0]
    assert 'href="/model?id=other/indep"' in unrelated and "0.3162" in unrelated  # log10 p -0.5
    assert 'href="/family?id=org/base"' in model and "org/base" in model.split("Declared base models", 1)[1][:300]
    errors = page(server, "/model", id="bad/broken")
    assert "Scan errors" in errors and "NaN weights" in errors and "CheckpointError" in errors


def test_pair_page_is_the_evidence_report(server: Server) -> None:
    dependent = page(server, "/pair", a="org/ft", b="org/base")
    assert "Evidence report: org/base vs org/ft" in dependent and "DEPENDENT at FDR q = 0.05" in dependent
    assert "Every statistic on record" in dependent and "hubtrace report org/base org/ft --db" in dependent
    assert "hubtrace-pair-" not in dependent  # the report's command names no private folder of the app
    independent = page(server, "/pair", a="other/indep", b="org/base")
    assert "no evidence of dependence" in independent
    page(server, "/pair", 404, a="org/base", b="bad/broken")


def test_family_page_outlines_every_member_under_its_parent(server: Server, hub: tuple[Path, list[str]]) -> None:
    family = page(server, "/family", id="org/base")
    outline = family.split('<table class="outline">', 1)[1]
    assert [m for m in re.findall(r'<td class="d(\d+)">.*?href="/model\?id=([^"]+)"', outline)] == [
        ("0", "org/base"), ("1", "org/ft"), ("2", "copy/ft")]
    assert "1.00e-60" in outline and family.count('<g class="box') == 3  # drawn: each box a link
    assert 'href="/family/graph?id=org/base"' in family
    graph = get(page_url(server.url, "/family/graph", id="org/base"))
    assert graph.status == 200 and '"copy/ft"' in graph.text and "script-src 'unsafe-inline'" in \
        graph.headers["Content-Security-Policy"]
    hostile = page(server, "/family", id=hub[1][0], q="brien")  # a search inside the family
    assert hostile.count("<td class=\"d") == 1 and "brien" in hostile


def test_stored_lineage_draws_what_hubtrace_graph_draws(hub: tuple[Path, list[str]]) -> None:
    """The pages read the lineage tables, `hubtrace graph` and `hubtrace report` recompute it: the same thing."""
    with Store(hub[0], read_only=True) as store:
        computed = read_lineage(store)
        for family in computed.families:
            stored = family_lineage(store, family.family_id)
            assert stored is not None and stored.families[0].root == family.root
            drawn = [lineage_graph(x, family=family.family_id) for x in (computed, stored)]
            assert [sorted(g.nodes(data=True)) for g in drawn][0] == sorted(drawn[1].nodes(data=True))
            edges = [sorted((u, v, a["tree_link"], a["directed"], a["direction"]) for u, v, a in g.edges(data=True))
                     for g in drawn]
            assert edges[0] == edges[1], family.family_id
        for edge in computed.edges:
            (stored,) = pair_lineage(store, *edge.pair).edges
            assert (stored.dependent, stored.log10_q, stored.direction) == (edge.dependent, edge.log10_q,
                                                                            edge.direction)


def test_unknown_things_are_pages_that_say_so(server: Server) -> None:
    for path, params, said in (("/model", {"id": "nope/x"}, "No model"), ("/family", {"id": "nope"}, "No family"),
                               ("/tables/nope.csv", {}, "No table"), ("/pair", {"a": "x", "b": "y"}, "No test"),
                               ("/nope", {}, "Not Found")):
        assert said in page(server, path, 404, **params)


def test_every_table_downloads_whole_as_csv_and_json(server: Server, hub: tuple[Path, list[str]]) -> None:
    listed = page(server, "/tables")
    with Store(hub[0], read_only=True) as store:
        names = store.query("SELECT table_name FROM information_schema.tables ORDER BY 1")["table_name"].to_list()
        counts = {n: store.query(f'SELECT count(*) AS n FROM "{n}"')["n"][0] for n in names}
    assert {"models", "pair_tests", "lineage_edges", "current_models"} <= set(names)
    for name in names:
        assert f'href="/tables/{name}.csv"' in listed and f'href="/tables/{name}.json"' in listed
        rows = list(csv.reader(io.StringIO(page(server, f"/tables/{name}.csv"))))
        assert len(rows) == counts[name] + 1, name
        assert len(json.loads(page(server, f"/tables/{name}.json"))) == counts[name], name
    models = page(server, "/tables/models.csv")
    assert not INVISIBLE.search(models) and not INVISIBLE.search(page(server, "/tables/models.json"))
    tags = [row[0] for row in csv.reader(io.StringIO(page(server, "/sql.csv", q="SELECT unnest(tags) FROM models")))]
    assert "'=cmd|' /C calc'!A0" in tags and not [t for t in tags if t.startswith(("=", "+", "-", "@"))]


def test_sql_box_reads_and_refuses_every_write(server: Server, hub: tuple[Path, list[str]], tmp_path: Path) -> None:
    db = hub[0]
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    answer = page(server, "/sql", q="SELECT model_id FROM current_models WHERE model_id LIKE 'org/%' ORDER BY 1")
    assert "2 rows" in answer and "<td>org/base</td>" in answer and "<td>org/ft</td>" in answer
    sql = "SELECT model_id, declared_base_models FROM current_models ORDER BY model_id"
    rows = json.loads(page(server, "/sql.json", q=sql))
    assert len(rows) == len(list(csv.reader(io.StringIO(page(server, "/sql.csv", q=sql))))) - 1 > 10
    long = page(server, "/sql", q="SELECT range AS i FROM range(10000000000)")  # read up to the 501st row only
    assert "More than 500 rows, the first 500 shown" in long and "<td>499</td>" in long and "<td>500</td>" not in long
    assert page(server, "/sql.csv", q="SELECT 1 AS one WHERE false") == "one\r\n"  # an empty answer keeps its header
    assert json.loads(page(server, "/sql.json", q="SELECT 1 AS one WHERE false")) == []
    copied = tmp_path / "copied.csv"
    for statement, said in (
            ("CREATE TABLE x (i INTEGER)", "CREATE refused"), ("DROP TABLE models", "DROP refused"),
            (f"COPY models TO '{copied}'", "COPY refused"), ("INSERT INTO models (model_id) VALUES ('x')", "refused"),
            ("SELECT * FROM read_csv('/etc/passwd')", "read_csv() refused: it reads local files"),
            ("SELECT 1; SELECT 2", "exactly one SQL statement"),
            (f"EXPLAIN ANALYZE COPY models TO '{copied}'", "EXPLAIN refused"), ("SELEC 1", "SQL: Parser Error")):
        refused = page(server, "/sql", 400, q=statement)
        assert "Refused." in refused and said in refused, statement
        assert "root:x:0:0" not in refused
        assert get(page_url(server.url, "/sql.csv", q=statement)).status == 400
    assert not copied.exists()
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # not a byte changed
    with Store(db, read_only=True) as store:
        assert "x" not in store.query("SELECT table_name FROM information_schema.tables")["table_name"].to_list()


class _Markup(HTMLParser):
    """Every element and attribute of a page, and its text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: set[str] = set()
        self.attributes: list[tuple[str, str]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attributes += [(name, value or "") for name, value in attrs]

    def handle_data(self, data: str) -> None:
        self.text.append(data)


APP_TAGS = {"html", "head", "meta", "title", "link", "body", "header", "nav", "main", "footer", "form", "input",
            "button", "textarea", "a", "p", "h1", "h2", "h3", "ul", "li", "dl", "dt", "dd", "div", "table", "thead",
            "tbody", "tr", "th", "td", "strong", "b", "code", "pre", "span", "br", "wbr", "details", "summary",
            "article", "section", "img", "svg", "defs", "marker", "path", "line", "g", "rect", "text", "tspan"}
"""The elements the app's templates and the evidence report write: no script, style, iframe or object."""


def _shown_not_obeyed(text: str) -> str:
    """Check a served page holds only the app's own markup and no raw invisible character; return its text."""
    markup = _Markup()
    markup.feed(text)
    assert markup.tags <= APP_TAGS, markup.tags - APP_TAGS
    assert not [a for a in markup.attributes if a[0].startswith("on") or a[0] == "style"], markup.attributes
    assert not [v for n, v in markup.attributes if n in ("href", "src", "action")
                and not v.startswith(("/", "data:image/png;base64,"))]
    shown = "".join(markup.text)
    assert not INVISIBLE.search(text), INVISIBLE.search(text)
    return shown


def test_hostile_text_is_shown_and_never_obeyed(server: Server, hub: tuple[Path, list[str]]) -> None:
    hostile = hub[1]
    pages = [page(server, "/"), page(server, "/discrepancies"), page(server, "/search", q="hostile"),
             page(server, "/tables"), page(server, "/family", id=hostile[0]),
             page(server, "/sql", q="SELECT * FROM current_models WHERE model_id LIKE 'hostile/%'")]
    for i, model_id in enumerate(hostile):
        model = page(server, "/model", id=model_id)
        shown = _shown_not_obeyed(model)
        assert visible(model_id) in shown  # the id as it is, invisible characters spelled out
        pages.append(model)
        if i:
            pages.append(page(server, "/pair", a=hostile[i - 1], b=model_id))
    shown = "".join(_shown_not_obeyed(p) for p in pages)
    for text in HOSTILE_TEXTS:  # every card text reaches some page, visibly, as text
        assert visible(text)[:60] in shown, text
    assert "\\u202eexe.txt" in shown and "\\x1b[31mred" in shown
    graph = page(server, "/family/graph", id=hostile[0])  # the offline page: its own two scripts, nothing more
    assert graph.count("<script") == 2 and not INVISIBLE.search(graph)


# -- a real scan, in a browser -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scanned(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Six zoo models scanned (one family of four, an independent twin, a false declaration), served."""
    root = tmp_path_factory.mktemp("serve-scan")
    with serving(scan_subset(zoo, SUBSET, root), root / "stderr.txt") as running:
        yield running


def test_real_scan_pages_show_the_evidence(scanned: Server) -> None:
    model = page(scanned, "/model", id=NIMBUS)
    relatives = model.split("<h2>Relatives</h2>", 1)[1].split("</table>", 1)[0]
    assert 'href="/model?id=finch-nlp/aurora-chat"' in relatives and re.search(r"\d\.\d\de-\d{3}", relatives)
    assert "claims training from scratch, yet its weights depend on another model" in model
    summary = model.split('<p class="summary">', 1)[1].split("</p>", 1)[0]  # a copy: no parent claimed
    assert "a copy of" in summary and "Its parent" not in summary
    assert "Fingerprints" in model and re.search(r"<code>[0-9a-f]{64}</code>", model)  # the file's sha256
    pair = page(scanned, "/pair", a=NIMBUS, b=BASE)
    assert "<b>Verdict:</b> DEPENDENT at FDR q = 0.05" in pair and pair.count('src="data:image/png;base64,') >= 2
    family = page(scanned, "/family", id=BASE)
    assert family.count('<g class="box') == 4 and 'href="/model?id=nimbus/nimbus-1"' in family


@pytest.mark.parametrize("window", [(1400, 1000), (500, 900)], ids=["desktop", "phone"])
def test_pages_read_well_at_desktop_and_phone_size(scanned: Server, window: tuple[int, int], tmp_path: Path) -> None:
    """Screenshots kept under $HUBTRACE_SCREENSHOTS (default: the test's temporary folder)."""
    shots = Path(os.environ.get("HUBTRACE_SCREENSHOTS", tmp_path))
    width, height = window
    for name, path, params in (("front", "/", {}), ("model", "/model", {"id": NIMBUS}),
                               ("pair", "/pair", {"a": BASE, "b": NIMBUS}), ("family", "/family", {"id": BASE})):
        g = served_geometry(page_url(scanned.url, path, **params), tmp_path, width, height,
                            shots / f"serve-{name}-{'desktop' if width > 1000 else 'phone'}.png")
        assert g["styled"], name  # the app's stylesheet applied
        assert g["page_width"] <= width, (name, g["page_width"])  # nothing pushes the page sideways
        left, top, box_width, box_height = g["search"]
        assert top + box_height <= height and box_width >= 150, (name, g["search"])  # search above the fold
        assert g["smallest_font"][0] >= 12, (name, g["smallest_font"])
        assert g["labels_outside"] == [], name
        for table in g["tables"]:  # wider than the window only inside a box that scrolls
            assert (table["box"] if table["box"] is not None else table["right"]) <= width + 0.5, (name, table)


def test_a_relative_is_named_by_its_kinship_not_said_to_derive() -> None:
    """The model page's words for a relative come from its kinship in the family tree: a sibling or a cousin is
    said to be one (neither derives from the other), an undecided order says so, an ancestor is an ancestor."""
    from jobs.web.views.model import relation

    def row(kinship, parent=None, child=None, decided=False, tree_link=None):
        return {"model_id": "o/other", "kinship": kinship, "parent": parent, "child": child,
                "direction_decided": decided, "tree_link": tree_link}

    assert "sibling" in relation(row("sibling")) and "neither derives" in relation(row("sibling"))
    assert "cousin" in relation(row("cousin"))
    assert "undecided" in relation(row("relative", "o/other", "o/this"))
    assert relation(row("ancestor", "o/other", "o/this", True)).startswith("an ancestor")
    assert relation(row("ancestor", "o/this", "o/other", True)).startswith("a descendant")
    assert relation(row("parent", "o/other", "o/this", True, "tree")) == "its parent"
    assert "undecided" in relation(row("parent", "o/other", "o/this", False, "tree"))
    assert relation(row(None, "o/other", "o/this", True, "tree")) == "its parent"  # a rebuild from before kinships
    assert "derives" not in relation(row("sibling")).replace("neither derives", "")
