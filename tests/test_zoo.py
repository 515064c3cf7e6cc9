"""The model zoo: ground truth is consistent, derivations are what they claim, camouflage preserves outputs."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from scanner.zoo import (
    GROUND_TRUTH,
    RELATIONS,
    ArchSpec,
    Zoo,
    build_zoo,
    classify_card,
    load_model,
    max_logit_diff,
    read_card,
    train_independent_models,
)
from scanner.zoo.arch import new_model
from scanner.zoo.camouflage import camouflage

BASE = "aurora-labs/aurora-base"
TWIN = "tundra-research/tundra-64"
CHAT = "finch-nlp/aurora-chat"


def weights(zoo: Zoo, model_id: str) -> dict[str, torch.Tensor]:
    return load_file(zoo[model_id].path / "model.safetensors")


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|cosine| between every row of ``a`` and every row of ``b``."""
    a = a.double() / a.double().norm(dim=1, keepdim=True)
    b = b.double() / b.double().norm(dim=1, keepdim=True)
    return (a @ b.T).abs()


def up(state: dict[str, torch.Tensor], block: int) -> torch.Tensor:
    return state[f"model.layers.{block}.mlp.up_proj.weight"]


def test_zoo_has_every_relation_and_consistent_lineage(zoo: Zoo) -> None:
    # scanner.zoo.held_out's recipe adds the first two, the merge zoos of scanner.zoo.tool_zoo the last
    held_out_only = {"upscale_depth", "distilled", "frankenmerge"}
    assert set(RELATIONS) - held_out_only == {m.relation for m in zoo.models.values()}
    bases = zoo.with_relation("base")
    assert len(bases) >= 4 and all(m.family == m.id and m.parents == () for m in bases)
    assert zoo[TWIN].details["twin_of"] == BASE and zoo[TWIN].arch == zoo[BASE].arch
    assert any(m.arch.intermediate_size != zoo[BASE].arch.intermediate_size for m in bases)
    assert any(m.arch.num_layers != zoo[BASE].arch.num_layers for m in bases)
    for m in zoo.models.values():
        assert m.path.is_dir() and (m.path / "config.json").is_file()
        assert (m.path / "model.safetensors").stat().st_size < 1_200_000
        for parent in m.parents:
            assert zoo.ids.index(parent) < zoo.ids.index(m.id), "parents are built first"
            assert zoo[parent].family == m.family
    (merge,) = zoo.with_relation("merge")
    assert len(merge.parents) == 2
    assert len(zoo.ids) * (len(zoo.ids) - 1) // 2 == len(zoo.pairs(True)) + len(zoo.pairs(False))
    assert zoo.dependent(BASE, "iris-lab/aurora-chat-v2") and zoo.dependent("nimbus/nimbus-1", merge.id)
    assert not zoo.dependent(BASE, TWIN) and not zoo.dependent(BASE, "ember-ml/ember-small")


def test_ground_truth_file_round_trips_and_is_reused(zoo: Zoo) -> None:
    data = json.loads((zoo.root / GROUND_TRUTH).read_text())
    assert [m["id"] for m in data["models"]] == zoo.ids
    assert sorted(map(tuple, data["dependent_pairs"])) == sorted(zoo.pairs(True))
    assert Zoo.load(zoo.root) == zoo
    before = (zoo[BASE].path / "model.safetensors").stat().st_mtime_ns
    again = build_zoo(zoo.root)
    assert again == zoo and (zoo[BASE].path / "model.safetensors").stat().st_mtime_ns == before


def test_trained_models_reduce_their_loss(zoo: Zoo) -> None:
    trained = [m for m in zoo.models.values() if "training" in m.details]
    assert len(trained) >= 12
    for m in trained:
        log = m.details["training"]
        assert log["final_loss"] < log["initial_loss"] - 0.1, m.id
    for m in zoo.with_relation("base"):
        assert m.details["training"]["final_loss"] < 3.0 < 5.0 < m.details["training"]["initial_loss"], m.id
    long = zoo["harbor-ai/aurora-marathon"].details
    assert long["hard_case"] and long["training"]["steps"] >= 4 * zoo[BASE].details["training"]["steps"]
    drifts = [m.details["relative_drift"] for m in zoo.with_relation("finetune")]
    assert long["relative_drift"] == max(drifts) > 2 * sorted(drifts)[-2]


