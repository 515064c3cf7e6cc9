"""Tiny random models of every supported family, saved the way transformers saves them (save_pretrained).

Shared by the adapter tests (roles against the live modules) and the fingerprint tests (streamed activations
against the live forward pass), so both cover exactly the same families and configurations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, Gemma3Config

D, H, VOCAB, LAYERS = 32, 64, 128, 2
TINY: dict[str, Any] = dict(
    hidden_size=D, intermediate_size=H, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=VOCAB, pad_token_id=0, bos_token_id=1, eos_token_id=2,
)


@dataclass(frozen=True)
class Family:
    config: Callable[[], Any]
    tied: bool = False
    act: str = "silu"
    intermediate_size: int = H
    n_experts: int = 0
    norm_roles: frozenset[str] = field(default_factory=lambda: frozenset({"attn_norm", "mlp_norm"}))


def tiny_config(model_type: str, **extra: Any) -> Callable[[], Any]:
    """A factory of configs of this model type with the TINY dims (and `extra`): a fresh config per call."""
    return lambda: AutoConfig.for_model(model_type, **{**TINY, **extra})


def gemma3_multimodal() -> Gemma3Config:
    text = {**TINY, "head_dim": 8}
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=127,
                        boi_token_index=125, eoi_token_index=126)


QK = frozenset({"q_norm", "k_norm"})
GEMMA2_NORMS = frozenset({"attn_norm", "post_attn_norm", "mlp_norm", "post_mlp_norm"})
GELU = "gelu_pytorch_tanh"
FAMILIES: dict[str, Family] = {
    "llama": Family(tiny_config("llama")),
    "mistral": Family(tiny_config("mistral")),
    "qwen2": Family(tiny_config("qwen2", tie_word_embeddings=True), tied=True),
    "qwen3": Family(tiny_config("qwen3", head_dim=8), norm_roles=frozenset({"attn_norm", "mlp_norm"}) | QK),
    "gemma": Family(tiny_config("gemma", head_dim=8), tied=True, act=GELU),
    "gemma2": Family(tiny_config("gemma2", head_dim=8), tied=True, act=GELU, norm_roles=GEMMA2_NORMS),
    "gemma3_text": Family(tiny_config("gemma3_text", head_dim=8), tied=True, act=GELU, norm_roles=GEMMA2_NORMS | QK),
    "gemma3": Family(gemma3_multimodal, tied=True, act=GELU, norm_roles=GEMMA2_NORMS | QK),
    "phi3": Family(tiny_config("phi3")),
    "olmo": Family(tiny_config("olmo"), norm_roles=frozenset()),
    "olmo2": Family(tiny_config("olmo2"), norm_roles=frozenset({"post_attn_norm", "post_mlp_norm"}) | QK),
    "mixtral": Family(tiny_config("mixtral", num_local_experts=4, num_experts_per_tok=2), n_experts=4),
    # Block 1 is listed in mlp_only_layers, so it is a dense MLP of intermediate_size inside an MoE model.
    "qwen2_moe": Family(
        tiny_config("qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                shared_expert_intermediate_size=48, mlp_only_layers=[1]),
        intermediate_size=16, n_experts=4,
    ),
}
GEMMA_FAMILIES = {"gemma", "gemma2", "gemma3_text", "gemma3"}


def save_random(config: Any, folder: Path) -> None:
    """A model whose every parameter (norms included) is random, so no role can match by being all ones."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    model.save_pretrained(folder, safe_serialization=True)
