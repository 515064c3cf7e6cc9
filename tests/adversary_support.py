"""Models for the adversary suite: tiny models of each MLP kind, trained briefly so that their weights carry the
structure training leaves (the zoo's trained Llamas stand for the gated kind), and the disguises that apply to them."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from scanner.quiet import no_progress_bars
from scanner.reading.architectures.tiny import tiny_config
from tests.fixtures import adversary as adv

#: Steps and learning rate of the brief training: enough to move every weight (the loss falls by a third or more on
#: the repeating pattern below), little enough to cost a second or two per model on one core.
TRAIN_STEPS, TRAIN_LR = 40, 3e-3


@dataclass(frozen=True)
class Kind:
    """One model kind of the suite: its transformers model type and the config changes that give its layout."""

    name: str
    model_type: str
    extra: dict
    moe: bool = False


KINDS = (
    Kind("plain-relu", "gpt2", {"activation_function": "relu"}),           # GPT-2 layout, rescalable units
    Kind("plain-gelu", "gpt_neox", {}),                                      # rotary, parallel residual
    Kind("moe-softmax", "mixtral", {}, moe=True),                            # every block routed, softmax top-k
    Kind("moe-dense-first", "deepseek_v3", {}, moe=True),                    # block 0 dense, selection bias
    Kind("moe-interleaved", "llama4_text", {"num_hidden_layers": 4, "moe_layers": [1, 3]}, moe=True),
    Kind("hybrid", "jamba", {}, moe=True),                                   # Mamba and attention, dense then MoE
)


def pattern_batch(vocab: int, seed: int) -> torch.Tensor:
    """A batch of a repeating token pattern (each row its own offset): something a tiny model learns fast."""
    generator = torch.Generator().manual_seed(seed)
    offsets = torch.randint(0, vocab, (8, 1), generator=generator)
    return (torch.arange(32).remainder(7) * 3 + offsets) % vocab


def trained_model(kind: Kind, seed: int) -> PreTrainedModel:
    """A tiny model of the kind, initialised from ``seed`` and trained for `TRAIN_STEPS` AdamW steps."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(kind.model_type, **kind.extra))
    vocab = model.config.get_text_config().vocab_size
    batch = pattern_batch(vocab, seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    model.train()
    for _ in range(TRAIN_STEPS):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def save(model: PreTrainedModel, folder: Path) -> Path:
    with no_progress_bars():
        model.save_pretrained(folder)
    return folder


def disguised(model: PreTrainedModel, disguise: adv.Disguise, seed: int) -> PreTrainedModel:
    """A disguised copy of the model (the model itself is left as it was)."""
    return adv.apply(disguise, copy.deepcopy(model), seed)


def probe_ids(model: PreTrainedModel) -> torch.Tensor:
    """Random token ids the logits are checked on (not the canonical inputs the fingerprints read)."""
    vocab = model.config.get_text_config().vocab_size
    return torch.randint(0, vocab, (2, 48), generator=torch.Generator().manual_seed(99))
