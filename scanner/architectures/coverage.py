"""Which causal-LM model types of the installed transformers hubtrace reads, and why it refuses the others.

Computed, not listed: each model type's own config class, its sizes shrunk (`tiny_config`), is built on the meta
device and its decoder layers are searched for MLP sites exactly as a scan does. `hubtrace architectures` prints the
result and docs/architectures.md is generated from it, so the table cannot drift from the code.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging as hf_logging

from scanner.architectures.module_tree import decoder_stack, not_decoder_only
from scanner.architectures.names import UNVERIFIED
from scanner.architectures.sites import find_sites

Verdict = Literal["gated", "plain", "moe", "hybrid", "refused"]

#: Sizes every tiny model takes (whichever of these keys its config has).
TINY_SIZES: dict[str, int] = {
    "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "vocab_size": 128, "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48, "n_shared_experts": 1, "ffn_hidden_size": 96,
    "n_inner": 96, "ffn_dim": 96, "d_ff": 96, "max_position_embeddings": 256, "n_positions": 256, "n_ctx": 256,
    "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
    "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1, "num_experts_per_token": 2, "expert_interval": 1,
    "partial_rotary_factor": 1, "rotary_dim": 16, "rotary_emb_base": 10000,
}
TINY_LAYERS = 2
TINY_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id")


@dataclass(frozen=True)
class Coverage:
    """One model type's verdict: a supported kind, or refused with a one-line reason."""

    model_type: str
    verdict: Verdict
    reason: str

    @property
    def supported(self) -> bool:
        return self.verdict != "refused"


def causal_lm_types() -> list[str]:
    """Every causal-LM model type of the installed transformers, sorted."""
    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_config(model_type: str, **extra: Any) -> PretrainedConfig:
    """The model type's own config with every size shrunk to a tiny model (two layers, width 64)."""
    config = CONFIG_MAPPING[model_type]()
    for target in _configs(config):
        _shrink(target)
        for key, value in extra.items():
            setattr(target, key, value)
    return config


def classify(model_type: str) -> Coverage:
    """Build the tiny model on the meta device and find its MLP sites as a scan would."""
    if model_type in UNVERIFIED:
        return Coverage(model_type, "refused", f"not verified: {UNVERIFIED[model_type]}")
    try:
        config = tiny_config(model_type)
        with warnings.catch_warnings(), _quiet(), torch.device("meta"):
            warnings.simplefilter("ignore")
            lm = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        if getattr(lm.config, "is_encoder_decoder", False):
            return Coverage(model_type, "refused", "encoder-decoder: hubtrace tests decoder-only language models")
        stack = decoder_stack(lm)
    except Exception as exc:  # transformers raises anything from a config it cannot build at tiny sizes
        return Coverage(model_type, "refused", f"transformers does not build it from its own config: {_first(exc)}")
    layer_class = type(stack.layers[0]).__name__
    reason = not_decoder_only(lm.config, stack)
    if reason:
        return Coverage(model_type, "refused", reason)
    sites = [find_sites(layer) for layer in stack.layers]
    if not any(sites):
        return Coverage(model_type, "refused", f"no feed-forward network hubtrace recognises in {layer_class}")
    kinds = {site.kind for layer in sites for site in layer}
    if len(kinds) > 1:
        return Coverage(model_type, "refused", "mixes gated and plain MLPs")
    experts = any(site.experts for layer in sites for site in layer)
    hybrid = not all(sites)
    verdict: Verdict = "hybrid" if hybrid else "moe" if experts else kinds.pop()
    return Coverage(model_type, verdict, _describe(sites))


def coverage() -> Iterator[Coverage]:
    """`classify` for every causal-LM model type."""
    for model_type in causal_lm_types():
        yield classify(model_type)


def coverage_markdown(rows: list[Coverage]) -> str:
    """docs/architectures.md: the share supported, then one table row per model type (hub text never enters it)."""
    supported = [r for r in rows if r.supported]
    decoder_only = [r for r in rows if r.supported or r.reason.startswith(("no feed-forward", "transformers does not",
                                                                             "mixes", "not verified"))]
    lines = [
        "# Architectures",
        "",
        "Generated by `hubtrace architectures --markdown` from the installed transformers; do not edit by hand.",
        "",
        f"**{len(supported)} of {len(rows)}** causal-LM model types are supported "
        f"({len(supported)} of {len(decoder_only)} decoder-only types; the rest are encoders or encoder-decoders).",
        "",
        "| model_type | verdict | MLP sites found (or why refused) |",
        "| --- | --- | --- |",
    ]
    lines += [f"| `{r.model_type}` | {r.verdict} | {r.reason.replace('|', '/')} |" for r in rows]
    return "\n".join(lines) + "\n"


def _configs(config: PretrainedConfig) -> list[PretrainedConfig]:
    sub = [getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None) is not None]
    return [config, *[c for c in sub if isinstance(c, PretrainedConfig)]]


def _shrink(config: PretrainedConfig) -> None:
    depth = _depth(config)
    for key, value in TINY_SIZES.items():
        if isinstance(getattr(config, key, None), int) and not isinstance(getattr(config, key), bool):
            _set(config, key, value)
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(getattr(config, key, None), int):
            _set(config, key, TINY_LAYERS)
    if depth:
        for key, value in list(vars(config).items()):
            if isinstance(value, list) and len(value) == depth:
                _set(config, key, value[:TINY_LAYERS])
    for key in TINY_IDS:
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= TINY_SIZES["vocab_size"]:
            _set(config, key, 1)


def _depth(config: PretrainedConfig) -> int | None:
    for key in ("num_hidden_layers", "n_layer", "num_layers"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def _set(config: PretrainedConfig, key: str, value: Any) -> None:
    try:
        setattr(config, key, value)
    except Exception:  # a derived or validated attribute; the config keeps its own value
        pass


def _describe(sites: list[list]) -> str:
    first = next(layer for layer in sites if layer)
    parts = []
    for site in first:
        where = site.path or "(the layer)"
        if site.experts:
            parts.append(f"{where}: {site.experts} experts, {site.kind}" + (f", {site.fused}" if site.fused else "")
                         + (", transposed" if site.transposed else ""))
        else:
            maps = "/".join(n for n in (site.gate, site.up, site.down) if n)
            parts.append(f"{where}: {maps}" + (f" (fused {site.fused})" if site.fused else ""))
    skipped = sum(1 for layer in sites if not layer)
    tail = f"; {skipped} of {len(sites)} tiny layers hold no MLP" if skipped else ""
    return "; ".join(parts) + tail


def _first(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


class _quiet:
    """transformers' warnings off while a tiny model is built."""

    def __enter__(self) -> None:
        self._level = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()

    def __exit__(self, *_: object) -> None:
        hf_logging.set_verbosity(self._level)
