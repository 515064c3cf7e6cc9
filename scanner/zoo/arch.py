"""Tiny architectures for the zoo (Llama by default; GPT-2, GPT-NeoX and Mixtral for the null zoos of every MLP
kind), and saving/loading them as Hugging Face directories."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, get_args

import torch
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    GPTNeoXConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    PretrainedConfig,
    PreTrainedModel,
)

from scanner.quiet import no_progress_bars

ModelKind = Literal["llama", "gpt2", "gpt_neox", "mixtral"]
"""Which transformers model a zoo model is, by model_type: a gated MLP (Llama), a plain MLP with learned positions
and tied embeddings (GPT-2), a plain MLP with rotary positions and parallel attention (GPT-NeoX), routed gated
experts (Mixtral)."""
MODEL_KINDS: tuple[str, ...] = get_args(ModelKind)
#: Routed experts of a Mixtral zoo model, and how many each token uses.
MIXTRAL_EXPERTS, MIXTRAL_TOP_K = 4, 2


@dataclass(frozen=True)
class ArchSpec:
    """Shape of a zoo model: small enough to train on one CPU thread in seconds, yet GQA + RoPE like Llama."""

    vocab_size: int = 256
    hidden_size: int = 64
    intermediate_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    seq_len: int = 64

    def config(self) -> LlamaConfig:
        """The transformers config; embeddings are untied so T1/T3 camouflage can treat the head separately."""
        return LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.seq_len,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=None,
        )

    def with_(self, **changes: int) -> ArchSpec:
        """A copy with some fields changed (e.g. a narrower MLP after pruning)."""
        return replace(self, **changes)


def arch_of(model: PreTrainedModel) -> ArchSpec:
    """Read an ArchSpec back from a model's config (GPT-2 names its MLP width n_inner, and has no key-value heads
    of its own)."""
    c = model.config
    return ArchSpec(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=getattr(c, "intermediate_size", None) or c.n_inner,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
        seq_len=c.max_position_embeddings,
    )


def kind_config(arch: ArchSpec, kind: ModelKind) -> PretrainedConfig:
    """The transformers config of a zoo model of this kind and shape, each kind as its model type lays it out by
    default (GPT-2 ties its embeddings, GPT-NeoX rotates a quarter of each head and runs attention and MLP in
    parallel); the GPT-2 and GPT-NeoX token ids sit inside the tiny vocabulary."""
    if kind == "llama":
        return arch.config()
    if kind == "gpt2":
        return GPT2Config(vocab_size=arch.vocab_size, n_embd=arch.hidden_size, n_inner=arch.intermediate_size,
                          n_layer=arch.num_layers, n_head=arch.num_heads, n_positions=arch.seq_len, bos_token_id=0,
                          eos_token_id=0)
    if kind == "gpt_neox":
        return GPTNeoXConfig(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
                             intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_layers,
                             num_attention_heads=arch.num_heads, max_position_embeddings=arch.seq_len,
                             bos_token_id=0, eos_token_id=0)
    if kind == "mixtral":
        return MixtralConfig(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
                             intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_layers,
                             num_attention_heads=arch.num_heads, num_key_value_heads=arch.num_kv_heads,
                             max_position_embeddings=arch.seq_len, num_local_experts=MIXTRAL_EXPERTS,
                             num_experts_per_tok=MIXTRAL_TOP_K, tie_word_embeddings=False, bos_token_id=None,
                             eos_token_id=None)
    raise ValueError(f"unknown zoo model kind {kind!r}; choose one of {', '.join(MODEL_KINDS)}")


def new_model(arch: ArchSpec, seed: int, kind: ModelKind = "llama") -> PreTrainedModel:
    """A freshly initialised float32 model; the init depends only on ``seed`` (global RNG is restored)."""
    config = kind_config(arch, kind)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config) if kind == "llama" else AutoModelForCausalLM.from_config(config)
    return model.float().eval()


def save_model(model: LlamaForCausalLM, path: Path) -> None:
    """Write ``config.json`` + ``model.safetensors`` (float32) into ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    with no_progress_bars():
        model.save_pretrained(path)


def load_model(path: Path) -> LlamaForCausalLM:
    """Load a zoo model in float32, eval mode."""
    with no_progress_bars():
        return LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
