"""A hub of what people make with PEFT and mergekit, with no model cards (scanner.zoo.tool_hub), scanned end to end:
the scan's own discovery, fingerprinting, pair tests and lineage stage, through the stored lineage tables and the
exports. The hub is the shape that once ended a scan in a traceback: a passthrough frankenmerge whose
mergekit_config.yml declares the base, which is not among the four shallower relatives it is block-mapped onto, so
the tree's table held no distance for a declared link (issue 47).

Deterministic given the hub (fixed seeds and canonical inputs); another machine's build differs in the last bits,
so what is asserted is structure (every link joins true relatives, no arrow drawn the wrong way, every declared
parent linked), not which of two near-equal numbers wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scanner.zoo import Zoo
from scanner.zoo.tool_hub import ADAPTER, BASE, FRANKEN, LORA
from tests.lineage_support import true_parent_links
from tests.scan_support import copy_models, query, scan_folder


@pytest.fixture(scope="module")
def scanned(tool_hub: Zoo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tool-hub-scan")
    return scan_folder(copy_models(tool_hub, tuple(tool_hub.ids), root / "hub"), root)


def _truth(hub: Zoo) -> set[frozenset[str]]:
    """True parent links as unordered pairs, with the adapter-only upload and its merged form as one model."""
    same = {ADAPTER: LORA}
    return {frozenset((same.get(p, p), same.get(c, c))) for p, c in true_parent_links(hub)}


def test_the_scan_writes_a_lineage_of_every_model(tool_hub: Zoo, scanned: Path) -> None:
    members = query(scanned, "SELECT model_id, family_id FROM family_members")
    assert set(members["model_id"]) == set(tool_hub.ids)
    assert members["family_id"].n_unique() == 1  # one base, everything derived from it
    runs = query(scanned, "SELECT status, summary FROM scan_runs")
    assert runs["status"].to_list() == ["succeeded"]
    exported = json.loads(runs["summary"][0])["exports"]
    assert Path(exported["json"]).is_file()


def test_every_link_joins_true_relatives_and_no_arrow_points_the_wrong_way(tool_hub: Zoo, scanned: Path) -> None:
    links = query(scanned, "SELECT parent, child, tree_link, direction_decided FROM lineage_edges "
                           "WHERE tree_link IS NOT NULL")
    truth, same = _truth(tool_hub), {ADAPTER: LORA}
    true_links = true_parent_links(tool_hub)
    for row in links.iter_rows(named=True):
        parent, child = same.get(row["parent"], row["parent"]), same.get(row["child"], row["child"])
        if row["tree_link"] == "copy":
            assert {row["parent"], row["child"]} == {ADAPTER, LORA}, row  # the one LoRA, uploaded twice
        else:
            assert frozenset((parent, child)) in truth, row
        if row["direction_decided"]:
            assert (row["child"], row["parent"]) not in true_links, row
    decided = query(scanned, "SELECT parent, child FROM lineage_edges WHERE direction_decided")
    assert not [r for r in decided.iter_rows() if r[::-1] in true_links]


def test_every_parent_the_merge_configs_declare_is_linked(tool_hub: Zoo, scanned: Path) -> None:
    """Each merge (the frankenmerge too, whose pair with the base has no block map) is linked to every model its
    mergekit_config.yml names, and the adapter to the base its adapter_config.json names."""
    members = query(scanned, "SELECT model_id, parents, merge_parents FROM family_members")
    same = {ADAPTER: LORA}  # copies are one model: either may stand for the LoRA
    linked = {r["model_id"]: {same.get(p, p) for p in (*r["parents"], *r["merge_parents"])}
              for r in members.iter_rows(named=True)}
    for model in tool_hub.models.values():
        if model.details.get("tool") == "mergekit":
            assert linked[model.id] == set(model.parents), model.id
    assert BASE in linked[FRANKEN]
    assert BASE in linked[ADAPTER] | linked[LORA]
