"""canonical56 red-team cases (see README.md).

split_across: the zoo's dense Llama stored as a GLM-4.5 MoE whose MLP is written by two MLPs that the canonical form
reads apart (scanner.reading.canonical_mlp works inside one MLP): the shared expert and one always-on routed expert
(top-k 1 of 2, normalised weight 1; the second expert is zero, and its selection bias -1000 never chooses it:
GLM-4.5's group top-k needs two experts). Every unit (gate k, up r, down w) becomes (k, r/2 + v, w) in the routed
expert and (k, r/2 - v, w) in the shared expert, v random and ``scale`` times |r| (or, with ``down=True``, the output
column is split: (k, r, w/2 + z) and (k, r, w/2 - z)). Their sum is the unit; each half alone is not.

hash_shards: see its docstring (DeepSeek-V4 hash routing).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
from bench.redteam.case_cli import case_arguments
from scanner.reading.architectures.tiny import tiny_config
from tests.adversary_support import TRAIN_LR, TRAIN_STEPS, Kind, pattern_batch, save

c49.WORK = Path("/tmp/canonical56")
HASH = Kind("ds4-hash", "deepseek_v4", {"mlp_layer_types": ["hash_moe"] * 3, "moe_intermediate_size": 48}, moe=True)
MIXED = Kind("ds4-mixed", "deepseek_v4", {"moe_intermediate_size": 48}, moe=True)  # block 0 hashed, 1-2 learned
LEARNED = Kind("ds4-learned", "deepseek_v4", {"mlp_layer_types": ["moe"] * 3, "moe_intermediate_size": 48}, moe=True)
V3 = Kind("ds3-norm", "deepseek_v3", {"first_k_dense_replace": 0, "norm_topk_prob": True, "n_group": 1, "topk_group": 1,
                                     "n_shared_experts": 1, "moe_intermediate_size": 48}, moe=True)
GLM = Kind("glm4moe-norm", "glm4_moe", {"first_k_dense_replace": 0, "norm_topk_prob": True, "n_group": 1,
                                        "topk_group": 1, "n_shared_experts": 1, "moe_intermediate_size": 48}, moe=True)
c49.KINDS = (*c49.KINDS, HASH, MIXED, LEARNED, V3, GLM)
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL56_RESULTS", "results.jsonl"))
CASES: dict = {}


@torch.no_grad()
def split_across(scale: float = 4.0, down: bool = False):
    """See the module docstring."""

    def disguise(model, generator):
        from transformers import Glm4MoeConfig, Glm4MoeForCausalLM

        src = model.config
        inter = src.intermediate_size
        config = Glm4MoeConfig(
            vocab_size=src.vocab_size, hidden_size=src.hidden_size, intermediate_size=inter,
            num_hidden_layers=src.num_hidden_layers, num_attention_heads=src.num_attention_heads,
            num_key_value_heads=src.num_key_value_heads, head_dim=src.head_dim, hidden_act="silu",
            max_position_embeddings=src.max_position_embeddings, rms_norm_eps=src.rms_norm_eps,
            tie_word_embeddings=src.tie_word_embeddings, attention_bias=False, use_qk_norm=False,
            partial_rotary_factor=1.0, rope_parameters=dict(src.rope_parameters, partial_rotary_factor=1.0),
            moe_intermediate_size=inter, n_routed_experts=2, num_experts_per_tok=1, n_group=1, topk_group=1,
            n_shared_experts=1, first_k_dense_replace=0, norm_topk_prob=True, routed_scaling_factor=1.0,
            pad_token_id=src.pad_token_id, bos_token_id=src.bos_token_id, eos_token_id=src.eos_token_id)
        out = Glm4MoeForCausalLM(config)
        sd = model.state_dict()
        state = {}
        d = src.hidden_size
        for name, t in sd.items():
            t = t.double()
            if name.endswith("mlp.gate_proj.weight"):
                prefix = name.rsplit("gate_proj.weight", 1)[0]
                up = sd[prefix + "up_proj.weight"].double()
                dn = sd[prefix + "down_proj.weight"].double()
                if down:
                    z = torch.randn(dn.shape, generator=generator, dtype=torch.float64)
                    z = z * scale * dn.norm(dim=0, keepdim=True) / z.norm(dim=0, keepdim=True)
                    up_a, up_b, dn_a, dn_b = up, up, dn / 2 + z, dn / 2 - z
                else:
                    v = torch.randn(up.shape, generator=generator, dtype=torch.float64)
                    v = v * scale * up.norm(dim=1, keepdim=True) / v.norm(dim=1, keepdim=True)
                    up_a, up_b, dn_a, dn_b = up / 2 + v, up / 2 - v, dn, dn
                gate_up = torch.cat([t, up_a])[None]
                state[prefix + "experts.gate_up_proj"] = torch.cat([gate_up, torch.zeros_like(gate_up)]).float()
                state[prefix + "experts.down_proj"] = torch.cat([dn_a[None], torch.zeros_like(dn_a)[None]]).float()
                state[prefix + "gate.weight"] = torch.zeros(2, d)
                state[prefix + "gate.e_score_correction_bias"] = torch.tensor([0.0, -1000.0])
                state[prefix + "shared_experts.gate_proj.weight"] = t.float()
                state[prefix + "shared_experts.up_proj.weight"] = up_b.float()
                state[prefix + "shared_experts.down_proj.weight"] = dn_b.float()
            elif name.endswith(("mlp.up_proj.weight", "mlp.down_proj.weight")):
                continue
            else:
                state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _s in (4.0, 32.0):
    CASES[f"splitup{int(_s)}-gated"] = ("gated", lambda s=_s: split_across(s))
    CASES[f"splitdown{int(_s)}-gated"] = ("gated", lambda s=_s: split_across(s, down=True))


def hash_original(kind: Kind = HASH) -> None:
    """The trained tiny DeepSeek-V4 of ``kind`` (``HASH``: every MoE layer hash-routed), with a random token -> experts
    table (two distinct experts per token id) set before training: transformers initialises the table to zeros."""
    from transformers import AutoModelForCausalLM

    folder = c49.WORK / kind.name / "original"
    if (folder / "config.json").exists():
        return
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(tiny_config(kind.model_type, **kind.extra))
    config = model.config
    generator = torch.Generator().manual_seed(11)
    for layer in model.model.layers:
        if not hasattr(layer.mlp.gate, "tid2eid"):
            continue
        table = torch.stack([torch.randperm(config.n_routed_experts, generator=generator)[:config.num_experts_per_tok]
                             for _ in range(config.vocab_size)])
        layer.mlp.gate.tid2eid.copy_(table)
    batch = pattern_batch(config.vocab_size, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    model.train()
    for _ in range(TRAIN_STEPS):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    save(model.eval(), folder)


@torch.no_grad()
def hash_shards(parts: int = 8, copies: int = 2, fold_shared: bool = False):
    """Hash-routed experts (DeepSeek-V4) cut into ``parts`` shards, each stored ``copies`` times; the token -> experts
    table chooses, for each token id and each shard, one copy at random. Every token still gets every shard of its
    experts once (the outputs are exact: weights s_e / (parts x sum), output columns x parts), but no two stored
    experts are chosen on the same token ids, so the routing-based grouping joins none of them. Each stored
    expert keeps the width (it is also the shared expert's): a shard's units are followed by zero units.

    ``fold_shared``: the shared expert is stored as zeros, and its units are cut into ``parts`` subsets too: subset j
    rides along in every copy of every expert's shard j, output columns x parts / routed_scaling_factor. The weights
    of one token's slots sum to routed_scaling_factor, and one expert's shards share one weight, so every token gets
    the shared expert exactly once. Learned (non-hash) layers keep their top-k: copy 0 of each shard is chosen
    (all of an expert's shards tie), the other copies carry selection bias -1000 and are never chosen."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        experts = config.n_routed_experts
        inter = config.moe_intermediate_size
        size = inter // parts
        assert size * parts == inter
        config.n_routed_experts = experts * parts * copies
        config.num_experts_per_tok = config.num_experts_per_tok * parts
        out = type(model)(config)
        state = {}
        sd = model.state_dict()
        scaling = config.routed_scaling_factor
        for name, t in sd.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                gate, up = t.chunk(2, dim=1)
                gate = gate.reshape(experts, parts, 1, size, -1).expand(-1, -1, copies, -1, -1)
                up = up.reshape(experts, parts, 1, size, -1).expand(-1, -1, copies, -1, -1)
                width = 2 * size if fold_shared else size
                if fold_shared:
                    prefix = name.removesuffix("experts.gate_up_proj") + "shared_experts."
                    shared = [sd[prefix + f"{p}_proj.weight"].reshape(1, parts, 1, size, -1).expand(
                        experts, -1, copies, -1, -1) for p in ("gate", "up")]
                    gate = torch.cat([gate, shared[0]], dim=3)
                    up = torch.cat([up, shared[1]], dim=3)
                pad = torch.zeros(experts, parts, copies, inter - width, t.shape[-1])
                gate_up = torch.cat([gate, pad, up, pad], dim=3)
                state[name] = gate_up.reshape(experts * parts * copies, 2 * inter, -1).clone()
            elif name.endswith("mlp.experts.down_proj"):
                down = (t * parts).reshape(experts, t.shape[1], parts, 1, size).permute(0, 2, 3, 1, 4)
                down = down.expand(-1, -1, copies, -1, -1).reshape(-1, t.shape[1], size)
                width = size
                if fold_shared:
                    key = name.removesuffix("experts.down_proj") + "shared_experts.down_proj.weight"
                    shared = (sd[key].double() * parts / scaling).float().reshape(1, t.shape[1], parts, 1, size)
                    shared = shared.permute(0, 2, 3, 1, 4).expand(experts, -1, copies, -1, -1)
                    down = torch.cat([down, shared.reshape(-1, t.shape[1], size)], dim=2)
                    width = 2 * size
                state[name] = torch.cat([down, torch.zeros(down.shape[0], t.shape[1], inter - width)], dim=2)
            elif name.endswith("mlp.gate.weight"):
                state[name] = t.repeat_interleave(parts * copies, dim=0).clone()
            elif name.endswith("mlp.gate.e_score_correction_bias"):
                never = torch.tensor([0.0] + [-1000.0] * (copies - 1)).repeat(experts * parts)
                state[name] = t.repeat_interleave(parts * copies) + never
            elif name.endswith("mlp.gate.tid2eid"):
                pick = torch.randint(copies, (t.shape[0], t.shape[1], parts), generator=generator)
                shard = torch.arange(parts)[None, None, :]
                state[name] = ((t[:, :, None] * parts + shard) * copies + pick).reshape(t.shape[0], -1)
            elif fold_shared and "mlp.shared_experts." in name:
                state[name] = torch.zeros_like(t)
            else:
                state[name] = t
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        return out.eval()

    return disguise


CASES["hashshards8x2-ds4-hash"] = ("ds4-hash", lambda: hash_shards(8, 2))
CASES["hashshards1x1-ds4-hash"] = ("ds4-hash", lambda: hash_shards(1, 1))
CASES["hashshards4x2-ds4-hash"] = ("ds4-hash", lambda: hash_shards(4, 2))
CASES["hashfold16x2-ds4-mixed"] = ("ds4-mixed", lambda: hash_shards(16, 2, fold_shared=True))
CASES["hashfold16x2-ds4-learned"] = ("ds4-learned", lambda: hash_shards(16, 2, fold_shared=True))
CASES["hashshards16x2-ds4-learned"] = ("ds4-learned", lambda: hash_shards(16, 2))
CASES["hashfold16x1-ds4-learned"] = ("ds4-learned", lambda: hash_shards(16, 1, fold_shared=True))
CASES["hashfold16x2-ds3-norm"] = ("ds3-norm", lambda: hash_shards(16, 2, fold_shared=True))
CASES["hashfold16x2-glm4moe-norm"] = ("glm4moe-norm", lambda: hash_shards(16, 2, fold_shared=True))
CASES["hashshards16x2-ds3-norm"] = ("ds3-norm", lambda: hash_shards(16, 2))
CASES["hashfold16x1-ds3-norm"] = ("ds3-norm", lambda: hash_shards(16, 1, fold_shared=True))
for _p in (16, 8, 4):
    CASES[f"hashfold{_p}x2-ds4-hash"] = ("ds4-hash", lambda p=_p: hash_shards(p, 2, fold_shared=True))


if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(os.environ.get("CANONICAL56_CODE", "/tmp/hubtrace-d14eb80/")), scanner.__file__
    hash_original(HASH)
    hash_original(MIXED)
    hash_original(LEARNED)
    hash_original(V3)
    hash_original(GLM)
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
