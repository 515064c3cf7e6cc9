"""Routed experts read one at a time (scanner.reading.expert_stream): the same fingerprint as the block loaded whole,
for experts stored per expert (as Hub files hold them) and fused (as transformers holds them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.reading import expert_stream
from scanner.reading.architectures.tiny import tiny_config
from scanner.reading.validate import validate_checkpoint


def _largest_difference(a: Fingerprint, b: Fingerprint) -> float:
    return max(float(np.abs(x.gate - y.gate).max() + np.abs(x.up - y.up).max())
               for block_a, block_b in zip(a.blocks, b.blocks, strict=True)
               for x, y in zip(block_a, block_b, strict=True))


@pytest.mark.parametrize("model_type", ["deepseek_v3", "qwen3_moe", "glm4_moe"])
def test_streamed_experts_give_the_fingerprint_of_the_whole_block(tmp_path: Path, model_type: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """With every experts site streamed (threshold 0 bytes), each expert's views and the block's routed output are
    computed expert by expert; the fingerprint matches the one of the block loaded whole to float32 rounding (the
    routed sum is added in another order), summaries included. DeepSeek-V3 and GLM-4.5 have a dense first layer and
    a shared expert beside the routed ones."""
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config(model_type)).save_pretrained(tmp_path / "m")
    whole = fingerprint_model(tmp_path / "m", storage_dtype="float32")
    monkeypatch.setattr(expert_stream, "STREAM_BYTES", 0)
    names, experts = _streamed(tmp_path / "m")
    assert len(names) == 3 * experts  # a gate, an up and a down tensor per expert, each read on its own
    streamed = fingerprint_model(tmp_path / "m", storage_dtype="float32")
    assert [len(b) for b in streamed.blocks] == [len(b) for b in whole.blocks] and max(map(len, whole.blocks)) > 1
    assert _largest_difference(whole, streamed) < 1e-4
    for key in ("mlp_weight_kurtosis", "gate_rms_quantiles"):
        np.testing.assert_allclose(np.array(streamed.meta.summaries[key], dtype=float),
                                   np.array(whole.meta.summaries[key], dtype=float), rtol=1e-5, atol=1e-6)


def test_streamed_experts_read_fused_expert_tensors_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that stores the experts as transformers 5 holds them, (E, 2h, d) and (E, d, h), is sliced one
    expert at a time and reads as the per-expert file of the same model."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("deepseek_v3"))
    model.save_pretrained(tmp_path / "per-expert")
    (tmp_path / "fused").mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or
               not model.config.tie_word_embeddings}, tmp_path / "fused" / "model.safetensors")
    (tmp_path / "fused" / "config.json").write_text(json.dumps(model.config.to_dict()))
    monkeypatch.setattr(expert_stream, "STREAM_BYTES", 0)
    per_expert = fingerprint_model(tmp_path / "per-expert", storage_dtype="float32")
    fused = fingerprint_model(tmp_path / "fused", storage_dtype="float32")
    assert _largest_difference(per_expert, fused) == 0.0
    assert _streamed(tmp_path / "fused")[0] == ["model.layers.1.mlp.experts.gate_up_proj",
                                                "model.layers.1.mlp.experts.down_proj"]


def _streamed(folder: Path) -> tuple[list[str], int]:
    """The stored tensors the last MoE block's routed experts are streamed from (empty: not streamed), and how many
    experts there are."""
    adapter = validate_checkpoint(folder, check_values=False).adapter
    layer = adapter.block_layers[-1]
    site = next(s for s in adapter.tree.sites[layer] if s.experts)
    found = expert_stream.StreamedExperts.find(adapter.tree, layer, site)
    return ([] if found is None else found.stored_names), site.experts
