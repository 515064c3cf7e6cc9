"""canonical53 red-team cases (see README.md).

post-norm + sink (FlexOlmo): the dead-unit bar (`_written_on_inputs`) keeps a unit when, at some canonical token, it
writes at least DEAD = 1e-6 of what its MLP's units write together there OR of the residual stream. canonical51 moved
the first reference (a twin-expert sink pair writing +-2^e along a widened coordinate; each expert is read alone),
canonical52 the second (a post-norm layout's stream scaled by 2^s, readers scaled back). Here both at once, in one
FlexOlmo copy: widened by ``extra`` zero coordinates, every expert twinned with a +-sink, then the stream scaled.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical52.cases as c52
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical53")
c49.RESULTS = Path(__file__).with_name("results.jsonl")
CASES: dict = {}
POST = ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")


@torch.no_grad()
def flex_widened_twin_sink(model, extra: int, exponent: int, generator):
    """FlexOlmo widened by ``extra`` zero coordinates (post-norms and the final norm: gains x sqrt(d/(d+z)), ones on the
    new ones; eps x d/(d+z), so q and k are scaled by sqrt(d/(d+z)) for their norms), every expert twinned (router
    rows doubled, top-k doubled), each twin with one sink unit writing +-2^``exponent`` x its hidden value on the
    first new coordinate."""
    config = copy.deepcopy(model.config)
    d = config.hidden_size
    config.head_dim = getattr(model.config, "head_dim", None) or d // config.num_attention_heads
    config.hidden_size = d + extra
    config.rms_norm_eps = model.config.rms_norm_eps * d / (d + extra)
    experts = config.num_experts
    inter = config.intermediate_size
    sink = exponent > -1000
    config.num_experts = 2 * experts
    config.num_experts_per_tok = 2 * config.num_experts_per_tok
    config.intermediate_size = inter + (4 if sink else 0)
    gain = math.sqrt(d / (d + extra))
    out = type(model)(config)
    state = {}
    big = 2.0**exponent
    for name, t in model.state_dict().items():
        t = t.double()
        if name.endswith(POST) or name == "model.norm.weight":
            t = torch.cat([t * gain, torch.ones(extra, dtype=t.dtype)])
        elif name.endswith("mlp.gate.weight"):
            t = torch.cat([t, t])
            t = torch.cat([t, torch.zeros(t.shape[0], extra, dtype=t.dtype)], dim=1)
        elif name.endswith("experts.gate_up_proj"):
            t = torch.cat([t, torch.zeros(*t.shape[:-1], extra, dtype=t.dtype)], dim=-1)
            gate, up = t[:, :inter], t[:, inter:]
            if sink:
                scale = float(gate.norm(dim=-1).mean())
                g = torch.zeros(experts, 4, t.shape[-1], dtype=t.dtype)
                u = torch.zeros(experts, 4, t.shape[-1], dtype=t.dtype)
                pick = torch.randint(0, d, (experts,), generator=generator)
                g[torch.arange(experts), 0, pick] = 2.0 ** round(math.log2(scale))
                u[torch.arange(experts), 0, pick] = 2.0 ** round(math.log2(scale))
                t = torch.cat([gate, g, up, u], dim=1)
            t = torch.cat([t, t])
        elif name.endswith("experts.down_proj"):
            t = torch.cat([t, torch.zeros(t.shape[0], extra, t.shape[2], dtype=t.dtype)], dim=1)
            if sink:
                column = torch.zeros(experts, t.shape[1], 4, dtype=t.dtype)
                column[:, d, 0] = big
                t = torch.cat([torch.cat([t, column], dim=2), torch.cat([t, -column], dim=2)])
            else:
                t = torch.cat([t, t])
        elif name.endswith(("q_proj.weight", "k_proj.weight")):  # q/k norms see eps x d/(d+z): inputs x sqrt of it
            t = torch.cat([t * gain, torch.zeros(t.shape[0], extra, dtype=t.dtype)], dim=-1)
        elif name.endswith("o_proj.weight"):
            t = torch.cat([t, torch.zeros(extra, t.shape[1], dtype=t.dtype)])
        elif t.ndim == 2 and t.shape[-1] == d:
            t = torch.cat([t, torch.zeros(t.shape[0], extra, dtype=t.dtype)], dim=-1)
        state[name] = t.float()
    missing, unexpected = out.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m or "inv_freq" in m for m in missing), missing
    return out.eval()


def post_norm_sink(sink_exponent: int = 40, scale_exponent: int = 24, extra: int = 192):
    def disguise(model, generator):
        wide = flex_widened_twin_sink(model, extra, sink_exponent, generator)
        return c52.any_post_norm_stream_scale(scale_exponent)(wide, generator)

    return disguise


for _s, _c in ((40, 24), (40, 0), (-2000, 24), (-2000, 0), (30, 24), (40, 16), (20, 20)):
    CASES[f"postsink{_s}-scale{_c}-flex-olmo"] = ("flex-olmo-nopad", lambda s=_s, c=_c: post_norm_sink(s, c))


@torch.no_grad()
def expert_shards(parts: int = 32, pad: int = 1):
    """Every routed expert cut into ``parts`` experts of its units (in order, ``pad`` zero units each): router rows
    repeated ``parts`` times (so the shards of one expert are always chosen together, each with 1/parts of its
    weight), top-k x ``parts``, output columns x ``parts`` (a power of two: exact). The MoE computes what it did; each
    shard holds fewer units than a test needs, and the one-to-one expert pairing pairs only as many shards as the
    original has experts."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        key = "num_local_experts" if hasattr(config, "num_local_experts") else "num_experts"
        experts = getattr(config, key)
        inter = config.intermediate_size
        assert inter % parts == 0
        size = inter // parts
        setattr(config, key, experts * parts)
        config.num_experts_per_tok = config.num_experts_per_tok * parts
        config.intermediate_size = size + pad
        out = type(model)(config)
        state = {}
        for name, t in model.state_dict().items():
            t = t.double()
            if name.endswith("mlp.gate.weight"):
                t = t.repeat_interleave(parts, dim=0)
            elif name.endswith("experts.gate_up_proj"):
                gate = t[:, :inter].reshape(experts * parts, size, -1)
                up = t[:, inter:].reshape(experts * parts, size, -1)
                zero = torch.zeros(experts * parts, pad, t.shape[-1], dtype=t.dtype)
                t = torch.cat([gate, zero, up, zero], dim=1)
            elif name.endswith("experts.down_proj"):
                d = t.shape[1]
                t = (t * parts).reshape(experts, d, parts, size).permute(0, 2, 1, 3).reshape(experts * parts, d, size)
                t = torch.cat([t, torch.zeros(experts * parts, d, pad, dtype=t.dtype)], dim=2)
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p, _pad in ((32, 1), (16, 2), (12, 0), (12, 4), (8, 4), (4, 8), (1, 0)):
    CASES[f"shards{_p}p{_pad}-moe-softmax"] = ("moe-softmax", lambda p=_p, q=_pad: expert_shards(p, q))
    CASES[f"shards{_p}p{_pad}-flex-olmo"] = ("flex-olmo-nopad", lambda p=_p, q=_pad: expert_shards(p, q))

