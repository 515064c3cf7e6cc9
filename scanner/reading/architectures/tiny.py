"""A tiny model of any causal-LM model type, made from transformers' own config class for it.

The coverage table (`scanner.reading.architectures.coverage`) and its end-to-end test build one such model per model
type, so the shrinking must keep each config consistent: it edits the config's dict (`to_dict`) and builds the class
anew from it, so every derived field (DeepSeek's qk_head_dim, a per-layer override) is computed by the class itself.
Layers are picked so that every distinct kind of layer the default config lists (attention or Mamba, dense or MoE,
sliding or full) keeps one representative. What a size key cannot say (a Mamba mixer's head count must divide its inner
width) is in `TINY_OVERRIDES`, one row per model type, each with why.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig

#: Widths every tiny model takes (whichever of these keys its config has, where the default is an int), in groups of
#: one kind of width. Within a group, widths equal in the default config stay equal (the first key's value): the
#: key-value heads of a multi-head model, DeepSeek's head_dim and rotary dim, a hidden size a projection repeats.
TINY_WIDTHS: tuple[dict[str, int], ...] = (
    {"hidden_size": 64, "word_embed_proj_dim": 64, "embedding_dim": 64, "emb_dim": 64, "lru_width": 64,
     "kv_lora_rank": 16, "q_lora_rank": 16, "mamba_dt_rank": 8, "hidden_size_per_layer_input": 16},
    {"num_attention_heads": 4, "num_key_value_heads": 2, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
     "index_n_heads": 2},
    {"qk_rope_head_dim": 8, "head_dim": 16, "d_head": 16, "qk_nope_head_dim": 16, "v_head_dim": 16, "qk_head_dim": 24,
     "rotary_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "index_head_dim": 16},
    {"intermediate_size": 96, "ffn_hidden_size": 96, "n_inner": 96, "ffn_dim": 96, "d_ff": 96, "d_inner": 96,
     "dff": 96, "dim_ff": 96, "intermediate_size_mlp": 96, "dense_intermediate_size": 96,
     "moe_intermediate_size": 32, "expert_ffn_hidden_size": 32, "shared_expert_intermediate_size": 48,
     "shared_experts_intermediate_size": 48, "moe_shared_expert_intermediate_size": 48,
     "shared_intermediate_size": 48},
    {"vocab_size": 128, "vocab_size_per_layer_input": 128, "unpadded_vocab_size": 128},
)
#: Settings that are not widths (counts of experts, positions): set as they are, never tied to a width.
TINY_SETTINGS: dict[str, int] = {
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "n_shared_experts": 1,
    "max_position_embeddings": 256, "n_positions": 256, "n_ctx": 256, "first_k_dense_replace": 1, "n_group": 1,
    "topk_group": 1, "expert_interval": 1, "partial_rotary_factor": 1, "rotary_emb_base": 10000, "index_topk": 8,
}
#: Keys a default config may leave None that the modelling code needs at tiny sizes (real checkpoints set them).
TINY_WHEN_NONE = ("head_dim", "num_key_value_heads", "num_experts_per_tok")
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "num_blocks")
TOKEN_ID_KEYS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")
#: Layers a homogeneous tiny model has; a stack of several layer kinds keeps one of each (at most `MAX_LAYERS`).
TINY_LAYERS = 2
MAX_LAYERS = 4

_MAMBA = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 16, "mamba_expand": 2}
#: An override that removes the key, so the config class derives it from the tiny sizes.
DROP = object()
_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 16,
            "indexer_compress_ratio": 2}
_DOTS3_SWA = {"swa_num_attention_heads": 4, "swa_num_key_value_heads": 4, "swa_q_lora_rank": 16, "swa_kv_lora_rank": 16,
              "swa_head_dim": 24, "swa_qk_nope_head_dim": 16, "swa_v_head_dim": 16, "per_layer_config": DROP}
_NO_KV_SHARING = {"num_kv_shared_layers": 0}  # two or three layers leave none to share keys and values with
#: What the generic shrink cannot know, per model type (applied to the top config and to a sub-config that has the
#: key), each with why.
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    # Mamba-2 mixers: heads x head width must equal expand x hidden (128 = 8 x 16), and the state stays small.
    "bamba": {**_MAMBA, "attn_layer_indices": [1]},
    "falcon_h1": {**_MAMBA, "mamba_d_ssm": 128},
    "granitemoehybrid": {**_MAMBA, "layer_types": ["mamba", "attention"]},
    "mamba2": {"num_heads": 8, "head_dim": 16, "state_size": 16, "chunk_size": 16},
    # Defaults transformers itself cannot build or run (a missing rope table, no expert count, no token budget).
    "cohere_compass_text": {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    "dots1": {"n_routed_experts": 4, "n_shared_experts": 1},
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "kv_n_heads": 1, "clip_qkv": 8.0},
             "ffn_config": {"hidden_size": 64, "ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 1}},
    "qwen4_exp": _INDEXER, "qwen4_exp_text": _INDEXER,
    "zaya": {"num_experts_per_tok": 1},  # ZAYA routes to one expert only
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # (pattern, repeats): one pair of layers
    # dots.llm3 derives its sliding-window layers' widths from swa_* keys, per-layer overrides and all.
    "dots3_note": {**_DOTS3_SWA, "adapter_in_dim": 64, "adapter_out_dim": 64, "adapter_input_size": 64},
    "dots3_note_text": _DOTS3_SWA,
    # Dory's input, recurrent and output layers must add up to its depth.
    "dory": {"num_hidden_layers": 3, "n_input_layers": 1, "n_recurrent_layers": 1, "n_output_layers": 1,
             "layer_types": DROP},
    # ReformerModelWithLMHead runs only as a decoder; its axial position table must factor the width and positions.
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [16, 48], "axial_pos_shape": [16, 16]},
    # A stack of two or three layers has no layer left to share keys and values with.
    "gemma3n": _NO_KV_SHARING, "gemma3n_text": _NO_KV_SHARING,
    # Multimodal rotary embeddings split each head's rotary half into (time, height, width) sections that must add up
    # to it: 8 at head width 16, 4 where only half the head is rotated (GLM-4.5V).
    **{t: {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
       for t in ("qwen2_5_vl", "paddleocr_vl", "hunyuan_vl", "qwen2_5_omni_thinker")},
    # Vision towers and projectors whose widths no shared key names (a 26M-entry merger at tiny text sizes): shrunk
    # only so that the end-to-end check stays quick; the language model inside is what is read.
    "qwen2_vl": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                 "vision_config": {"embed_dim": 64, "num_heads": 4}},
    **{t: {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
           "vision_config": {"out_hidden_size": 64}} for t in ("glm4v", "glm46v", "glmga", "glm_ocr")},
    "janus": {"vq_config": {"num_embeddings": 64, "projection_dim": 64, "image_token_embed_dim": 64,
                            "base_channels": 32, "latent_channels": 32, "channel_multiplier": [1, 2],
                            "num_res_blocks": 1},
              "vision_config": {"projection_dim": 64}},
    "muse_glimmer": {"out_hidden_size": 64, "projector_hidden_size": 64},
    "nemotron_h_omni": {"projector_hidden_size": 64},
    "cohere2_vision": {"alignment_intermediate_size": 64},
    "step3p7": {"sliding_window": 16},
    "cosmos3_edge": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}},
    "hy_v4_vl": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}},
    # A tower's output width that must equal the (shrunk) text width, which no shared key ties to it.
    "granite_docling": {"vision_config": {"out_hidden_size": 64}},
    **{t: {"vision_config": {"text_hidden_size": 64}} for t in ("inkling2", "inkling2_loop")},
    "muse_spark": {"audio_config": {"out_hidden_size": 64, "hidden_sizes": [16, 16, 16, 16]}, "out_hidden_size": 64,
                   "projector_hidden_size": 64},
    "molmo2": {"adapter_config": {"vision_feature_layer": [-1], "text_hidden_size": 64}},
    "glm4v_moe": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                                      "mrope_section": [1, 1, 2]}},
    "aria": {"moe_num_experts": 4},
    "luke": {"entity_vocab_size": 64},  # a row per Wikipedia entity (500k) in its entity embedding
    # LFM2-MoE lists no layer types by default; Zamba's shared transformer needs two hybrid layers to be shared.
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    "zamba": {"num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1, "num_mem_blocks": 1,
              "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"]},
}


def tiny_config(model_type: str, **extra: Any) -> PretrainedConfig:
    """The model type's own config with every size shrunk (width 64, a few layers); `extra` overrides last."""
    overrides = {**TINY_OVERRIDES.get(model_type, {}), **extra}
    default = CONFIG_MAPPING[model_type]()
    values = _fields_only(_shrunk(default.to_dict(), type(default)), default.to_dict(), type(default))
    subs = {key: _shrunk_nested(values[key], sub_class)
            for key, sub_class in getattr(default, "sub_configs", {}).items() if isinstance(values.get(key), dict)}
    for key, value in overrides.items():  # last: a dict for a sub-config merges into it
        values[key] = {**subs.pop(key), **value} if key in subs and isinstance(value, dict) else value
        for sub in subs.values():
            if key in sub:
                sub[key] = value
    values |= subs
    return type(default).from_dict(_without_dropped(values))


