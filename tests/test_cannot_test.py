"""Issue 43: a pair the statistic cannot read is reported as "cannot test", with the reason, everywhere a result
goes (the verdict line, the JSON, the database, the scan summary), and never as p = 1 or "no evidence of
dependence". The model: the zoo's base with every MLP's output projection zeroed (its MLPs write nothing, so the
canonical form drops every unit: padding taken to its end)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from jobs.cli import app
from scanner.zoo import Zoo
from tests.scan_support import copy_models, query, scan_folder

BASE, CHAT = "aurora-labs/aurora-base", "finch-nlp/aurora-chat"
DEAD = "padding-co/aurora-silent"


@pytest.fixture(scope="module")
def hub(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The base, a fine-tune of it, and the base with MLPs that write nothing."""
    root = copy_models(zoo, (BASE, CHAT), tmp_path_factory.mktemp("cannot-test") / "hub")
    shutil.copytree(root / BASE, root / DEAD)
    weights = load_file(root / DEAD / "model.safetensors")
    silenced = {name: t.zero_() if name.endswith("mlp.down_proj.weight") else t for name, t in weights.items()}
    assert sum(name.endswith("mlp.down_proj.weight") for name in silenced) == 4
    save_file(silenced, root / DEAD / "model.safetensors", metadata={"format": "pt"})
    return root


def test_the_command_says_cannot_test_and_why(hub: Path) -> None:
    runner = CliRunner()
    as_json = runner.invoke(app, ["test", str(hub / BASE), str(hub / DEAD), "--json"])
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert data["log10_p"] is None and "too few informative units" in data["cannot_test"]
    assert data["verdict"].startswith("CANNOT TEST") and "independen" not in data["verdict"].split(";")[0]
    table = runner.invoke(app, ["test", str(hub / DEAD), str(hub / BASE)])
    assert table.exit_code == 0, table.output
    assert "CANNOT TEST" in table.stdout and "no evidence of dependence" not in table.stdout


def test_a_scan_stores_no_p_value_and_counts_the_pair(hub: Path, tmp_path: Path) -> None:
    db = scan_folder(hub, tmp_path)
    tests = {(a, b): (p, reason) for a, b, p, reason in
             query(db, "SELECT model_a, model_b, log10_p, cannot_test FROM pair_tests").iter_rows()}
    assert len(tests) == 3
    for pair, (log10_p, reason) in tests.items():
        if DEAD in pair:
            assert log10_p is None and reason, pair
        else:
            assert log10_p <= -20 and reason is None, pair
    summary = json.loads(query(db, "SELECT summary FROM scan_runs")["summary"][0])
    assert summary["pairs_cannot_test"] == 2
    edges = query(db, "SELECT model_a, model_b FROM lineage_edges")
    assert DEAD not in set(edges["model_a"]) | set(edges["model_b"])


def test_localize_says_which_block_pairs_it_could_not_test(hub: Path) -> None:
    from scanner.fingerprints.fingerprint import fingerprint_model
    from scanner.pairs.localize import localize

    result = localize(fingerprint_model(hub / BASE), fingerprint_model(hub / DEAD))
    assert not result.map
    assert any(note.startswith("16 of 16 block pairs could not be tested") for note in result.notes), result.notes
