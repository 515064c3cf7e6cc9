"""`hubtrace test` end to end on zoo models: JSON shape, table verdicts, and refusals without tracebacks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from scanner.zoo import Zoo
from scanner.zoo.arch import ArchSpec, new_model, save_model

BASE = "aurora-labs/aurora-base"
CHAT = "finch-nlp/aurora-chat"
LITE = "kestrel/aurora-lite"
COBALT = "cobalt-ai/cobalt-base"

runner = CliRunner()


def hubtrace(*args: str):
    return runner.invoke(app, list(args))


def test_json_output_has_the_documented_fields(zoo: Zoo) -> None:
    result = hubtrace("test", str(zoo[BASE].path), str(zoo[CHAT].path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"model_a", "model_b", "statistic", "log10_p", "layers", "n_layers", "inputs", "notes"} <= data.keys()
    assert data["statistic"] == "match" and data["n_layers"] == 4
    assert [(x["layer_a"], x["layer_b"]) for x in data["layers"]] == [(i, i) for i in range(4)]
    assert data["inputs"] == "v1-seed0-4x64-ids<256"
    assert data["log10_p"] <= -20 and data["verdict"].startswith("DEPENDENT")


def test_table_gives_a_verdict_and_every_block(zoo: Zoo) -> None:
    result = hubtrace("test", str(zoo[BASE].path), str(zoo[COBALT].path), "--stat", "up")
    assert result.exit_code == 0, result.output
    assert "no evidence of dependence at alpha=0.01" in result.stdout
    assert sum(line.lstrip().startswith(("0 ", "1 ", "2 ", "3 ")) for line in result.stdout.splitlines()) >= 4


def test_depth_mismatch_uses_the_common_prefix_and_says_so(zoo: Zoo) -> None:
    data = json.loads(hubtrace("test", str(zoo[BASE].path), str(zoo[LITE].path), "--json").stdout)
    assert data["n_layers"] == 3 and len(data["layers"]) == 3
    assert any("depths differ (4 vs 3 blocks)" in note for note in data["notes"])


def test_jsd_reports_a_raw_value_and_no_pvalue(zoo: Zoo) -> None:
    data = json.loads(hubtrace("test", str(zoo[BASE].path), str(zoo[CHAT].path), "--stat", "jsd", "--json").stdout)
    assert data["log10_p"] is None and data["value"] > 0
    assert any("no valid null" in note for note in data["notes"])


def test_l2_pvalue_sits_on_the_permtest_grid(zoo: Zoo) -> None:
    args = ("test", str(zoo[BASE].path), str(zoo[CHAT].path), "--stat", "l2", "--permutations", "19", "--json")
    data = json.loads(hubtrace(*args).stdout)
    assert data["log10_p"] == pytest.approx(-1.30103, abs=1e-4)  # 1/(19+1): no permutation beats the fine-tune


def _refusal(*args: str) -> str:
    result = hubtrace("test", *args)
    assert result.exit_code == EXIT_REFUSED
    assert "Traceback" not in result.output
    assert result.stderr.startswith("hubtrace: error: ")
    return result.stderr


def test_pickle_only_checkpoint_is_refused_without_unpickling(zoo: Zoo, tmp_path: Path) -> None:
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text((zoo[BASE].path / "config.json").read_text())
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    assert "pickle" in _refusal(str(zoo[BASE].path), str(pickled)).lower()


def test_missing_config_and_unknown_architecture_are_refused(zoo: Zoo, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "model.safetensors").write_bytes((zoo[BASE].path / "model.safetensors").read_bytes())
    assert "config.json" in _refusal(str(zoo[BASE].path), str(bare))

    alien = tmp_path / "alien"
    alien.mkdir()
    config = json.loads((zoo[BASE].path / "config.json").read_text())
    config.update(model_type="alien_lm", architectures=["AlienForCausalLM"])
    (alien / "config.json").write_text(json.dumps(config))
    (alien / "model.safetensors").write_bytes((zoo[BASE].path / "model.safetensors").read_bytes())
    assert "alien_lm" in _refusal(str(zoo[BASE].path), str(alien))


def test_mismatched_shapes_and_unknown_statistics_are_refused(zoo: Zoo, tmp_path: Path) -> None:
    narrow = tmp_path / "narrow"
    save_model(new_model(ArchSpec(hidden_size=32, num_heads=2, num_kv_heads=1), seed=3), narrow)
    assert "hidden sizes" in _refusal(str(zoo[BASE].path), str(narrow), "--stat", "up")
    assert "unknown statistic" in _refusal(str(zoo[BASE].path), str(zoo[CHAT].path), "--stat", "cosine")
