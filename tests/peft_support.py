"""Adapters made as people make them, with PEFT itself: tiny bases, LoRA fine-tunes of them, and the merged forms
PEFT's own `merge_and_unload` writes (what hubtrace must read an adapter-only folder as)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import single_thread

VOCAB = 256
LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, max_position_embeddings=64)
#: What LoRA fine-tunes of chat models usually adapt: attention and MLP projections.
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_llama(folder: Path, seed: int) -> LlamaForCausalLM:
    """A random tiny Llama, saved (safetensors) as a base model folder."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA)).eval()
    model.save_pretrained(folder)
    return model


def lora_finetune(base: PreTrainedModel, *, steps: int = 40, seed: int = 0, lr: float = 1e-3,
                  **lora: Any) -> PeftModel:
    """A LoRA fine-tune of ``base`` (changed in place by PEFT's wrapping): ``steps`` Adam steps of next-token loss on a
    synthetic language, on one thread (reproducible)."""
    config = LoraConfig(**{"r": 8, "lora_alpha": 16, "target_modules": TARGETS, **lora})
    model = get_peft_model(base, config)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=lr)
    language = MarkovLanguage(seed=100 + seed, vocab_size=base.config.vocab_size)
    data = torch.Generator().manual_seed(seed)
    model.train()
    with single_thread():
        for _ in range(steps):
            tokens = language.sample(8, 32, data)
            loss = model(input_ids=tokens, labels=tokens).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return model.eval()


def save_adapter(model: PeftModel, folder: Path, base: str) -> None:
    """save_pretrained of the adapter alone, naming its base as a Hub upload does (PEFT writes whatever the base was
    loaded from; here it was built in memory, so the name is set as `from_pretrained("org/name")` would have)."""
    model.save_pretrained(folder)
    config_file = folder / "adapter_config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": base}))


def save_merged(model: PeftModel, folder: Path) -> None:
    """The adapter merged into a copy of its base by PEFT (`merge_and_unload`), saved as a full model."""
    merged = model.merge_and_unload(safe_merge=True)
    merged.save_pretrained(folder)
