"""The language model inside an image-text-to-text checkpoint, read as a text model: a VLM built on a text model tests
dependent on it, and not on an unrelated one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.tiny import tiny_config

DEPENDENT = -20.0
INDEPENDENT = -3.0  # a valid test falls below once in a thousand; the seeds are fixed


def _text_model(model_type: str, folder: Path, seed: int) -> PreTrainedModel:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    model.save_pretrained(folder)
    return model


def vlm_on(text: PreTrainedModel, vlm_type: str, folder: Path, *, drift: float = 0.02) -> None:
    """A tiny VLM of ``vlm_type`` whose language model is ``text``'s weights, moved by ``drift`` (relative noise, as
    multimodal training moves them), with a fresh vision tower and projector; saved as transformers saves it."""
    torch.manual_seed(123)
    vlm = AutoModelForImageTextToText.from_config(tiny_config(vlm_type, text_config=text.config.to_dict()))
    language = decoder_stack(vlm).base
    with torch.no_grad():
        language.load_state_dict(decoder_stack(text).base.state_dict())
        head = vlm.get_output_embeddings().weight
        if head is not language.get_input_embeddings().weight:  # a VLM that ties its head has the embedding already
            head.copy_(text.get_output_embeddings().weight)
        for parameter in language.parameters():
            parameter.add_(drift * float(parameter.std()) * torch.randn_like(parameter))
    vlm.save_pretrained(folder)


@pytest.mark.parametrize(("vlm_type", "text_type"), [
    ("llava", "llama"), ("smolvlm", "llama"), ("idefics3", "llama"), ("mistral3", "mistral"),
    ("paligemma", "gemma"), ("internvl", "qwen2"),
])
def test_a_vlm_built_on_a_text_model_tests_dependent_on_it(tmp_path: Path, vlm_type: str, text_type: str) -> None:
    text = _text_model(text_type, tmp_path / "text", seed=0)
    _text_model(text_type, tmp_path / "unrelated", seed=1)
    vlm_on(text, vlm_type, tmp_path / "vlm")
    vlm, base, unrelated = (fingerprint_model(tmp_path / name) for name in ("vlm", "text", "unrelated"))
    assert vlm.meta.model_type == vlm_type and vlm.meta.attention == "causal"
    assert vlm.comparable_with(base) is None  # the same canonical inputs, the same kind of units
    assert compare_fingerprints(vlm, base).log10_p <= DEPENDENT
    assert compare_fingerprints(vlm, unrelated).log10_p >= INDEPENDENT
