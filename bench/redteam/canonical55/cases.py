"""canonical55 red-team cases (see README.md).

jetmoe shards: JetMoE's MoE block (JetMoeMoE) is called as mlp(layer_input) and computes its routing inside; its router
(mlp.router, JetMoeTopKGating) returns (index_sorted_experts, batch_index, batch_gates, expert_size, logits). Neither
the experts-module hook (args[1], args[2]) nor the router-output reader (a (tokens, experts) float table first) sees
a routing there, so `alike_groups` leaves every expert alone. Shards of one expert with its router row are then read
as separate experts (canonical53's shard break, which b474db6 answers only where it sees the routing).
Softmax over the top-k logits: `parts` shards with equal logits, top-k x parts, each gets w/parts: output x parts.
JetMoE's attention experts (MoA) share num_local_experts and the top-k: each is repeated ``parts`` times (identical
copies, each weighed w/parts, sum exact).
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

c49.WORK = Path("/tmp/canonical55")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL55_RESULTS", "results.jsonl"))
JET = Kind("jetmoe", "jetmoe", {}, moe=True)
DBRX = Kind("dbrx", "dbrx", {}, moe=True)
DBRX2 = Kind("dbrx-top2-l2", "dbrx", {"ffn_config": {"moe_top_k": 2, "moe_normalize_expert_weights": 2.0,
                                                     "ffn_hidden_size": 96, "moe_num_experts": 4}}, moe=True)
c49.KINDS = (*c49.KINDS, JET, DBRX, DBRX2)
CASES: dict = {}


@torch.no_grad()
def jet_shards(parts: int = 8):
    """Every JetMoE expert cut into ``parts`` shards of consecutive units with the expert's router row."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        experts, inter = config.num_local_experts, config.intermediate_size
        assert inter % parts == 0
        size = inter // parts
        config.num_local_experts = experts * parts
        config.num_experts_per_tok = config.num_experts_per_tok * parts
        config.intermediate_size = size
        out = type(model)(config)
        state = {}
        for name, t in model.state_dict().items():
            t = t.double()
            if "self_attention.experts." in name and not name.endswith("experts.bias"):
                t = t.repeat_interleave(parts, dim=0)  # MoA: identical attention experts, each w/parts: exact
            elif name.endswith("mlp.router.layer.weight"):
                t = t.repeat_interleave(parts, dim=0)
            elif name.endswith("mlp.input_linear.weight"):
                d = t.shape[-1]
                gate = t[:, :inter].reshape(experts * parts, size, d)
                up = t[:, inter:].reshape(experts * parts, size, d)
                t = torch.cat([gate, up], dim=1)
            elif name.endswith("mlp.output_linear.weight"):
                d = t.shape[1]
                t = t.reshape(experts, d, parts, size).permute(0, 2, 1, 3).reshape(experts * parts, d, size) * parts
            elif ".mlp." in name and name.split(".mlp.")[1] not in ("bias",):
                raise AssertionError(name)
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p in (1, 2, 4, 8, 16):
    CASES[f"jetshards{_p}-jetmoe"] = ("jetmoe", lambda p=_p: jet_shards(p))


