"""`localize` with replayed residual streams maps every kept block of a depth-and-width prune.

The prune (scanner.zoo.deep_prune) is of a tiny random 8-block Llama whose blocks write strongly into the
residual stream, dropping blocks 2, 4 and 6 and a quarter of every kept block's units, with small noise for
healing: the stream entering a kept block then drifts far enough that fingerprints (own streams) lose
the deeper blocks, as on the issue's SmolLM2 prune. Seeds are fixed, so every test is deterministic; mapped
pairs sit at the 48-unit permutation floor (log10 p ~ -61) against a corrected threshold of -2, and an
independent pair maps a block with probability at most 1% by the Bonferroni bound (fixed here by the seed).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.localize import localize, localize_replayed
from scanner.zoo import Zoo
from scanner.zoo.deep_prune import DeepPrune, build_random_deep_prune


@pytest.fixture(scope="module")
def prune(tmp_path_factory: pytest.TempPathFactory) -> DeepPrune:
    return build_random_deep_prune(tmp_path_factory.mktemp("deep"))


def test_replay_maps_every_kept_block_and_its_kept_units(prune: DeepPrune) -> None:
    result = localize_replayed(prune.parent, prune.child)
    assert result.map == [(a, b) for b, a in enumerate(prune.kept_blocks)]
    for (_, b), unit_map in result.unit_maps.items():
        np.testing.assert_array_equal(unit_map, np.asarray(prune.kept_units[b]))
    # the motivating failure: on their own streams, the deeper kept blocks are lost
    own_streams = localize(fingerprint_model(prune.parent), fingerprint_model(prune.child))
    assert len(own_streams.map) < len(prune.kept_blocks)


def test_replay_maps_nothing_between_independent_models(prune: DeepPrune) -> None:
    result = localize_replayed(prune.parent, prune.parent.parent / "other")
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


def test_cli_replays_by_default_for_directories_of_different_depths(prune: DeepPrune) -> None:
    out = CliRunner().invoke(app, ["localize", str(prune.parent), str(prune.child), "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert [(m["layer_a"], m["layer_b"]) for m in data["map"]] == [(a, b) for b, a in enumerate(prune.kept_blocks)]
    assert any("residual stream" in note for note in data["notes"])
    refused = CliRunner().invoke(app, ["localize", str(prune.parent), str(prune.child / "config.json"), "--replay"])
    assert refused.exit_code == 2 and "hubtrace: error:" in refused.output
