"""MoE derivations with known ground truth: expert camouflage and upcycling a dense Llama into a Mixtral.

Both act on transformers 5's in-memory MoE layout (router ``mlp.gate.weight`` (E, d); experts fused as
``mlp.experts.gate_up_proj`` (E, 2h, d), gate rows first, and ``mlp.experts.down_proj`` (E, d, h)), which Mixtral,
GLM-4.5 (glm4_moe) and Solar Open share.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
from transformers import LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, PreTrainedModel


@dataclass(frozen=True)
class ExpertCamouflage:
    """expert_permutations[layer][k]: the expert of the parent that the copy holds at position k; likewise
    unit_permutations[layer][k] for the units (the same for every expert of a block)."""

    expert_permutations: list[list[int]]
    unit_permutations: list[list[int]]


@torch.no_grad()
def camouflage_experts(model: PreTrainedModel, seed: int) -> tuple[PreTrainedModel, ExpertCamouflage]:
    """Permute every MoE block's experts together with the router's rows (and its score-correction bias, as
    DeepSeek-style routers have), permute each expert's hidden units and scale up/down by c and 1/c: routing and
    output are unchanged, index-by-index pairing of experts is not. Dense blocks are left as they are (their
    entries in the record are empty)."""
    g = torch.Generator().manual_seed(seed)
    child = copy.deepcopy(model)
    experts_perm, units_perm = [], []
    for layer in child.model.layers:
        moe = layer.mlp
        if not hasattr(moe, "experts"):
            experts_perm.append([])
            units_perm.append([])
            continue
        n, width = moe.experts.gate_up_proj.shape[0], moe.experts.gate_up_proj.shape[1] // 2
        order, units = torch.randperm(n, generator=g), torch.randperm(width, generator=g)
        scale = math.exp((2 * float(torch.rand(1, generator=g)) - 1) * math.log(4.0))
        gate_up = moe.experts.gate_up_proj[order]
        gate, up = gate_up[:, :width][:, units], scale * gate_up[:, width:][:, units]
        moe.experts.gate_up_proj.copy_(torch.cat([gate, up], dim=1))
        moe.experts.down_proj.copy_(moe.experts.down_proj[order][:, :, units] / scale)
        moe.gate.weight.copy_(moe.gate.weight[order])
        bias = getattr(moe.gate, "e_score_correction_bias", None)
        if bias is not None:
            bias.copy_(bias[order])
        experts_perm.append(order.tolist())
        units_perm.append(units.tolist())
    return child, ExpertCamouflage(experts_perm, units_perm)


@torch.no_grad()
def upcycle(dense: LlamaForCausalLM, n_experts: int, *, noise: float, seed: int, top_k: int = 2) -> MixtralForCausalLM:
    """A Mixtral whose every expert is the dense parent's MLP plus Gaussian noise (``noise`` times the weights'
    std, standing in for the training after upcycling), with a random router; attention, norms and embeddings
    are copied."""
    g = torch.Generator().manual_seed(seed)
    c = dense.config
    config = MixtralConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps,
        rope_theta=getattr(c, "rope_theta", 10000.0),
        tie_word_embeddings=c.tie_word_embeddings,
        num_local_experts=n_experts,
        num_experts_per_tok=top_k,
        hidden_act=c.hidden_act,
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
    )
    moe = MixtralForCausalLM(config).eval()
    source = dense.state_dict()
    target = moe.state_dict()
    for name in target:
        if name in source:
            target[name].copy_(source[name])
    for i, layer in enumerate(moe.model.layers):
        prefix = f"model.layers.{i}.mlp."
        gate_up = torch.cat([source[prefix + "gate_proj.weight"], source[prefix + "up_proj.weight"]])
        down = source[prefix + "down_proj.weight"]
        std = noise * float(gate_up.std())
        layer.mlp.experts.gate_up_proj.copy_(gate_up + std * torch.randn(n_experts, *gate_up.shape, generator=g))
        layer.mlp.experts.down_proj.copy_(down + std * torch.randn(n_experts, *down.shape, generator=g))
        layer.mlp.gate.weight.copy_(0.02 * torch.randn(n_experts, config.hidden_size, generator=g))
    return moe
