"""`hubtrace lineage | graph | discrepancies | report` end to end on a real scan database: six zoo models
fingerprinted, tested and stored by the scan's own steps (Ray left out), then each command's output read back:
the rebuilt tables, the discrepancies, every graph format parsed again, the evidence report and its images, and
a one-line refusal (exit 2, no traceback) for every failure.

Deterministic (fixed zoo, fixed canonical inputs): the weakest dependent pair measures log10 p = -425 and the
strongest independent one -1.25, far from any FDR cut.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shlex
import shutil
from pathlib import Path

import matplotlib.image
import pytest
from click.testing import Result
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE
from lineage_graph.export import FORMATS, read_graph
from scanner.zoo import Zoo
from tests.scan_support import SUBSET, query, scan_subset

runner = CliRunner()
BASE, CHAT, LITE, NIMBUS = "aurora-labs/aurora-base", "finch-nlp/aurora-chat", "kestrel/aurora-lite", "nimbus/nimbus-1"
TUNDRA, EMBER = "tundra-research/tundra-64", "ember-ml/ember-small"
AURORA = {BASE, CHAT, LITE, NIMBUS}  # one family, every pair of it dependent; the other two pairs of SUBSET are not
SUMMARY = (r"6 models, 15 tested pairs, 6 dependent \(FDR q={q}, {method}\), 1 families with relatives, "
           r"[0-6] directions undecided \(confidence < {level}\), 3 discrepancies\n")
"""The rebuild's one line; any of its 6 dependent pairs may lean below the level (the zoo's last bits decide)."""


@pytest.fixture(scope="module")
def db(zoo: Zoo, tmp_path_factory) -> Path:
    """SUBSET as a finished scan leaves it (models, fingerprint files, 15 pair tests, lineage rebuilt at the default
    q = 0.05, BH), written by the scan's own discovery, fingerprinting, storing, planning and lineage steps."""
    return scan_subset(zoo, SUBSET, tmp_path_factory.mktemp("lineage-cli"))


