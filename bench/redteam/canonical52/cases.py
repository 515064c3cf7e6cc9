"""canonical52 red-team cases (see README.md).

stream-scale (post-norm layouts, OLMo2): the dead-unit bar (`_written_on_inputs`) weighs each unit's raw write,
|output column| x hidden value, against the residual stream the layer is called with. In OLMo2 the stream is read only
by linear maps (q/k/v, gate/up; q and k through their own RMSNorms) and by the final norm, and each sub-block writes
through a post-norm (post_attention_layernorm, post_feedforward_layernorm) that removes the scale of what the units
write. So the whole stream can be scaled by c = 2^e (embeddings x c, post-norm gains x c) while every reading map is
divided by c (q/k/v, gate/up): every product is scaled by a power of two, exactly. The MLP's units, their inputs and
their hidden values are unchanged; only the stream they are weighed against is c times larger.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
from bench.redteam.case_cli import case_arguments
from tests.adversary_support import KINDS, Kind

c49.WORK = Path("/tmp/canonical52")
c49.RESULTS = Path(__file__).with_name("results.jsonl")
c49.KINDS = KINDS + (Kind("post-norm-olmo2", "olmo2", {}), Kind("olmo2-nopad", "olmo2", {"pad_token_id": None}),
                         Kind("gemma2-nopad", "gemma2", {"pad_token_id": None}),
                         Kind("gemma3-nopad", "gemma3_text", {"pad_token_id": None}),
                         Kind("glm4-nopad", "glm4", {"pad_token_id": None}),
                         Kind("flex-olmo-nopad", "flex_olmo", {"pad_token_id": None}, moe=True),
                         Kind("olmo3-nopad", "olmo3", {"pad_token_id": None}))
CASES: dict = {}


def stream_scale(exponent: int = 24, mantissa: float = 1.0):
    """OLMo2: the residual stream x c, every map that reads it / c, post-norm gains x c (c = mantissa 2^exponent)."""
    c = mantissa * 2.0 ** exponent

    @torch.no_grad()
    def disguise(model, generator):
        if model.config.tie_word_embeddings:
            raise ValueError("tied embeddings: untie first")
        base = model.model
        base.embed_tokens.weight.mul_(c)
        for layer in base.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                         layer.mlp.gate_proj, layer.mlp.up_proj):
                proj.weight.div_(c)
                assert proj.bias is None
            layer.post_attention_layernorm.weight.mul_(c)
            layer.post_feedforward_layernorm.weight.mul_(c)
        return model

    return disguise


def gemma_stream_scale(exponent: int = 24, post=("post_attention_layernorm", "post_feedforward_layernorm"),
                       offset: float = 1.0):
    """Gemma2/3, GLM-4 (pre- and post-norms): embeddings x c, post-norm gains (offset + w) x c; the pre-norms remove
    the scale."""
    c = 2.0 ** exponent

    @torch.no_grad()
    def disguise(model, generator):
        base = model.model
        if model.config.tie_word_embeddings:
            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(base.embed_tokens.weight.detach().clone())
        base.embed_tokens.weight = torch.nn.Parameter(base.embed_tokens.weight.detach() * c)
        for layer in base.layers:
            for norm in (getattr(layer, name) for name in post):
                norm.weight.copy_((offset + norm.weight.double()) * c - offset)
        return model

    return disguise


def llama_stream_scale(exponent: int = 20):
    """Control, Llama (pre-norms only): stream x c needs every writer x c (o_proj, down_proj) and eps x c^2, so each
    unit's write scales with the stream it is weighed against."""
    c = 2.0 ** exponent

    @torch.no_grad()
    def disguise(model, generator):
        base = model.model
        if model.config.tie_word_embeddings:
            model.config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(base.embed_tokens.weight.detach().clone())
        base.embed_tokens.weight = torch.nn.Parameter(base.embed_tokens.weight.detach() * c)
        for layer in base.layers:
            layer.self_attn.o_proj.weight.mul_(c)
            layer.mlp.down_proj.weight.mul_(c)
        model.config.rms_norm_eps = model.config.rms_norm_eps * c * c
        for module in model.modules():
            if hasattr(module, "variance_epsilon"):
                module.variance_epsilon = model.config.rms_norm_eps
        return model

    return disguise


def any_post_norm_stream_scale(exponent: int = 24):
    """OLMo2-style layouts read off the state dict (OLMo3, FlexOlmo's experts and router): embeddings x c, every
    matrix of a layer that reads the stream (last dim d; not o_proj / down_proj) / c, post-norm gains x c."""
    c = 2.0 ** exponent

    @torch.no_grad()
    def disguise(model, generator):
        if model.config.tie_word_embeddings:
            raise ValueError("tied embeddings")
        d = model.config.hidden_size
        model.model.embed_tokens.weight.mul_(c)
        for layer in model.model.layers:
            for name, t in layer.named_parameters():
                if name in ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight"):
                    t.mul_(c)
                elif t.ndim >= 2 and t.shape[-1] == d and "o_proj" not in name and "down_proj" not in name:
                    t.div_(c)
        return model

    return disguise


for _e in (16, 24, 40):
    CASES[f"streamscale{_e}-flex-olmo"] = ("flex-olmo-nopad", lambda e=_e: any_post_norm_stream_scale(e))
    CASES[f"streamscale{_e}-olmo3"] = ("olmo3-nopad", lambda e=_e: any_post_norm_stream_scale(e))
CASES["streamscale0-flex-olmo"] = ("flex-olmo-nopad", lambda: any_post_norm_stream_scale(0))
CASES["control-streamscale20-gated"] = ("gated", lambda: llama_stream_scale(20))


for _e in (4, 8, 12, 16, 20, 24, 28, 32, 40):
    CASES[f"streamscale{_e}-olmo2"] = ("post-norm-olmo2", lambda e=_e: stream_scale(e))
for _e in (8, 16, 17, 18, 19, 20, 24, 32, 40):
    CASES[f"streamscale{_e}-olmo2-nopad"] = ("olmo2-nopad", lambda e=_e: stream_scale(e))
CASES["streamscale0-olmo2-nopad"] = ("olmo2-nopad", lambda: stream_scale(0))
for _m in (1.25, 1.5, 1.75):
    CASES[f"streamscale16m{_m}-olmo2-nopad"] = ("olmo2-nopad", lambda m=_m: stream_scale(16, m))
for _e in (0, 8, 10, 12, 14, 15, 16, 20, 24, 40):
    CASES[f"streamscale{_e}-gemma2-nopad"] = ("gemma2-nopad", lambda e=_e: gemma_stream_scale(e))
CASES["streamscale24-gemma3-nopad"] = ("gemma3-nopad", lambda: gemma_stream_scale(24))
CASES["streamscale0-gemma3-nopad"] = ("gemma3-nopad", lambda: gemma_stream_scale(0))
_GLM = ("post_self_attn_layernorm", "post_mlp_layernorm")
CASES["streamscale24-glm4-nopad"] = ("glm4-nopad", lambda: gemma_stream_scale(24, _GLM, 0.0))
CASES["streamscale0-glm4-nopad"] = ("glm4-nopad", lambda: gemma_stream_scale(0, _GLM, 0.0))
CASES["streamscale0-olmo2"] = ("post-norm-olmo2", lambda: stream_scale(0))


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    c49.DTYPE = dtype or c49.DTYPE
    for name in names:
        c49.run(name, threads, CASES)
