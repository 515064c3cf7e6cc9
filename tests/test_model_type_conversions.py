"""Comparability is a property of the MLPs, not of the model_type label: a derivative re-saved under another type is
compared and found, expert by expert where it has experts.

Tiny models with fixed seeds, deterministic. Dependent pairs sit hundreds of orders of magnitude past log10 p = -20;
an independent pair is held to log10 p >= -3 (1e-3 false failures for an exactly valid test, fixed by the seed).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints, pair_fingerprint_experts
from scanner.zoo.dispute import SHAPE, convert_to_solar_open, glm_air_mini, solar_open_mini

DEPENDENT = -20.0
INDEPENDENT = -3.0


@pytest.fixture(scope="module")
def dispute(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("dispute")
    glm = glm_air_mini(seed=0)
    solar, planted = convert_to_solar_open(glm, seed=1)
    ids = torch.randint(0, SHAPE["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(glm(input_ids=ids).logits, solar(input_ids=ids).logits, atol=1e-4)
    for name, model in (("glm", glm), ("solar", solar), ("other", solar_open_mini(seed=2))):
        model.save_pretrained(root / name)
    return {"fp": {name: fingerprint_model(root / name) for name in ("glm", "solar", "other")}, "planted": planted}


def test_a_glm4_moe_converted_to_solar_open_with_permuted_experts_is_found(dispute) -> None:
    fp = dispute["fp"]
    assert (fp["glm"].meta.model_type, fp["solar"].meta.model_type) == ("glm4_moe", "solar_open")
    assert fp["glm"].comparable_with(fp["solar"]) is None
    assert compare_fingerprints(fp["glm"], fp["solar"]).log10_p <= DEPENDENT


def test_each_expert_of_the_converted_model_is_matched_to_the_expert_it_came_from(dispute) -> None:
    """B's expert k holds A's expert planted[k]; the shared expert (last) stays with the shared expert."""
    fp, planted = dispute["fp"], dispute["planted"]
    for layer, order in enumerate(planted.expert_permutations):
        pairs = set(pair_fingerprint_experts(fp["glm"], fp["solar"], layer, layer).pairs)
        routed = {(a, b) for b, a in enumerate(order)}
        shared = len(order)
        assert pairs == routed | {(shared, shared)}, layer


def test_an_independent_solar_open_is_not_called_dependent(dispute) -> None:
    fp = dispute["fp"]
    assert compare_fingerprints(fp["glm"], fp["other"]).log10_p >= INDEPENDENT


@torch.no_grad()
def test_qwen2_weights_resaved_as_a_llama_config_are_compared_and_found(tmp_path: Path) -> None:
    """Qwen2 is Llama with q/k/v biases: as LlamaForCausalLM with attention_bias (and a zero o_proj bias, as converters
    add) it computes the same function under another model_type."""
    dims = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    qwen = Qwen2ForCausalLM(Qwen2Config(**dims)).eval()
    for parameter in qwen.parameters():  # biases start at zero; a trained model's are not
        parameter.normal_(0.0, 0.1)
    llama = LlamaForCausalLM(LlamaConfig(**dims, attention_bias=True)).eval()
    state = qwen.state_dict()
    state |= {k: torch.zeros_like(v) for k, v in llama.state_dict().items() if k.endswith("o_proj.bias")}
    llama.load_state_dict(state, strict=True)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    assert torch.allclose(qwen(input_ids=ids).logits, llama(input_ids=ids).logits, atol=1e-4)
    qwen.save_pretrained(tmp_path / "qwen2")
    llama.save_pretrained(tmp_path / "as-llama")
    a, b = fingerprint_model(tmp_path / "qwen2"), fingerprint_model(tmp_path / "as-llama")
    assert (a.meta.model_type, b.meta.model_type) == ("qwen2", "llama")
    assert compare_fingerprints(a, b).log10_p <= DEPENDENT
