"""Declared structure read from a model folder as a scan reads it: a mergekit_config.yml (every form mergekit writes and
people upload, local paths and Hub ids, hostile files) and the base_model:<relation>:<id> tags of a local card, into
the record a scan stores and back out of the store."""

from __future__ import annotations

from pathlib import Path

import pytest

from scanner.declared.cards import parse_card
from scanner.declared.merge_config import MERGE_CONFIG, MergeDeclaration, MergeSource, model_id_of, parse_merge_config
from scanner.sources.local import discover_local
from scanner.store import Store
from tests.store_support import Meta

TIES = """
merge_method: ties
base_model: ./ash/base
models:
- model: ./ash/ft-a
  parameters: {weight: 0.5, density: 0.5}
- model: /home/someone/hub/ash/ft-c
  parameters: {weight: 0.5, density: 0.5}
parameters: {normalize: true}
dtype: float32
"""
PASSTHROUGH = """
slices:
- sources: [{model: org/left@main, layer_range: [0, 3]}]
- sources: [{model: org/right, layer_range: [1, 4]}]
merge_method: passthrough
"""
NORMALISED = """
merge_method: slerp
base_model: ./a/one
modules:
  default:
    slices:
    - sources:
      - {model: ./a/one, layer_range: [0, 4]}
      - {model: ./a/two+./a/lora, layer_range: [0, 4]}
parameters: {t: 0.5}
"""


def test_every_form_of_a_merge_config_names_its_models_method_base_and_blocks() -> None:
    ties = parse_merge_config(TIES)
    assert (ties.method, ties.base_model) == ("ties", "ash/base") and not ties.notes
    assert ties.parents == ("ash/ft-a", "ash/ft-c", "ash/base")  # a local path by its last two parts; base last
    stacked = parse_merge_config(PASSTHROUGH)
    assert stacked.sources == (MergeSource("org/left", (0, 3)), MergeSource("org/right", (1, 4)))
    assert stacked.stacked_blocks == 6 and stacked.parents == ("org/left", "org/right")
    slerp = parse_merge_config(NORMALISED)  # mergekit's own modules form; model+lora names both
    assert slerp.parents == ("a/one", "a/two", "a/lora") and slerp.stacked_blocks is None
    assert MergeDeclaration.from_json(slerp.to_json()) == slerp
    assert [model_id_of(r) for r in ("gpt2", "./x", "../../a/b", "org/name/", "/m/org/name@v2")] == [
        None, None, "a/b", "org/name", "org/name"]


@pytest.mark.parametrize(("text", "note"), [
    ("merge_method: [", "is not valid YAML"),
    ("- just a list", "holds a list, not a mapping"),
    ("merge_method: 3\nmodels: {model: x}", "merge_method is a int"),
    ("models: [{model: 5}, 'x', {model: ./a/b}]", "entries that are not mappings"),
    ("slices: [{sources: [{model: a/b, layer_range: [3, 1]}]}]", "layer_range [3, 1] is not [start, end]"),
    ("base_model: {x: 1}", "base_model is a dict"),
    ("models: [{model: gpt2}]", "names no model"),
])
def test_a_hostile_merge_config_is_read_as_far_as_it_goes_with_a_note(text: str, note: str) -> None:
    declared = parse_merge_config(text)
    assert any(note in n for n in declared.notes), declared.notes
    assert all(s.model.count("/") == 1 for s in declared.sources)


def test_card_tags_name_bases_and_a_relation_like_the_hub_does() -> None:
    card = parse_card("---\ntags:\n- base_model:adapter:org/base\n- base_model:org/other\n- peft\n---\n")
    assert card.base_model == ("org/base", "org/other") and card.base_model_relation == "adapter"
    front = parse_card("---\nbase_model: org/x\ntags: [base_model:quantized:org/y]\n---\n")
    assert front.base_model == ("org/x",) and front.base_model_relation == "quantized"  # front matter's bases first
    assert parse_card("---\ntags: [base_model:merge:a/b, base_model:merge:c/d]\n---\n").base_model == ("a/b", "c/d")


def _folder(root: Path, model_id: str, card: str, config: str | None) -> None:
    folder = root / model_id
    folder.mkdir(parents=True)
    (folder / "README.md").write_text(card, encoding="utf-8")
    if config is not None:
        (folder / MERGE_CONFIG).write_text(config, encoding="utf-8")


def test_a_local_scan_records_what_the_config_and_the_tags_declare_and_stores_it(tmp_path: Path) -> None:
    hub = tmp_path / "hub"
    _folder(hub, "cedar/ties", "---\ntags: [merge, mergekit]\nbase_model: []\n---\n", TIES)  # mergekit's own card
    _folder(hub, "birch/lora", "---\ntags: [base_model:adapter:ash/base]\n---\n", None)
    _folder(hub, "odd/config", "---\nbase_model: org/x\n---\n", "merge_method: [")
    records = {r.model_id: r for r in discover_local(hub)}
    ties = records["cedar/ties"]
    assert ties.base_models == ("ash/ft-a", "ash/ft-c", "ash/base") and ties.base_model_relation == "merge"
    assert ties.merge is not None and ties.merge.method == "ties"
    assert records["birch/lora"].base_models == ("ash/base",) and records["birch/lora"].base_model_relation == "adapter"
    odd = records["odd/config"]
    assert odd.base_models == ("org/x",) and any("not valid YAML" in n for n in odd.notes)
    with Store(tmp_path / "scan.duckdb") as store:
        run = store.start_run({})
        store.upsert_model(ties, Meta(), run, "ok")
        row = store.query("SELECT declared_base_models, declared_relation, merge_config FROM current_models").row(
            0, named=True)
    assert row["declared_base_models"] == ["ash/ft-a", "ash/ft-c", "ash/base"] and row["declared_relation"] == "merge"
    assert MergeDeclaration.from_json(row["merge_config"]) == ties.merge
