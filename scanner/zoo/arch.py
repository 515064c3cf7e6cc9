"""Tiny Llama architectures for the zoo, and saving/loading them as Hugging Face directories."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scanner.quiet import no_progress_bars


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


def arch_of(model: LlamaForCausalLM) -> ArchSpec:
    """Read an ArchSpec back from a model's config."""
    c = model.config
    return ArchSpec(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_layers=c.num_hidden_layers,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        seq_len=c.max_position_embeddings,
    )


def new_model(arch: ArchSpec, seed: int) -> LlamaForCausalLM:
    """A freshly initialised float32 model; the init depends only on ``seed`` (global RNG is restored)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(arch.config())
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