def test_camouflage_preserves_outputs_and_hides_weights(zoo: Zoo) -> None:
    camouflaged = zoo.with_relation("camouflage")
    assert len(camouflaged) == 2 and {zoo[m.parents[0]].relation for m in camouflaged} == {"base", "finetune"}
    for m in camouflaged:
        record = m.details["camouflage"]
        assert record["transforms"] == ["T1", "T2", "T3", "T4", "T5", "T6"]
        assert record["max_logit_diff"] < 1e-4
        source, disguised = load_model(zoo[m.parents[0]].path), load_model(m.path)
        assert max_logit_diff(source, disguised, seed=123) < 1e-3
        old, new = weights(zoo, m.parents[0]), weights(zoo, m.id)
        for i, units in enumerate(record["mlp_permutations"]):
            cos = row_cosines(up(new, i), up(old, i))
            assert cos.diagonal().max() < 0.6, "up rows are not copies"
            assert cos[torch.arange(len(units)), torch.tensor(units)].max() < 0.6, "nor permuted copies"
            assert not torch.allclose(new[f"model.layers.{i}.input_layernorm.weight"],
                                      old[f"model.layers.{i}.input_layernorm.weight"])
        assert row_cosines(new["model.embed_tokens.weight"].T, old["model.embed_tokens.weight"].T).max() < 0.8


def test_camouflage_is_exact_on_random_weights_and_other_head_layouts() -> None:
    for arch in (ArchSpec(num_heads=4, num_kv_heads=1), ArchSpec(num_heads=2, num_kv_heads=2, num_layers=2)):
        model = new_model(arch, seed=3)
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        disguised, record = camouflage(model, seed=5)
        tokens = torch.randint(0, arch.vocab_size, (2, arch.seq_len), generator=g)
        with torch.no_grad():
            scale = model(input_ids=tokens).logits.abs().max()
        assert scale > 1.0
        assert record.max_logit_diff < 1e-5 * scale


def test_pruned_models_keep_the_recorded_blocks_and_units(zoo: Zoo) -> None:
    parent = weights(zoo, BASE)
    (depth,) = zoo.with_relation("prune_depth")
    kept = depth.details["kept_blocks"]
    assert kept == sorted(set(kept)) and len(kept) < zoo[BASE].arch.num_layers == len(kept) + 1
    assert depth.arch.num_layers == len(kept) and load_model(depth.path).config.num_hidden_layers == len(kept)
    child = weights(zoo, depth.id)
    for j, i in enumerate(kept):
        name = "self_attn.q_proj.weight"
        sims = [float(torch.cosine_similarity(child[f"model.layers.{j}.{name}"].flatten(),
                                              parent[f"model.layers.{b}.{name}"].flatten(), dim=0))
                for b in range(zoo[BASE].arch.num_layers)]
        assert max(range(len(sims)), key=sims.__getitem__) == i and sims[i] > 0.9

    (width,) = zoo.with_relation("prune_width")
    child = weights(zoo, width.id)
    units = width.details["kept_units"]
    assert len(units) == width.arch.num_layers and {len(u) for u in units} == {width.arch.intermediate_size}
    assert width.arch.intermediate_size < zoo[BASE].arch.intermediate_size
    for i, block_units in enumerate(units):
        assert block_units == sorted(set(block_units)) and block_units != list(range(len(block_units)))
        cos = row_cosines(up(child, i), up(parent, i))
        assert cos.argmax(dim=1).tolist() == block_units
        assert cos[torch.arange(len(block_units)), torch.tensor(block_units)].min() > 0.8


def test_retrained_mlps_are_new_yet_match_the_originals(zoo: Zoo) -> None:
    (m,) = zoo.with_relation("retrained_mlp")
    log = m.details["retrain"]
    source = zoo[m.parents[0]]
    assert m.arch == source.arch and log["blocks"]
    for mse, target in zip(log["final_mse"], log["target_mean_square"], strict=True):
        assert mse < 0.1 * target
    assert abs(m.details["eval_loss"] - m.details["eval_loss_parent"]) < 0.1
    child, parent = weights(zoo, m.id), weights(zoo, source.id)
    for i in log["blocks"]:
        in_place = row_cosines(up(child, i), up(parent, i)).diagonal()
        assert in_place.median() < 0.3, "fresh init, not the original rows in place"
    retrained = tuple(f"layers.{i}.mlp." for i in log["blocks"])
    assert all(torch.equal(child[k], parent[k]) for k in parent if not any(r in k for r in retrained))


def test_merge_is_the_recorded_weighted_average(zoo: Zoo) -> None:
    (m,) = zoo.with_relation("merge")
    a, b = (weights(zoo, p) for p in m.parents)
    wa, wb = m.details["weights"]
    for name, value in weights(zoo, m.id).items():
        assert torch.allclose(value, wa * a[name] + wb * b[name], atol=1e-6), name


def test_cards_parse_and_match_ground_truth(zoo: Zoo) -> None:
    for m in zoo.models.values():
        text = (m.path / "README.md").read_text()
        assert text.startswith("---\n") and f"# {m.id}" in text
        card = read_card(m.path)
        assert classify_card(card, m.parents) == m.card, m.id
        assert card.base_model == m.declared_base_model and card.license == m.license
        assert card.base_model_relation == m.declared_relation
        assert card.base_model_relation in (None, "finetune", "merge", "quantized", "adapter")
    classes = {(m.relation, m.card) for m in zoo.models.values()}
    assert {("base", "false"), ("camouflage", "false"), ("finetune", "silent"), ("merge", "honest")} <= classes
    assert read_card(zoo["ember-ml/ember-small"].path).base_model == (BASE,)
    assert read_card(zoo["nimbus/nimbus-1"].path).claims_from_scratch


