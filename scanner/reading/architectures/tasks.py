"""Which kind of language model a config describes, and which transformers class holds it.

hubtrace reads three kinds, each through transformers' own auto class for it:

* a **causal LM** (decoder-only; `AutoModelForCausalLM`), read left to right;
* the **language model inside an image-text-to-text checkpoint** (LLaVA, Qwen2-VL, Mistral 3, Idefics 3, PaliGemma,
  ...; `AutoModelForImageTextToText`): the vision tower and projector are never run, the text model's own forward
  reads the canonical token ids, so its fingerprint compares with a text-only model of the same MLP kind;
* an **encoder masked LM** (BERT, RoBERTa, DeBERTa, ModernBERT, ...; `AutoModelForMaskedLM`), read on the same
  canonical ids with its own bidirectional attention. Its units see every position, a decoder's only the earlier
  ones, so an encoder's fingerprint is compared only with an encoder's (`attention`).

The kind is the config class's answer, not a name in config.json: a BERT-style model type is an encoder unless its
config says `is_decoder` (a BERT run as a decoder is a causal LM, and refused as one is today).
"""

from __future__ import annotations

from functools import cache
from typing import Literal

from transformers import CONFIG_MAPPING, PretrainedConfig
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    MODEL_FOR_MASKED_LM_MAPPING,
)

Task = Literal["causal-lm", "image-text-to-text", "masked-lm"]
#: How a model's units see the input: a decoder's causally (each position the ones before it), an encoder's every one.
Attention = Literal["causal", "bidirectional"]


def model_task(config: PretrainedConfig) -> Task:
    """The kind of language model this config describes (see the module docstring). A config no auto class knows is
    a causal LM here, so that transformers' own error names what is wrong with it."""
    config_class = type(config)
    if encoder_decoder_by_default(config.model_type):
        return "causal-lm"  # refused as an encoder-decoder, whatever auto classes list it
    if config_class in MODEL_FOR_MASKED_LM_MAPPING and _reads_bidirectionally(config):
        return "masked-lm"
    if config_class in MODEL_FOR_CAUSAL_LM_MAPPING or config_class not in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return "causal-lm"
    return "image-text-to-text"


def task_attention(task: Task) -> Attention:
    return "bidirectional" if task == "masked-lm" else "causal"


def _reads_bidirectionally(config: PretrainedConfig) -> bool:
    """A masked-LM config class that is no causal LM's (DeBERTa, ModernBERT) is an encoder; one that is both
    (BERT's, RoBERTa's) is an encoder by design unless this config asks for a decoder."""
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        return True
    return encoder_by_default(config.model_type) and not getattr(config, "is_decoder", False)


@cache
def _default_values(model_type: str) -> dict:
    """The model type's default config as a dict (empty where transformers cannot build its own default)."""
    try:
        return CONFIG_MAPPING[model_type]().to_dict()
    except Exception:  # a default that fails its own validation (gemma4_assistant in transformers 5.24)
        return {}


def encoder_decoder_by_default(model_type: str) -> bool:
    """BART, Marian, Whisper, MusicGen: an encoder-decoder model type, even where a saved `...ForCausalLM` (its
    decoder alone) says otherwise."""
    return bool(_default_values(model_type).get("is_encoder_decoder"))


def encoder_by_default(model_type: str) -> bool:
    """BERT-style configs carry `is_decoder`, False unless a causal LM is asked for, and `add_cross_attention` for
    the decoder of a seq2seq pair: an encoder by design (Reformer, a causal LM that also says is_decoder False, has
    no cross-attention)."""
    values = _default_values(model_type)
    return values.get("is_decoder") is False and "add_cross_attention" in values