def _shrunk_nested(values: dict[str, Any], config_class: type) -> dict[str, Any]:
    """A sub-config shrunk, and its own sub-configs in turn (pi0's VLM holds a vision and a text config): a class
    that is only `AutoConfig` is the one its dict's model_type names."""
    if not hasattr(config_class, "attribute_map") and values.get("model_type") in CONFIG_MAPPING:
        config_class = CONFIG_MAPPING[values["model_type"]]
    out = _shrunk(values, config_class)
    for key, sub_class in (getattr(config_class, "sub_configs", None) or {}).items():
        if isinstance(out.get(key), dict):
            out[key] = _shrunk_nested(out[key], sub_class)
    return out


def _without_dropped(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _without_dropped(v) if isinstance(v, dict) else v for k, v in values.items() if v is not DROP}


def _fields_only(shrunk: dict[str, Any], default: dict[str, Any], config_class: type) -> dict[str, Any]:
    """The shrunk dict without what the class derives in `__post_init__` from the widths, which from_dict would set
    back to the default model's value: attributes that are no field (Zamba2's mamba_headdim, DeepSeek's qk_head_dim),
    and fields declared None that the default config filled in and the shrink left alone (Zamba's
    attention_hidden_size, RWKV's). A key the dict holds under another name than its field's (`attribute_map`: Bailing
    Hybrid's field num_local_experts is stored as num_experts) is that field's: dropped, it would leave the default
    model's 512 experts in a tiny one."""
    if not dataclasses.is_dataclass(config_class):
        return shrunk
    fields = {f.name: f for f in dataclasses.fields(config_class)}
    fields |= {stored: fields[name] for name, stored in (getattr(config_class, "attribute_map", None) or {}).items()
               if name in fields and stored not in fields}
    kept = {}
    for key, value in shrunk.items():
        field = fields.get(key)
        if key != "per_layer_config" and field is None:
            continue
        derived = (field is not None and field.default is None and value is not None and value == default.get(key)
                   and key not in getattr(config_class, "sub_configs", {}))
        if not derived:
            kept[key] = value
    return kept


