"""MoE blocks: experts are matched before testing, so a camouflaged MoE (experts permuted with the router rows)
is detected, an upcycled MoE maps every expert to its dense parent's MLP, and p-values stay valid.

Tiny random models with fixed seeds: every test is deterministic. The dependent assertions sit hundreds of
orders of magnitude past their thresholds; the independent control asserts log10 p > -2 (a false failure
rate of 1% for an exactly valid test, here fixed by the seed); the validity test is a KS test at alpha 0.001.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import kstest
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.pairs.localize import localize
from scanner.stats.experts import pair_block_experts, pair_experts
from scanner.stats.independence import phi_match
from scanner.stats.logp import log10_fisher
from scanner.zoo.moe import camouflage_experts, upcycle
from tests.tiny_models import FAMILIES

N_EXPERTS = 4


def _random(model_type: str, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES[model_type].config())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("moe")
    parent = _random("mixtral", 0)
    child, planted = camouflage_experts(parent, seed=1)
    tokens = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(parent(input_ids=tokens).logits, child(input_ids=tokens).logits, atol=1e-4)
    dense = _random("llama", 2)
    models = {
        "parent": parent,
        "camouflaged": child,
        "other": _random("mixtral", 3),
        "dense": dense,
        "upcycled": upcycle(dense, N_EXPERTS, noise=0.05, seed=4),
    }
    fingerprints: dict[str, Fingerprint] = {}
    for name, model in models.items():
        model.save_pretrained(root / name, safe_serialization=True)
        fingerprints[name] = fingerprint_model(root / name)
    return {"fp": fingerprints, "planted": planted}


def test_camouflaged_moe_is_detected_and_its_experts_matched_to_the_planted_permutation(moe) -> None:
    fp, planted = moe["fp"], moe["planted"]
    result = compare_fingerprints(fp["parent"], fp["camouflaged"])
    assert result.log10_p < -100
    note = next(n for n in result.notes if n.startswith("experts matched"))
    for layer, order in enumerate(planted.expert_permutations):
        assert f"block {layer}: " + " ".join(f"{k}<-{a}" for k, a in enumerate(order)) in note
    # what index pairing would have said: the experts at equal positions are unrelated
    by_index = [
        phi_match(x.gate, x.up, y.gate, y.up).log10_p
        for layer in range(len(fp["parent"].blocks))
        for k, (x, y) in enumerate(zip(fp["parent"].blocks[layer], fp["camouflaged"].blocks[layer]))
        if planted.expert_permutations[layer][k] != k
    ]
    assert log10_fisher(by_index) > -3


def test_upcycled_moe_maps_every_expert_to_the_dense_mlp(moe) -> None:
    fp = moe["fp"]
    result = compare_fingerprints(fp["dense"], fp["upcycled"])
    assert result.log10_p < -100
    # every block a copy's verdict (random weights share most of a unit's variation between its gate and up views,
    # which the test's up view leaves out: block 1 measured -31, -78 before scanner.stats.views)
    assert all(layer.log10_p < -20 for layer in result.layers)
    note = next(n for n in result.notes if n.startswith("experts matched"))
    assert all(f"block {layer}: 0<-0 1<-0 2<-0 3<-0" in note for layer in range(len(result.layers)))
    pairing = pair_block_experts(
        [(x.gate, x.up) for x in fp["dense"].blocks[0]],
        [(y.gate, y.up) for y in fp["upcycled"].blocks[0]],
        0,
        N_EXPERTS,
    )
    tests = [
        phi_match(fp["dense"].blocks[0][0].gate, fp["dense"].blocks[0][0].up, y.gate, y.up).log10_p
        for y in fp["upcycled"].blocks[0]
    ]
    assert pairing.one_to_many and all(t < -50 for t in tests)  # each expert on its own, not just the best


def test_localize_maps_the_camouflaged_moe_block_by_block(moe) -> None:
    fp = moe["fp"]
    result = localize(fp["parent"], fp["camouflaged"])
    assert result.map == [(0, 0), (1, 1)]
    assert any("experts are matched" in note for note in result.notes)


def test_independent_moe_models_are_not_dependent(moe) -> None:
    fp = moe["fp"]
    assert compare_fingerprints(fp["parent"], fp["other"]).log10_p > -2
    assert compare_fingerprints(fp["dense"], fp["other"]).log10_p > -2


@pytest.mark.slow
def test_matched_expert_p_values_are_uniform_under_independence() -> None:
    """300 independent 4-expert blocks (random activations): the block p-value after matching the experts
    is uniform (KS at alpha 0.001); without exchangeable units it would not be, since matching picks maxima. Each
    expert pair by the exact matching rule, whose p-values are uniform (the default rule's are conservative)."""
    rng = np.random.default_rng(7)
    p = []
    for _ in range(300):
        a = [(rng.standard_normal((48, 96)), rng.standard_normal((48, 96))) for _ in range(N_EXPERTS)]
        b = [(rng.standard_normal((48, 96)), rng.standard_normal((48, 96))) for _ in range(N_EXPERTS)]
        pairing = pair_experts(a, b)
        p.append(10 ** pairing.combine([phi_match(*a[i], *b[j], rule="exact").log10_p for i, j in pairing.pairs]))
    assert kstest(p, "uniform").pvalue > 0.001


def test_shared_experts_follow_the_routed_ones_and_a_dense_side_pairs_with_all(moe) -> None:
    rng = np.random.default_rng(0)

    def expert() -> tuple[np.ndarray, np.ndarray]:
        return rng.standard_normal((16, 32)), rng.standard_normal((16, 32))

    a = [expert() for _ in range(3)] + [expert()]  # 3 routed + 1 shared
    b = [a[2], a[0], a[1], a[3]]
    pairing = pair_block_experts(a, b, 3, 3)
    assert sorted(pairing.pairs) == [(0, 1), (1, 2), (2, 0), (3, 3)] and not pairing.one_to_many
    dense = pair_block_experts([expert()], b, 0, 3)
    assert dense.pairs == [(0, j) for j in range(4)] and dense.one_to_many
    assert dense.combine([-5.0, -1.0, -0.5, -0.1]) == pytest.approx(-5.0 + np.log10(4))
