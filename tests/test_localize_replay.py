"""`localize` with replayed residual streams maps every kept block of a depth-and-width prune.

The prune is of a tiny random 8-block Llama whose blocks write strongly into the residual stream (weights of
std 0.1), dropping blocks 2, 4 and 6 and a quarter of every kept block's units, with small noise standing in
for healing: the stream entering a kept block then drifts far enough that fingerprints (own streams) lose
the deeper blocks, as on the issue's SmolLM2 prune. Seeds are fixed, so every test is deterministic; mapped
pairs sit at the 48-unit permutation floor (log10 p ~ -61) against a corrected threshold of -2, and an
independent pair maps a block with probability at most 1% by the Bonferroni bound (fixed here by the seed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from scanner.cli import app
from scanner.fingerprint import fingerprint_model
from scanner.localize import localize, localize_replayed
from scanner.zoo import Zoo
from scanner.zoo.derivations import prune_depth, prune_width, scattered_units
from tests.tiny_models import FAMILIES

KEPT = [0, 1, 3, 5, 7]
WIDTH, KEEP_UNITS = 64, 48


def _random_deep(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = FAMILIES["llama"].config()
    config.num_hidden_layers = 8
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0) if "norm" in name else parameter.normal_(0.0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def prune(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("deep")
    parent = _random_deep(0)
    units = scattered_units(WIDTH, KEEP_UNITS, len(KEPT), torch.Generator().manual_seed(1))
    child = prune_width(prune_depth(parent, KEPT), units)
    with torch.no_grad():
        for parameter in child.parameters():
            parameter.add_(0.001 * torch.randn_like(parameter))
    for name, model in (("parent", parent), ("child", child), ("other", _random_deep(5))):
        model.save_pretrained(root / name, safe_serialization=True)
    return {"root": root, "units": units}


def test_replay_maps_every_kept_block_and_its_kept_units(prune) -> None:
    root, units = prune["root"], prune["units"]
    result = localize_replayed(root / "parent", root / "child")
    assert result.map == [(a, b) for b, a in enumerate(KEPT)]
    for (a, b), unit_map in result.unit_maps.items():
        np.testing.assert_array_equal(unit_map, np.asarray(units[b]))
    # the motivating failure: on their own streams, the deeper kept blocks are lost
    own_streams = localize(fingerprint_model(root / "parent"), fingerprint_model(root / "child"))
    assert len(own_streams.map) < len(KEPT)


def test_replay_maps_nothing_between_independent_models(prune) -> None:
    result = localize_replayed(prune["root"] / "parent", prune["root"] / "other")
    assert result.map == []
    assert min(p.log10_p for p in result.pairs) > -2 - np.log10(len(result.pairs))


def test_replay_finds_the_residual_basis_of_a_camouflaged_copy(zoo: Zoo) -> None:
    """pylon-base is cobalt-base under T1-T6 (residual stream rotated and permuted, units permuted)."""
    copy = zoo["pylon/pylon-base"]
    result = localize_replayed(zoo["cobalt-ai/cobalt-base"].path, copy.path)
    planted = copy.details["camouflage"]["mlp_permutations"]
    assert result.map == [(i, i) for i in range(len(planted))]
    for i, permutation in enumerate(planted):
        np.testing.assert_array_equal(result.unit_maps[(i, i)], np.asarray(permutation))


def test_cli_replays_by_default_for_directories_of_different_depths(prune) -> None:
    root = prune["root"]
    out = CliRunner().invoke(app, ["localize", str(root / "parent"), str(root / "child"), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [(m["layer_a"], m["layer_b"]) for m in data["map"]] == [(a, b) for b, a in enumerate(KEPT)]
    assert any("residual stream" in note for note in data["notes"])
    refused = CliRunner().invoke(app, ["localize", str(root / "parent"), str(root / "child" / "config.json"), "--replay"])
    assert refused.exit_code == 2 and "hubtrace: error:" in refused.output