@torch.no_grad()
def dbrx_shards(parts: int = 16):
    """DBRX: every expert cut into ``parts`` shards of consecutive units with the expert's router row, top-k x parts.
    The experts site is ffn.experts.mlp (DbrxExpertGLU), called as mlp(x, w1, v1, w2): no routing is seen there, and
    the router (ffn.router, raw logits) is no child of ffn.experts. Softmax over all experts: each shard gets
    softmax/parts; the p-norm normalisation of the top-k then gives w / parts^(1/p) (p None: w / parts)."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        ffn = config.ffn_config
        experts, inter, p = ffn.moe_num_experts, ffn.ffn_hidden_size, ffn.moe_normalize_expert_weights
        assert inter % parts == 0
        ffn.moe_num_experts = experts * parts
        ffn.moe_top_k = ffn.moe_top_k * parts
        ffn.ffn_hidden_size = inter // parts
        scale = parts if p is None else parts ** (1.0 / p)
        out = type(model)(config)
        state = {}
        for name, t in model.state_dict().items():
            t = t.double()
            if name.endswith("ffn.router.layer.weight"):
                t = t.repeat_interleave(parts, dim=0)
            elif name.endswith("ffn.experts.mlp.w2"):
                t = t * scale  # (E h, d): the rows are already in shard order
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p in (1, 4, 8, 16):
    CASES[f"dbrxshards{_p}-dbrx"] = ("dbrx", lambda p=_p: dbrx_shards(p))
    CASES[f"dbrxshards{_p}-dbrx-top2-l2"] = ("dbrx-top2-l2", lambda p=_p: dbrx_shards(p))


@torch.no_grad()
def dense_as_jetmoe(experts: int = 32):
    """A dense Llama (GQA, RoPE, RMSNorm, SiLU gated MLP) stored as a JetMoE whose routing the scanner never sees.
    Attention as MoA: JetMoE's query head (slot s, kv head j) attends with kv head j, so attention expert e < H/K holds
    the Llama query heads j H/K + e (q rows) and their o_proj columns (x ``experts``: every weight is 1/experts);
    the other attention experts have zero maps. MLP: cut into ``experts`` shards of consecutive units, router rows
    zero, top-k = every expert (softmax of equal logits: 1/experts each), output columns x ``experts``."""

    def disguise(model, generator):
        from transformers import JetMoeConfig, JetMoeForCausalLM

        src = model.config
        heads, kv, hd, d = src.num_attention_heads, src.num_key_value_heads, src.head_dim, src.hidden_size
        rep, inter = heads // kv, src.intermediate_size
        assert experts >= rep and inter % experts == 0
        size = inter // experts
        config = JetMoeConfig(
            vocab_size=src.vocab_size, hidden_size=d, num_hidden_layers=src.num_hidden_layers,
            num_key_value_heads=kv, kv_channels=hd, intermediate_size=size,
            max_position_embeddings=src.max_position_embeddings, activation_function="silu",
            num_local_experts=experts, num_experts_per_tok=experts, tie_word_embeddings=src.tie_word_embeddings,
            rope_parameters=dict(src.rope_parameters), rms_norm_eps=src.rms_norm_eps,
            bos_token_id=src.bos_token_id, eos_token_id=src.eos_token_id, pad_token_id=src.pad_token_id)
        out = JetMoeForCausalLM(config)
        sd = {k: v.double() for k, v in model.state_dict().items()}
        state = {name: sd[name] for name in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight")}
        for i in range(src.num_hidden_layers):
            src_p, dst = f"model.layers.{i}.", f"model.layers.{i}."
            for norm in ("input_layernorm", "post_attention_layernorm"):
                state[f"{dst}{norm}.weight"] = sd[f"{src_p}{norm}.weight"]
            q = sd[f"{src_p}self_attn.q_proj.weight"].reshape(heads, hd, d)
            o = sd[f"{src_p}self_attn.o_proj.weight"].reshape(d, heads, hd)
            k, v = sd[f"{src_p}self_attn.k_proj.weight"], sd[f"{src_p}self_attn.v_proj.weight"]
            state[f"{dst}self_attention.kv_proj.weight"] = torch.cat([k, v])
            q_in = torch.zeros(experts, kv * hd, d, dtype=torch.float64)
            o_out = torch.zeros(experts, d, kv * hd, dtype=torch.float64)
            for e in range(rep):
                for j in range(kv):
                    q_in[e, j * hd:(j + 1) * hd] = q[j * rep + e]
                    o_out[e, :, j * hd:(j + 1) * hd] = o[:, j * rep + e] * experts
            state[f"{dst}self_attention.experts.input_linear.weight"] = q_in
            state[f"{dst}self_attention.experts.output_linear.weight"] = o_out
            state[f"{dst}self_attention.experts.router.layer.weight"] = torch.zeros(experts, d, dtype=torch.float64)
            state[f"{dst}self_attention.experts.bias"] = torch.zeros(d, dtype=torch.float64)
            gate = sd[f"{src_p}mlp.gate_proj.weight"].reshape(experts, size, d)
            up = sd[f"{src_p}mlp.up_proj.weight"].reshape(experts, size, d)
            down = sd[f"{src_p}mlp.down_proj.weight"].reshape(d, experts, size).permute(1, 0, 2) * experts
            state[f"{dst}mlp.input_linear.weight"] = torch.cat([gate, up], dim=1)
            state[f"{dst}mlp.output_linear.weight"] = down
            state[f"{dst}mlp.router.layer.weight"] = torch.zeros(experts, d, dtype=torch.float64)
            state[f"{dst}mlp.bias"] = torch.zeros(d, dtype=torch.float64)
        missing, unexpected = out.load_state_dict({n: t.float() for n, t in state.items()}, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _e in (4, 16, 32):
    CASES[f"densejet{_e}-gated"] = ("gated", lambda e=_e: dense_as_jetmoe(e))


def routing_probe(model_types: list[str], image_text: bool = False) -> None:
    """For each model type: a random tiny model (tiny_config), saved and fingerprinted, printing for every routed site
    whether `alike_groups` was given a routing (True) or none (False: every expert is read alone)."""
    import json

    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    import scanner.reading.alike_experts as ae
    import scanner.reading.expert_stream as es
    from scanner.fingerprints.fingerprint import fingerprint_model
    from scanner.reading.architectures.tiny import tiny_config

    seen: list = []
    original = ae.alike_groups

    def spy(routing, experts):
        seen.append((routing is not None, experts))
        return original(routing, experts)

    ae.alike_groups = es.alike_groups = spy
    auto = AutoModelForImageTextToText if image_text else AutoModelForCausalLM
    for model_type in model_types:
        seen.clear()
        try:
            torch.manual_seed(0)
            model = auto.from_config(tiny_config(model_type)).eval()
            folder = c49.WORK / "probe" / model_type
            model.save_pretrained(folder)
            fingerprint_model(folder)
            print(json.dumps({"type": model_type, "seen": seen}), flush=True)
        except Exception as error:  # noqa: BLE001 - a probe: report and go on
            print(json.dumps({"type": model_type, "error": repr(error)[:200]}), flush=True)


if __name__ == "__main__":
    import scanner
    assert scanner.__file__.startswith(os.environ.get("CANONICAL55_CODE", "/tmp/hubtrace-b474db6/")), scanner.__file__
    if sys.argv[1:2] in (["--probe"], ["--probe-itt"]):
        routing_probe(sys.argv[2:], image_text=sys.argv[1] == "--probe-itt")
        sys.exit(0)
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