for _p, _pad in ((32, 1), (16, 2), (8, 4), (4, 8), (1, 0)):  # the first runs' names
    CASES[f"shards{_p}-moe-softmax"] = CASES[f"shards{_p}p{_pad}-moe-softmax"]
    CASES[f"shards{_p}-flex-olmo"] = CASES[f"shards{_p}p{_pad}-flex-olmo"]


@torch.no_grad()
def dense_as_moe(parts: int = 32, pad: int = 0):
    """A dense gated (Llama) copy stored as Mixtral: each MLP cut into ``parts`` experts of its units, all always
    chosen (router rows zero: softmax 1/parts each, exactly, top-k = parts, renormalised to 1/parts), output columns
    x ``parts`` (a power of two). Attention, norms and embeddings are Llama's, which Mixtral computes the same way."""
    from transformers import MixtralConfig, MixtralForCausalLM

    def disguise(model, generator):
        c = model.config
        inter = c.intermediate_size
        size = inter // parts
        config = MixtralConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=size + pad,
            num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads,
            num_key_value_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            max_position_embeddings=c.max_position_embeddings,
            rms_norm_eps=c.rms_norm_eps,
            rope_parameters=dict(c.rope_parameters),
            tie_word_embeddings=c.tie_word_embeddings,
            num_local_experts=parts,
            num_experts_per_tok=parts,
            sliding_window=None,
            hidden_act=c.hidden_act,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
        )
        out = MixtralForCausalLM(config)
        state = {}
        d = c.hidden_size
        for name, t in model.state_dict().items():
            t = t.double()
            if name.endswith("mlp.gate_proj.weight") or name.endswith("mlp.up_proj.weight"):
                continue
            if name.endswith("mlp.down_proj.weight"):
                prefix = name[: -len("down_proj.weight")]
                sd = model.state_dict()
                gate = sd[prefix + "gate_proj.weight"].double().reshape(parts, size, d)
                up = sd[prefix + "up_proj.weight"].double().reshape(parts, size, d)
                zero = torch.zeros(parts, pad, d, dtype=t.dtype)
                state[prefix + "experts.gate_up_proj"] = torch.cat([gate, zero, up, zero], dim=1).float()
                down = (t * parts).reshape(d, parts, size).permute(1, 0, 2)
                down = torch.cat([down, torch.zeros(parts, d, pad, dtype=t.dtype)], dim=2)
                state[prefix + "experts.down_proj"] = down.float()
                state[prefix + "gate.weight"] = torch.zeros(parts, d)
                continue
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


for _p, _pad in ((32, 0), (16, 0), (1, 0)):
    CASES[f"denseasmoe{_p}-gated"] = ("gated", lambda p=_p, q=_pad: dense_as_moe(p, q))


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    c49.DTYPE = dtype or c49.DTYPE
    for name in names:
        c49.run(name, threads, CASES)