def test_up_rows_track_their_counterpart_only_under_dependence(zoo: Zoo) -> None:
    """Weight-level sanity check, independent of the statistics module."""
    base = weights(zoo, BASE)
    cases = ((CHAT, True), ("gale-co/aurora-sgd", True), (TWIN, False), ("ember-ml/ember-small", False))
    for other, dependent in cases:
        state = weights(zoo, other)
        for i in range(zoo[BASE].arch.num_layers):
            cos = row_cosines(up(base, i), up(state, i))
            hits = (cos.argmax(dim=1) == torch.arange(cos.shape[0])).float().mean()
            off_diagonal = cos[~torch.eye(cos.shape[0], dtype=torch.bool)].mean()
            if dependent:
                assert hits > 0.95 and cos.diagonal().mean() > 5 * off_diagonal, (other, i)
            else:
                assert hits < 0.05 and cos.diagonal().mean() < 1.5 * off_diagonal, (other, i)


@pytest.mark.slow
def test_independent_models_are_deterministic_and_unrelated(tmp_path: Path) -> None:
    first = train_independent_models(tmp_path / "a", n=3, seed=7, steps=20)
    second = train_independent_models(tmp_path / "b", n=3, seed=7, steps=20)
    assert first.ids == second.ids and len(set(first.ids)) == 3
    assert first.pairs(True) == [] and len(first.pairs(False)) == 3
    for model_id in first.ids:
        a, b = weights(first, model_id), weights(second, model_id)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x, y = weights(first, first.ids[0]), weights(first, first.ids[1])
    assert not torch.equal(x["model.layers.0.mlp.up_proj.weight"], y["model.layers.0.mlp.up_proj.weight"])
    for m in first.models.values():
        assert m.relation == "base" and m.card == "honest" and m.details["training"]["final_loss"] < 5.0


def test_depth_up_scaling_repeats_the_recorded_blocks_and_a_student_keeps_no_weights() -> None:
    """The held-out recipe's two derivations (scanner.zoo.held_out): an up-scaled model's block j is a copy of its
    parent's block blocks[j]; a distilled student learns its teacher's distributions from its own initialisation."""
    from scanner.zoo.arch import ArchSpec
    from scanner.zoo.derivations import distill, upscale_depth
    from scanner.zoo.languages import MarkovLanguage
    from scanner.zoo.training import TrainSpec, distillation_loss

    arch = ArchSpec(num_layers=3)
    parent = new_model(arch, seed=1)
    blocks = [0, 1, 1, 2]
    child = upscale_depth(parent, blocks)
    p, c = parent.state_dict(), child.state_dict()
    assert child.config.num_hidden_layers == 4
    for j, i in enumerate(blocks):
        assert torch.equal(c[f"model.layers.{j}.mlp.up_proj.weight"], p[f"model.layers.{i}.mlp.up_proj.weight"])
    assert torch.equal(c["model.embed_tokens.weight"], p["model.embed_tokens.weight"])

    language = MarkovLanguage(3, vocab_size=arch.vocab_size)
    tokens = language.sample(4, arch.seq_len, torch.Generator().manual_seed(0))
    student, log = distill(parent, arch, init_seed=2, language=language, spec=TrainSpec(steps=30, lr=5e-3))
    fresh = new_model(arch, seed=2)
    with torch.no_grad():
        assert float(distillation_loss(student, parent, tokens)) < 0.8 * float(distillation_loss(fresh, parent, tokens))
    teacher_up, student_up = up(p, 0), up(student.state_dict(), 0)
    assert not torch.equal(teacher_up, student_up) and log.steps == 30


def test_the_tree_evaluation_groups_share_no_zoo() -> None:
    """A zoo in two of the family-tree bench's groups would count zoos a rule was fitted on or looked at as out of
    sample (bench/bench_family_trees.py, docs/lineage.md "Held-out evaluation"): each (kind, seed) is in one group."""
    import re

    from bench.bench_family_trees import groups

    zoos = {name: {(label.split(" ")[0], int(re.search(r"seed (\d+)", label).group(1))) for label, _ in sets}
            for name, sets in groups().items()}
    assert set(zoos) == {"fitted", "held-out", "final", "methods"}
    assert all(len(zoos[name]) >= 10 for name in ("fitted", "held-out", "final")) and zoos["methods"]
    for a, b in itertools.combinations(sorted(zoos), 2):
        assert not zoos[a] & zoos[b], (a, b, zoos[a] & zoos[b])
