"""Localized testing: the block map and unit maps between zoo models, the block-map rule, and `hubtrace localize`.

Zoo models and canonical inputs are seeded, so every test is deterministic. Under independence each
block pair's p-value is uniform, and the Bonferroni correction bounds the chance that an independent
pair maps any block at the default threshold by 10**-2: that is the false-failure rate of the
"maps nothing" tests over fresh seeds. The other zoo assertions hold with p-values near the 128-unit
permutation floor (log10 p ~ -215), where a false failure would need a miracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread
from scipy.stats import kstest
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model, write_fingerprint
from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.localize import _block_test, _screen_rows, _unit_blocks, localize, plot_unit_map
from scanner.stats.block_map import block_map, bonferroni_log10
from scanner.stats.experts import pair_experts
from scanner.zoo import Zoo
from tests.fixtures.synthetic import synthetic_pair
from tests.synthetic_fingerprints import template_fingerprint

BASE = "aurora-labs/aurora-base"
TWIN = "tundra-research/tundra-64"
LITE = "kestrel/aurora-lite"
COBALT = "cobalt-ai/cobalt-base"
PYLON = "pylon/pylon-base"
CHAT = "finch-nlp/aurora-chat"
NIMBUS = "nimbus/nimbus-1"
SLIM = "lumen/aurora-slim"

runner = CliRunner()


@pytest.fixture(scope="module")
def fingerprints(zoo_fingerprints) -> dict[str, Fingerprint]:
    return {m: zoo_fingerprints[m] for m in (BASE, TWIN, LITE, COBALT, PYLON, CHAT, NIMBUS, SLIM)}


def test_depth_pruned_model_maps_to_exactly_its_kept_blocks(zoo: Zoo, fingerprints) -> None:
    kept = zoo[LITE].details["kept_blocks"]
    result = localize(fingerprints[BASE], fingerprints[LITE])
    assert len(result.pairs) == 4 * len(kept)
    assert result.map == [(a, b) for b, a in enumerate(kept)]
    for (a, b), unit_map in result.unit_maps.items():  # healed, never permuted: units stay in place
        assert np.mean(unit_map == np.arange(unit_map.size)) > 0.9, (a, b)


def test_width_pruned_model_maps_its_units_to_the_kept_units(zoo: Zoo, fingerprints) -> None:
    kept = zoo[SLIM].details["kept_units"]
    result = localize(fingerprints[BASE], fingerprints[SLIM])
    assert result.map == [(i, i) for i in range(len(kept))]
    for i, units in enumerate(kept):
        np.testing.assert_array_equal(result.unit_maps[(i, i)], np.asarray(units))


@pytest.mark.parametrize(("parent", "copy"), [(COBALT, PYLON), (CHAT, NIMBUS)])
def test_camouflaged_copy_maps_blocks_in_order_and_units_to_the_planted_permutation(
    zoo: Zoo, fingerprints, parent, copy
):
    permutations = zoo[copy].details["camouflage"]["mlp_permutations"]
    result = localize(fingerprints[parent], fingerprints[copy])
    assert result.map == [(i, i) for i in range(len(permutations))]
    for i, planted in enumerate(permutations):
        # camouflage writes unit k of the copy from unit planted[k] of the parent
        np.testing.assert_array_equal(result.unit_maps[(i, i)], np.asarray(planted))


@pytest.mark.parametrize("other", [TWIN, COBALT])
def test_independent_models_map_nothing(fingerprints, other) -> None:
    result = localize(fingerprints[BASE], fingerprints[other])
    assert result.map == [] and result.unit_maps == {}
    assert min(p.log10_p for p in result.pairs) > -2 - np.log10(len(result.pairs))


def test_monotone_map_skips_a_decoy_that_would_break_the_order() -> None:
    # B is A with block 2 removed; block 3 of B also looks faintly like A's block 0 (a decoy).
    log10_p = np.full((5, 4), -0.3)
    for b, a in enumerate([0, 1, 3, 4]):
        log10_p[a, b] = -200.0
    log10_p[0, 3] = -8.0
    assert block_map(log10_p) == [(0, 0), (1, 1), (3, 2), (4, 3)]
    assert block_map(log10_p, monotone=False) == [(0, 0), (1, 1), (3, 2), (4, 3)]
    log10_p[4, 3] = -0.3  # without the true partner, only the free map takes the decoy (order breaks)
    assert block_map(log10_p) == [(0, 0), (1, 1), (3, 2)]
    assert block_map(log10_p, monotone=False) == [(0, 0), (1, 1), (3, 2), (0, 3)]


def test_threshold_is_applied_after_bonferroni_over_all_block_pairs() -> None:
    log10_p = np.zeros((4, 5))
    log10_p[2, 3] = -2 - np.log10(20) + 1e-9  # corrected: just above -2
    assert block_map(log10_p) == []
    log10_p[2, 3] -= 2e-9
    assert block_map(log10_p) == [(2, 3)]
    assert bonferroni_log10(np.array([[-0.1, -3.0]]))[0].tolist() == pytest.approx([0.0, -3.0 + np.log10(2)])
    with pytest.raises(ValueError):
        block_map(log10_p, threshold_log10=0.5)


def test_unit_map_plot_is_a_real_scatter(tmp_path: Path) -> None:
    planted = np.random.default_rng(0).permutation(300)
    path = plot_unit_map(planted, tmp_path / "nested" / "map.png", layer_a=3, layer_b=2)
    image = imread(path)
    assert path.stat().st_size > 5000
    dark = image[..., :3].mean(axis=-1) < 0.6  # marker and text pixels on a white canvas
    assert 0.005 < dark.mean() < 0.5


def test_cli_json_shape_and_plots(zoo: Zoo, tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    result = runner.invoke(
        app, ["localize", str(zoo[BASE].path), str(zoo[LITE].path), "--json", "--plot-dir", str(plots)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert len(data["pairs"]) == 12
    assert all(set(p) == {"layer_a", "layer_b", "log10_p", "closeness"} for p in data["pairs"])
    mapped = {(p["layer_a"], p["layer_b"]): p["closeness"] for p in data["pairs"]}
    assert all(0.0 < mapped[(m["layer_a"], m["layer_b"])] <= 1.0 for m in data["map"])  # the pruned model's blocks
    assert [(m["layer_a"], m["layer_b"]) for m in data["map"]] == [(0, 0), (1, 1), (3, 2)]
    assert all(set(m) == {"layer_a", "layer_b"} for m in data["map"])
    assert sorted(Path(p).name for p in data["plots"]) == [
        "unit-map-a0-b0.png", "unit-map-a1-b1.png", "unit-map-a3-b2.png"
    ]
    assert all(Path(p).stat().st_size > 5000 for p in data["plots"])


def test_cli_accepts_a_fingerprint_file_and_fingerprints_the_other_side_on_its_inputs(zoo: Zoo, tmp_path: Path) -> None:
    spec = InputSpec(seed=3, n_sequences=8, seq_len=32)
    file_a = tmp_path / "cobalt.safetensors"
    write_fingerprint(fingerprint_model(zoo[COBALT].path, inputs=spec), file_a)
    result = runner.invoke(app, ["localize", str(file_a), str(zoo[PYLON].path)])
    assert result.exit_code == 0, result.output
    assert "4 blocks" in result.stdout and "16 block pairs tested" in result.stdout
    rows = [line.split()[:2] for line in result.stdout.splitlines()]
    assert [(int(b), int(a)) for b, a in (r for r in rows if len(r) == 2) if b.isdigit() and a.isdigit()] == [
        (i, i) for i in range(4)
    ]


def test_cli_refuses_fingerprints_of_different_input_sets(zoo: Zoo, tmp_path: Path) -> None:
    files = []
    for seed in (0, 1):
        files.append(tmp_path / f"base-{seed}.safetensors")
        fp = fingerprint_model(zoo[BASE].path, inputs=InputSpec(seed=seed, n_sequences=4, seq_len=16))
        write_fingerprint(fp, files[-1])
    result = runner.invoke(app, ["localize", *map(str, files)])
    assert result.exit_code == EXIT_REFUSED
    assert result.output.startswith("hubtrace: error:") and "Traceback" not in result.output


# -- screening wide blocks ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Fingerprint:
    return template_fingerprint(tmp_path_factory.mktemp("llama"), 64)


@pytest.mark.slow
def test_screen_p_values_are_uniform_for_independent_blocks(template: Fingerprint) -> None:
    """400 independent block pairs of 600 units screened on 100: KS against uniform at alpha = 0.001
    (false-failure rate 0.1% for an exactly uniform screen)."""
    a, b = synthetic_pair(template, 400, 600, {}, seed=5)
    sign_free = a.meta.up_sign_free
    blocks_a, blocks_b = _unit_blocks(a.blocks, "cpu", sign_free), _unit_blocks(b.blocks, "cpu", sign_free)
    rows = _screen_rows(blocks_a[0], blocks_b[0], 100)
    assert rows is not None and rows.size == 100
    single = pair_experts([(np.zeros((1, 1)),) * 2], [(np.zeros((1, 1)),) * 2])
    p = [10 ** _block_test(list(zip(x, y)), single, sign_free, "greedy", rows)[0] for x, y in zip(blocks_a, blocks_b)]
    assert kstest(p, "uniform").pvalue > 0.001


def test_screened_localize_maps_what_the_full_one_maps(template: Fingerprint) -> None:
    """Blocks 0-3 of B derive from blocks 1-4 of A (a model cut from the middle of another): the screen ends
    the independent pairs early, and the map and the mapped pairs' p-values are those of the full test."""
    a, b = synthetic_pair(template, 6, 700, {0: 1, 1: 2, 2: 3, 3: 4}, seed=6)
    full = localize(a, b, screen_units=None)
    screened = localize(a, b, screen_units=128)
    assert full.map == screened.map == [(1, 0), (2, 1), (3, 2), (4, 3)]
    mapped = {(p.layer_a, p.layer_b): p.log10_p for p in full.pairs if (p.layer_a, p.layer_b) in full.map}
    assert all(p.log10_p == mapped[(p.layer_a, p.layer_b)] for p in screened.pairs if (p.layer_a, p.layer_b) in mapped)
    ended = int(screened.notes[-1].split()[0])
    assert ended >= 30 and "screen on 128 units" in screened.notes[-1]  # of the 32 independent pairs


def test_cli_localizes_two_folders_with_different_vocabularies(tmp_path: Path) -> None:
    """A copy with a padded vocabulary is localized on the shared id range, as `hubtrace test` compares it
    (one function, scanner.fingerprints.fingerprint.fingerprint_pair, picks the input set for both commands)."""
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import FAMILIES, save_random

    base, padded = tmp_path / "org" / "base", tmp_path / "org" / "padded"
    save_random(FAMILIES["llama"].config(), base)
    model = AutoModelForCausalLM.from_pretrained(base)
    model.resize_token_embeddings(model.config.vocab_size + 32)
    model.save_pretrained(padded, safe_serialization=True)

    result = runner.invoke(app, ["localize", str(base), str(padded), "--json"])

    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(m["layer_a"], m["layer_b"]) for m in data["map"]] == [(0, 0), (1, 1)]
    tested = runner.invoke(app, ["test", str(base), str(padded), "--json"])
    assert tested.exit_code == 0, tested.output
    assert json.loads(tested.stdout)["inputs"].endswith("ids<128")