def _shrunk(values: dict[str, Any], config_class: type) -> dict[str, Any]:
    """One config dict (not its sub-configs) at tiny sizes; keys as the class stores them (GPT-2's n_embd is its
    hidden_size: `attribute_map`)."""
    aliases = getattr(config_class, "attribute_map", None) or {}
    out = copy.deepcopy(values)
    depth_keys = {aliases.get(k, k) for k in DEPTH_KEYS}
    depth = next((out[k] for k in depth_keys if isinstance(out.get(k), int)), None)
    for group in (*TINY_WIDTHS, TINY_SETTINGS):
        tied: dict[int, int] = {}  # a default width -> the tiny width it became
        for generic, tiny in group.items():
            key = aliases.get(generic, generic)
            value = out.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                out[key] = tied.setdefault(value, tiny) if group is not TINY_SETTINGS else tiny
            elif isinstance(value, list) and value and all(isinstance(v, int) for v in value):
                out[key] = [tiny] * len(value)  # a width per layer (Gemma 3n's intermediate_size)
            elif value is None and generic in TINY_WHEN_NONE and key in out:
                out[key] = tiny
    if depth:
        kept = _kept_layers(out, depth)
        for key in depth_keys:
            if isinstance(out.get(key), int):
                out[key] = len(kept)
        for key, value in list(out.items()):
            if isinstance(value, list) and len(value) == depth:
                out[key] = [value[i] for i in kept]
        if isinstance(out.get("per_layer_config"), dict):
            out["per_layer_config"] = _per_layer(out["per_layer_config"], kept, values, out)
    vocab = out.get(aliases.get("vocab_size", "vocab_size"))
    for key in TOKEN_ID_KEYS:
        if isinstance(vocab, int) and isinstance(out.get(key), int) and out[key] >= vocab:
            out[key] = 1
    return out


def _kept_layers(values: dict[str, Any], depth: int) -> list[int]:
    """The first layer of each distinct kind (a tuple across every per-layer list), in order; a homogeneous stack
    keeps its first `TINY_LAYERS`."""
    lists = [v for v in values.values() if isinstance(v, list) and len(v) == depth]
    overridden = {int(k) for k in (values.get("per_layer_config") or {})}
    seen: dict[tuple, int] = {}
    for layer in range(depth):
        kind = (*(repr(v[layer]) for v in lists), layer in overridden)
        seen.setdefault(kind, layer)
    kept = sorted(seen.values())[:MAX_LAYERS]
    if len(kept) < TINY_LAYERS:
        kept = list(range(min(depth, TINY_LAYERS)))
    return kept


def _per_layer(per_layer: dict[str, dict[str, Any]], kept: list[int], values: dict[str, Any],
               shrunk: dict[str, Any]) -> dict[str, Any]:
    """Per-layer overrides of the kept layers, renumbered, their sizes scaled as the global ones were."""
    out = {}
    for new, old in enumerate(kept):
        key = next((k for k in per_layer if int(k) == old), None)
        if key is None:
            continue
        layer = {}
        for name, value in per_layer[key].items():
            tiny, base = shrunk.get(name), values.get(name)
            if isinstance(tiny, int) and isinstance(value, int) and isinstance(base, int) and base:
                layer[name] = max(1, tiny * value // base)
            else:
                layer[name] = value
        out[str(new).zfill(len(key))] = layer
    return out
