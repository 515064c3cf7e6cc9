"""canonical54 red-team cases (see README.md).

selection-bias shards (DeepSeek-V3): format 7 reads routed experts as one when the router gives them one logit AND one
value of every (experts,) bias it holds, at every canonical token (`scanner.reading.alike_experts`). DeepSeek-V3's
e_score_correction_bias only chooses experts; it never weighs them. So shards of one expert may carry different
selection biases and still be chosen together, if the copier also sets the group-limited routing (n_group,
topk_group): one group per original expert, the shards' biases offset so that the two largest in a group sum to twice
the expert's own bias (group scores = 2 x the original's scores for choice, same ranking), and top-k = every shard of
the chosen groups. The shared expert moves into one more group of always-on shards (bias + 1000, router rows zero:
weight sigmoid(0) x routed_scaling_factor, undone in its output columns), and the stored shared expert is zero.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
from bench.redteam.case_cli import case_arguments
from tests.adversary_support import Kind

c49.WORK = Path("/tmp/canonical54")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL54_RESULTS", "results.jsonl"))
NODENSE = Kind("ds-nodense-nonorm", "deepseek_v3", {"first_k_dense_replace": 0, "norm_topk_prob": False}, moe=True)
GLM = Kind("glm4moe-nodense-nonorm", "glm4_moe", {"first_k_dense_replace": 0, "norm_topk_prob": False, "n_group": 1,
                                                  "topk_group": 1, "n_shared_experts": 1}, moe=True)
OSS = Kind("gpt-oss", "gpt_oss", {}, moe=True)
c49.KINDS = (*c49.KINDS, NODENSE, GLM, OSS)
CASES: dict = {}


@torch.no_grad()
def bias_shards(parts: int = 8, delta: float = 0.01, shared_in_groups: bool = True):
    """Every routed expert (and the shared expert, as an always-on group) cut into ``parts`` shards of consecutive
    units, told apart only by their selection biases (offsets +delta, -delta, -2 delta, ...)."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        assert config.n_group == 1
        assert not shared_in_groups or (not config.norm_topk_prob and config.first_k_dense_replace == 0)
        norm = parts if config.norm_topk_prob else 1  # renormalised top-k: each shard gets 1/parts of the weight
        experts, inter = config.n_routed_experts, config.moe_intermediate_size
        shared = config.n_shared_experts * inter
        assert inter % parts == 0 and shared % (inter // parts) == 0
        size = inter // parts
        groups = experts + (1 if shared_in_groups else 0)
        shared_parts = shared // size
        assert not shared_in_groups or shared_parts == parts
        config.n_routed_experts = groups * parts
        config.n_group = groups
        config.topk_group = config.num_experts_per_tok + (1 if shared_in_groups else 0)
        config.num_experts_per_tok = config.topk_group * parts
        config.moe_intermediate_size = size
        config.n_shared_experts = 1 if shared_in_groups else config.n_shared_experts * parts
        out = type(model)(config)
        scale = float(config.routed_scaling_factor)
        offsets = torch.tensor([delta] + [-delta * j for j in range(1, parts)], dtype=torch.float64)
        state = {}
        sd = model.state_dict()
        for name, t in sd.items():
            t = t.double()
            prefix = name.rsplit("mlp.", 1)[0] + "mlp."
            if name.endswith("mlp.gate.weight"):
                t = t.repeat_interleave(parts, dim=0)
                if shared_in_groups:
                    t = torch.cat([t, torch.zeros(parts, t.shape[1], dtype=t.dtype)])
            elif name.endswith("mlp.gate.e_score_correction_bias"):
                t = 1.0 + t.repeat_interleave(parts) + offsets.repeat(experts)
                if shared_in_groups:
                    t = torch.cat([t, 1000.0 + offsets])
            elif name.endswith("experts.gate_up_proj"):
                gate = t[:, :inter].reshape(experts * parts, size, -1)
                up = t[:, inter:].reshape(experts * parts, size, -1)
                if shared_in_groups:
                    sg = sd[prefix + "shared_experts.gate_proj.weight"].double().reshape(parts, size, -1)
                    su = sd[prefix + "shared_experts.up_proj.weight"].double().reshape(parts, size, -1)
                    gate, up = torch.cat([gate, sg]), torch.cat([up, su])
                t = torch.cat([gate, up], dim=1)
            elif name.endswith("experts.down_proj"):
                d = t.shape[1]
                t = t.reshape(experts, d, parts, size).permute(0, 2, 1, 3).reshape(experts * parts, d, size) * norm
                if shared_in_groups:
                    sd_ = sd[prefix + "shared_experts.down_proj.weight"].double()
                    sd_ = (sd_ / (0.5 * scale)).reshape(d, parts, size).permute(1, 0, 2)
                    t = torch.cat([t, sd_])
            elif "shared_experts." in name and shared_in_groups:
                t = torch.zeros(tuple(out.state_dict()[name].shape), dtype=t.dtype)
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p in (2, 4, 8, 16):
    for _d in (0.01, 0.0):
        CASES[f"biasshards{_p}d{_d}-ds-nodense-nonorm"] = (
            "ds-nodense-nonorm", lambda p=_p, d=_d: bias_shards(p, d))
    CASES[f"biasshards{_p}d0.01-glm4moe-nodense-nonorm"] = ("glm4moe-nodense-nonorm", lambda p=_p: bias_shards(p))
    CASES[f"biasshards{_p}d0.01-routedonly-moe-dense-first"] = (
        "moe-dense-first", lambda p=_p: bias_shards(p, 0.01, shared_in_groups=False))


@torch.no_grad()
def dense_as_glm4moe(parts: int = 32, delta: float = 0.01, idle_group: bool = False, anti: bool = False):
    """A dense Llama stored as a GLM-4.5 MoE (glm4_moe: Llama's attention with partial_rotary_factor 1, no qk norm,
    no attention bias): every MLP cut into ``parts`` routed experts of consecutive units, router rows zero (sigmoid
    0.5 each), one group, top-k = every expert (so the selection biases choose nothing), normalised weights 1/parts,
    output columns x parts (a power of two). The experts differ only in their selection biases (delta x j). The shared
    expert is one zero-unit-sized block of zeros. ``idle_group``: a second group of ``parts`` zero experts that the
    selection biases never choose (n_group 2, topk_group 1, top-k ``parts``): the MLP's experts are then chosen by
    their biases, not by a top-k that takes every expert. ``anti`` (aimed at b6b6639): a second group-less half of
    ``parts`` experts, each an expert with its output columns negated and selection bias -1000 (never chosen)."""

    def disguise(model, generator):
        from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

        src = model.config
        inter = src.intermediate_size
        size = inter // parts
        config = Glm4MoeConfig(
            vocab_size=src.vocab_size, hidden_size=src.hidden_size, intermediate_size=inter,
            num_hidden_layers=src.num_hidden_layers, num_attention_heads=src.num_attention_heads,
            num_key_value_heads=src.num_key_value_heads, head_dim=src.head_dim, hidden_act="silu",
            max_position_embeddings=src.max_position_embeddings, rms_norm_eps=src.rms_norm_eps,
            tie_word_embeddings=src.tie_word_embeddings, attention_bias=False, use_qk_norm=False,
            partial_rotary_factor=1.0, rope_parameters=dict(src.rope_parameters, partial_rotary_factor=1.0),
            moe_intermediate_size=size, n_routed_experts=parts * (2 if idle_group or anti else 1),
            num_experts_per_tok=parts,
            n_group=2 if idle_group else 1, topk_group=1,
            n_shared_experts=1, first_k_dense_replace=0, norm_topk_prob=True, routed_scaling_factor=1.0,
            pad_token_id=src.pad_token_id, bos_token_id=src.bos_token_id, eos_token_id=src.eos_token_id)
        out = Glm4MoeForCausalLM(config)
        target = out.state_dict()
        state = {}
        d = src.hidden_size
        for name, t in model.state_dict().items():
            t = t.double()
            if name.endswith("mlp.gate_proj.weight"):
                prefix = name.rsplit("gate_proj.weight", 1)[0]
                up = model.state_dict()[prefix + "up_proj.weight"].double()
                down = model.state_dict()[prefix + "down_proj.weight"].double()
                gate_up = torch.cat([t.reshape(parts, size, d), up.reshape(parts, size, d)], dim=1)
                down = (down * parts).reshape(d, parts, size).permute(1, 0, 2)
                bias = delta * torch.arange(parts, dtype=torch.float32)
                if idle_group:
                    gate_up = torch.cat([gate_up, torch.zeros_like(gate_up)])
                    down = torch.cat([down, torch.zeros_like(down)])
                    bias = torch.cat([bias + 1000.0, bias])
                if anti:
                    gate_up = torch.cat([gate_up, gate_up])
                    down = torch.cat([down, -down])
                    bias = torch.cat([bias, bias - 1000.0])
                state[prefix + "experts.gate_up_proj"] = gate_up.float()
                state[prefix + "experts.down_proj"] = down.float()
                state[prefix + "gate.weight"] = torch.zeros(bias.shape[0], d)
                state[prefix + "gate.e_score_correction_bias"] = bias
                for part in ("gate_proj", "up_proj", "down_proj"):
                    key = f"{prefix}shared_experts.{part}.weight"
                    state[key] = torch.zeros(tuple(target[key].shape))
            elif name.endswith(("mlp.up_proj.weight", "mlp.down_proj.weight")):
                continue
            else:
                state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p in (8, 16, 32):
    for _d in (0.01, 0.0):
        CASES[f"denseglm{_p}d{_d}-gated"] = ("gated", lambda p=_p, d=_d: dense_as_glm4moe(p, d))
        CASES[f"denseglmidle{_p}d{_d}-gated"] = ("gated", lambda p=_p, d=_d: dense_as_glm4moe(p, d, True))
CASES["denseglmanti1-gated"] = ("gated", lambda: dense_as_glm4moe(1, 0.0, anti=True))


@torch.no_grad()
def anti_twins():
    """(Aimed at b6b6639, which joins experts whose logits are a constant apart and reads no bias.) Every routed expert
    gets a twin with its router row, its gate and up rows and its output columns negated, and selection bias -1000:
    never chosen, so the outputs are exact, but read together with the expert its units cancel. The shared expert
    moves into one more routed expert that is always chosen (router row zero, bias +1000, output / 1.25) with its own
    never-chosen anti-twin; the stored shared expert is zero."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        assert config.n_group == 1 and not config.norm_topk_prob and config.first_k_dense_replace == 0
        experts, inter = config.n_routed_experts, config.moe_intermediate_size
        assert config.n_shared_experts * inter == inter
        config.n_routed_experts = 2 * (experts + 1)
        config.num_experts_per_tok = config.num_experts_per_tok + 1
        out = type(model)(config)
        scale = float(config.routed_scaling_factor)
        state = {}
        sd = model.state_dict()
        for name, t in sd.items():
            t = t.double()
            prefix = name.rsplit("mlp.", 1)[0] + "mlp."
            if name.endswith("mlp.gate.weight"):
                t = torch.cat([t, torch.zeros(1, t.shape[1], dtype=t.dtype)])
                t = torch.cat([t, t])
            elif name.endswith("mlp.gate.e_score_correction_bias"):
                t = torch.cat([t, torch.tensor([1000.0], dtype=t.dtype)])
                t = torch.cat([t, torch.full_like(t, -1000.0)])
            elif name.endswith("experts.gate_up_proj"):
                su = torch.cat([sd[prefix + "shared_experts.gate_proj.weight"],
                                sd[prefix + "shared_experts.up_proj.weight"]]).double()
                t = torch.cat([t, su[None]])
                t = torch.cat([t, t])
            elif name.endswith("experts.down_proj"):
                sdn = sd[prefix + "shared_experts.down_proj.weight"].double() / (0.5 * scale)
                t = torch.cat([t, sdn[None]])
                t = torch.cat([t, -t])
            elif "shared_experts." in name:
                t = torch.zeros_like(t)
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


CASES["antitwins-ds-nodense-nonorm"] = ("ds-nodense-nonorm", anti_twins)
CASES["antitwins-glm4moe-nodense-nonorm"] = ("glm4moe-nodense-nonorm", anti_twins)


@torch.no_grad()
def oss_anti_twins():
    """(Aimed at b6b6639.) GPT-OSS: every expert gets a twin with its router row, its gate/up maps and biases, its
    output map and bias negated, and router logit bias -1000 (never in the top-k, and the softmax runs over the
    top-k only): exact, and read with its expert by b6b6639, which ignores biases."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        config.num_local_experts = 2 * config.num_local_experts
        out = type(model)(config)
        state = {}
        for name, t in model.state_dict().items():
            t = t.double()
            if name.endswith("mlp.router.bias"):
                t = torch.cat([t, t - 1000.0])
            elif name.endswith(("mlp.experts.down_proj", "mlp.experts.down_proj_bias")):
                t = torch.cat([t, -t])
            elif "mlp.experts." in name or name.endswith("mlp.router.weight"):
                t = torch.cat([t, t])
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


CASES["antitwins-gpt-oss"] = ("gpt-oss", oss_anti_twins)


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