def hubtrace(*args: str | Path) -> Result:
    """A command that must succeed."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def refusal(*args: str | Path) -> str:
    """The one line a refused command prints, after checking it is one line on stderr and exit status 2."""
    result = runner.invoke(app, [str(a) for a in args])
    assert result.exit_code == EXIT_REFUSED, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert result.stdout == "" and result.stderr.startswith("hubtrace: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def graph_json(db: Path, out: Path, *args: str) -> dict:
    """`hubtrace graph --format json` read back as node-link data."""
    hubtrace("graph", "--db", db, "--format", "json", "--out", out, *args)
    return json.loads(out.read_text())


def nodes(data: dict) -> set[str]:
    return {n["id"] for n in data["nodes"]}


def test_lineage_rebuilds_with_the_asked_fdr_and_keeps_family_ids(db: Path, tmp_path: Path) -> None:
    copy = shutil.copy(db, tmp_path / "scan.duckdb")  # a writer: leave the module's database as the scan left it
    families_sql = "SELECT family_id, n_members, first_built_at, built_at, q, method FROM families ORDER BY family_id"
    scanned = query(copy, families_sql)
    assert scanned["family_id"].to_list() == [BASE, EMBER, TUNDRA] and scanned["n_members"].to_list() == [4, 1, 1]

    summary = SUMMARY.format(q=0.05, method="bh", level=DEFAULT_MIN_DIRECTION_CONFIDENCE)
    assert re.fullmatch(summary, hubtrace("lineage", "--db", copy).stdout)
    rebuilt = query(copy, families_sql)
    assert rebuilt["family_id"].to_list() == scanned["family_id"].to_list()
    assert all(after > before for after, before in zip(rebuilt["built_at"], scanned["built_at"]))
    edges_sql = "SELECT model_a, model_b, log10_q, dependent, q, method FROM lineage_edges ORDER BY model_a, model_b"
    bh = query(copy, edges_sql)

    by_run = hubtrace("lineage", "--db", copy, "--q", "0.01", "--method", "by")
    assert re.fullmatch(SUMMARY.format(q=0.01, method="by", level=DEFAULT_MIN_DIRECTION_CONFIDENCE), by_run.stdout)
    by = query(copy, edges_sql)
    assert set(by.select("q", "method").iter_rows()) == {(0.01, "by")}
    refit, kept = query(copy, families_sql), ["family_id", "n_members", "first_built_at"]
    assert refit.select(kept).equals(scanned.select(kept))  # same ids and sizes, first build date kept
    assert set(refit.select("q", "method").iter_rows()) == {(0.01, "by")}
    # BY's adjusted p-values are BH's times c(15) = 1 + 1/2 + ... + 1/15 (below the cap at 1)
    c = math.log10(sum(1 / i for i in range(1, 16)))
    assert by["dependent"].sum() == 6 and bh["dependent"].sum() == 6
    assert [q_by - q_bh for q_by, q_bh, d in zip(by["log10_q"], bh["log10_q"], bh["dependent"]) if d] == \
        pytest.approx([c] * 6)
    # the read-only commands recompute with the q and method of the last rebuild
    assert graph_json(copy, tmp_path / "g.json")["graph"] == {"q": 0.01, "method": "by", "statistic": "match"}


def test_discrepancies_name_the_planted_cards_and_no_honest_model(db: Path) -> None:
    found = json.loads(hubtrace("discrepancies", "--db", db, "--json").stdout)
    # nimbus is a camouflaged copy of chat (which of the two is the original, the weights cannot say), and chat
    # derives from the base by a decided link: the copy's from-scratch claim is contradicted through the base
    assert {(d["model_id"], d["kind"], d["related_model"]) for d in found} == {
        (NIMBUS, "false_from_scratch", BASE), (LITE, "undeclared_base", BASE),
        (EMBER, "declared_base_independent", BASE)}
    assert f"copy of {CHAT}" in next(d["detail"] for d in found if d["model_id"] == NIMBUS)
    assert not {d["model_id"] for d in found} & {BASE, CHAT, TUNDRA}
    assert [d["confidence"] for d in found] == sorted((d["confidence"] for d in found), reverse=True)
    stored = query(db, "SELECT log10_p FROM pair_tests WHERE model_a = ? AND model_b = ?", [BASE, CHAT])
    nimbus = next(d for d in found if d["model_id"] == NIMBUS)
    assert nimbus["evidence"]["log10_p"] == stored["log10_p"][0] < -200
    assert all(d["model_id"] in d["detail"] and d["related_model"] in d["detail"] for d in found)

    text = hubtrace("discrepancies", "--db", db).stdout
    assert TUNDRA not in text
    lines = text.splitlines()
    assert [line.split()[:2] for line in lines] == [[d["model_id"], d["kind"]] for d in found]
    assert all(f"conf {d['confidence']:.2f}" in line for d, line in zip(found, lines))


def test_graph_and_discrepancies_read_what_the_rebuild_stored(db: Path, tmp_path: Path) -> None:
    """Neither command recomputes the lineage: what they print is what the last rebuild stored, here edited by hand
    in a copy of the database (a recomputation would restore it)."""
    from scanner.store import Store

    copy = tmp_path / "copy.duckdb"
    shutil.copy(db, copy)
    with Store(copy) as store:
        store.connection.execute("UPDATE discrepancies SET detail = 'as stored' WHERE model_id = ?", [LITE])
        store.connection.execute("UPDATE lineage_edges SET direction_reasons = ['stored reason'] WHERE dependent")
    assert "as stored" in hubtrace("discrepancies", "--db", copy).stdout
    links = graph_json(copy, tmp_path / "g.json")["links"]
    assert links and all(link["reasons"] == "stored reason" for link in links)
    assert nodes(graph_json(copy, tmp_path / "f.json", "--family", BASE)) == AURORA


def test_graph_writes_every_format_so_that_it_parses_back(db: Path, tmp_path: Path) -> None:
    dependent = {frozenset((a, b)) for a in AURORA for b in AURORA if a < b}
    for fmt in FORMATS:
        out = tmp_path / f"lineage.{fmt}"
        written = hubtrace("graph", "--db", db, "--format", fmt, "--out", out)
        assert written.stdout == f"wrote {out} (6 models, 6 edges)\n"
    for reread in (read_graph(tmp_path / "lineage.graphml"), read_graph(tmp_path / "lineage.gexf")):
        assert set(reread.nodes) == set(SUBSET) and {frozenset(e) for e in reread.edges} == dependent
        assert reread.nodes[NIMBUS]["discrepancies"] == "false_from_scratch" and reread.nodes[BASE]["is_root"]
    data = json.loads((tmp_path / "lineage.json").read_text())
    assert nodes(data) == set(SUBSET) and {frozenset((e["source"], e["target"])) for e in data["links"]} == dependent
    dot = (tmp_path / "lineage.dot").read_text()
    assert dot.startswith("digraph") and all(f'"{m}"' in dot for m in SUBSET)
    image = matplotlib.image.imread(tmp_path / "lineage.png")
    assert image.shape[0] > 200 and image.shape[1] > 200 and image[..., :3].std() > 0.01  # drawn, not blank
    page = (tmp_path / "lineage.html").read_text()
    embedded = re.search(r'<script type="application/json" id="graph-data">(.*?)</script>', page, flags=re.DOTALL)
    shown = json.loads(embedded.group(1))
    assert nodes(shown) == set(SUBSET) and {frozenset((e["source"], e["target"])) for e in shown["edges"]} == dependent
    assert not re.findall(r"https?://(?!www\.w3\.org/2000/svg\b)", page)  # opens offline: nothing to fetch


def test_graph_family_and_model_keep_what_the_docs_say(db: Path, tmp_path: Path) -> None:
    (family,) = query(db, "SELECT family_id FROM family_members WHERE model_id = ?", [LITE])["family_id"]
    whole = graph_json(db, tmp_path / "family.json", "--family", family)
    assert nodes(whole) == AURORA and len(whole["links"]) == 6
    assert nodes(graph_json(db, tmp_path / "tundra.json", "--family", TUNDRA)) == {TUNDRA}
    # --model: the model and every model it depends on (here its whole family; an independent model stands alone)
    assert nodes(graph_json(db, tmp_path / "lite.json", "--model", LITE)) == AURORA
    alone = graph_json(db, tmp_path / "ember.json", "--model", EMBER)
    assert nodes(alone) == {EMBER} and alone["links"] == []

    out = tmp_path / "refused.json"
    assert "no family 'nope'" in refusal("graph", "--db", db, "--format", "json", "--out", out, "--family", "nope")
    assert "no model 'nope'" in refusal("graph", "--db", db, "--format", "json", "--out", out, "--model", "nope")
    assert "--family and --model are alternatives" in refusal(
        "graph", "--db", db, "--format", "json", "--out", out, "--family", family, "--model", TUNDRA)
    assert not out.exists()


def _images(markdown: str) -> list[str]:
    return re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", markdown, flags=re.MULTILINE)


def _section(markdown: str, title: str) -> str:
    return markdown.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_report_carries_the_evidence_and_reproduces(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "base-nimbus"
    assert hubtrace("report", BASE, NIMBUS, "--db", db, "--out", out).stdout == \
        f"wrote {out / 'report.md'} and {out / 'report.html'}\n"
    md = (out / "report.md").read_text()
    assert "**Verdict:** DEPENDENT at FDR q = 0.05 (BH): p = " in md
    assert "| block A | block B | rho | units | log10 p |" in md
    assert re.findall(r"^\| (\d) \| (\d) \| [01]\.\d{3} \| 128 \| -\d+\.\d\d \|$", md, flags=re.MULTILINE) == \
        [(str(i), str(i)) for i in range(4)]
    assert "0→0, 1→1, 2→2, 3→3" in _section(md, "Block map")  # from scanner.pairs.localize on the stored fingerprints
    for model_id, revision in query(db, "SELECT model_id, revision FROM current_models WHERE model_id IN (?, ?)",
                                    [BASE, NIMBUS]).iter_rows():
        assert f"| {model_id} | {revision} | ok |" in md

    # every image it shows is written beside it, and the HTML carries each one inline
    assert _images(md) == ["blocks.png", "unit_map.png"]
    assert sorted(p.name for p in out.glob("*.png")) == ["blocks.png", "unit_map.png"]
    page = (out / "report.html").read_text()
    sources = re.findall(r'src="([^"]*)"', page)
    assert [base64.b64decode(s.removeprefix("data:image/png;base64,")) for s in sources] == \
        [(out / name).read_bytes() for name in _images(md)]
    assert all(s.startswith("data:image/png;base64,") for s in sources)
    assert "href=" not in page and "url(" not in page and not re.search(r"https?://", page)

    # the report's own commands: the first rewrites the same report, the second retests the pair from the weights
    reproduce = _section(md, "Reproduce")
    command, retest = (shlex.split(line) for line in re.findall(r"^    (hubtrace .*)$", reproduce, flags=re.MULTILINE))
    assert command == ["hubtrace", "report", BASE, NIMBUS, "--db", str(db), "--out", str(out)]
    hubtrace(*command[1:])
    assert (out / "report.md").read_text() == md
    # written from the verdict the last rebuild stored, it says what a recomputation of the whole lineage says
    from lineage_graph.persist import read_lineage
    from lineage_graph.report import write_report
    from scanner.store import Store

    with Store(db, read_only=True) as store:
        recomputed = write_report(store, read_lineage(store), BASE, NIMBUS, out, db).markdown.read_text()
    assert recomputed == md
    stored = query(db, "SELECT log10_p FROM pair_tests WHERE model_a = ? AND model_b = ?", [BASE, NIMBUS])
    assert json.loads(hubtrace(*retest[1:], "--json").stdout)["log10_p"] == pytest.approx(stored["log10_p"][0])


def test_report_on_independent_twins_says_no_dependence(db: Path, tmp_path: Path) -> None:
    out = tmp_path / "base-tundra"
    hubtrace("report", BASE, TUNDRA, "--db", db, "--out", out)
    md = (out / "report.md").read_text()
    assert "**Verdict:** no evidence of dependence at FDR q = 0.05 (BH): p = " in md
    assert "DEPENDENT" not in md and "**Direction:**" not in md and "**Family:**" not in md
    assert "(none)" in _section(md, "Block map")
    assert _images(md) == ["blocks.png"] and [p.name for p in out.glob("*.png")] == ["blocks.png"]
    assert md.count(f"hubtrace report {BASE} {TUNDRA} --db {db} --out {out}") == 1


def test_every_failure_is_one_line_and_exit_2(db: Path, tmp_path: Path) -> None:
    absent = tmp_path / "absent.duckdb"
    out = tmp_path / "out"
    for args in (["lineage"], ["discrepancies"], ["graph", "--format", "json", "--out", out],
                 ["report", BASE, NIMBUS, "--out", out]):
        assert f"no database at {absent}" in refusal(*args, "--db", absent)
    assert not absent.exists() and not out.exists()  # not even the writer creates an empty database

    assert "model 'nope/x' is not in the store" in refusal("report", BASE, "nope/x", "--db", db, "--out", out)
    assert "unknown format 'bmp'; choose one of graphml, gexf, json, dot, html, png" in refusal(
        "graph", "--db", db, "--format", "bmp", "--out", tmp_path / "g.bmp")
    assert not (tmp_path / "g.bmp").exists()
    assert "--method must be one of bh, by" in refusal("lineage", "--db", db, "--method", "holm")
    assert "--q in (0, 1)" in refusal("lineage", "--db", db, "--q", "1.5")

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    assert f"cannot write {blocker / 'g.json'}" in refusal(
        "graph", "--db", db, "--format", "json", "--out", blocker / "g.json")
    assert f"cannot write the report into {blocker}" in refusal("report", BASE, NIMBUS, "--db", db, "--out", blocker)
