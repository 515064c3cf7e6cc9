"""The dims and weights every architecture reports in one vocabulary, whichever adapter read it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GLUWeights:
    """One gated MLP (a dense block's MLP or one MoE expert): down(act(gate x) * up x). float32, (out, in)."""

    gate: torch.Tensor  # (h, d)
    up: torch.Tensor  # (h, d)
    down: torch.Tensor  # (d, h)


@dataclass(frozen=True)
class ModelShape:
    """The dims hubtrace needs, as transformers would build the model (config defaults applied)."""

    architecture: str  # config["architectures"][0] if present, else model_type
    model_type: str
    n_layers: int
    hidden_size: int
    intermediate_size: int  # per expert for MoE
    vocab_size: int
    n_experts: int  # 0 for dense models
    hidden_act: str  # activation of the gate, e.g. "silu", "gelu_pytorch_tanh"
    tie_word_embeddings: bool  # True when the output head is the input embedding (no separate head stored)
