"""A checkpoint's model as transformers builds it on the meta device, with its stored tensors placed block by block.

Which stored tensor belongs to which module is transformers' own answer: its checkpoint conversion mapping for the
model type (renamed prefixes, per-expert tensors fused into 3-D ones, split or interleaved maps) and its loader
`convert_and_load_state_dict_in_model`, given one block's tensors at a time. So hubtrace holds no table of file
names per family; a block's tensors are those whose converted name lies under that decoder layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    WeightConverter,
    WeightRenaming,
    convert_and_load_state_dict_in_model,
    rename_source_key,
)
from transformers.modeling_utils import LoadStateDictConfig
from transformers.utils import logging as hf_logging

from scanner.architectures.sites import MLPSite, find_sites
from scanner.checkpoint import Checkpoint
from scanner.errors import CheckpointError, UnsupportedArchitectureError


@dataclass(frozen=True)
class DecoderStack:
    """Where the decoder layers are: the base model that runs them and the ModuleList that holds them."""

    base: nn.Module
    layers: nn.ModuleList
    layers_path: str  # e.g. "model.layers", "transformer.h"


class ModuleTree:
    """The meta-device model of a checkpoint, its MLP sites per layer, and a loader of its stored tensors."""

    def __init__(self, checkpoint: Checkpoint, lm: PreTrainedModel) -> None:
        self.checkpoint = checkpoint
        self.lm = lm
        self.stack = decoder_stack(lm)
        self.sites: list[list[MLPSite]] = [find_sites(layer) for layer in self.stack.layers]
        self._mapping = get_model_conversion_mapping(lm)
        self._meta_keys = dict(lm.state_dict())

    @cached_property
    def model_keys(self) -> dict[str, str]:
        """Stored tensor name -> the model key transformers loads it into (the first target of a fused one)."""
        renamings = [m for m in self._mapping if isinstance(m, WeightRenaming)]
        converters = [m for m in self._mapping if isinstance(m, WeightConverter)]
        prefix = self.lm.base_model_prefix or None
        return {
            name: rename_source_key(name, renamings, converters, prefix, self._meta_keys)[0]
            for name in self.checkpoint.tensor_names()
        }

    @cached_property
    def stored_by_layer(self) -> dict[int, list[str]]:
        """Layer index -> the stored tensor names that load into that decoder layer."""
        pattern = re.compile(re.escape(self.stack.layers_path) + r"\.(\d+)\.")
        out: dict[int, list[str]] = {}
        for name, key in self.model_keys.items():
            if m := pattern.match(key):
                out.setdefault(int(m.group(1)), []).append(name)
        return out

    def stored_name(self, module_key: str) -> str | None:
        """The stored tensor that loads into `module_key` unchanged (None when none does, or only through a fusion)."""
        return next((name for name, key in self.model_keys.items() if key == module_key), None)

    def load(self, names: list[str], device: str, dtype: torch.dtype) -> None:
        """Load these stored tensors into their modules through transformers' converters, then move what they
        filled to `device` and `dtype`; a tensor that fits nowhere, or a shape the config does not give, is refused."""
        state = {name: self.checkpoint.get(name) for name in names}
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # one bar per block would bury a scan's log
        try:
            info, _ = convert_and_load_state_dict_in_model(
                self.lm, state, LoadStateDictConfig(weight_mapping=self._mapping, dtype=torch.float32)
            )
        except Exception as exc:  # transformers' converters raise assorted errors on tensors that do not fit
            raise CheckpointError(f"{self.checkpoint.path}: transformers could not place its tensors: {exc}") from exc
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        problems = [*sorted(info.mismatched_keys)[:3], *sorted(info.unexpected_keys)[:3], *info.conversion_errors][:6]
        if problems:
            raise CheckpointError(
                f"{self.checkpoint.path}: tensors {', '.join(map(str, problems))} do not fit the model its config.json "
                "describes (shape or name)"
            )

    def load_layer(self, layer: int, device: str, dtype: torch.dtype) -> nn.Module:
        """Decoder layer `layer` with every parameter real on `device` in `dtype`; refused when one stays unstored."""
        module = self.stack.layers[layer]
        for sub in module.modules():  # buffers no file stores (causal masks, rotary tables): the model's own values
            if any(b.is_meta for b in sub.buffers(recurse=False)):
                sub.to_empty(device="cpu", recurse=False)
                self.lm._init_weights(sub)
        self.load(self.stored_by_layer.get(layer, []), device, dtype)
        missing = [name for name, p in module.named_parameters() if p.is_meta]
        if missing:
            raise CheckpointError(
                f"{self.checkpoint.path}: block {layer} stores no tensor for {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            )
        return module.to(device=device, dtype=dtype)


def build_meta_model(checkpoint: Checkpoint, config) -> PreTrainedModel:
    """The architecture's transformers model with every tensor on the meta device (built-in classes only), eager
    attention chosen here: a checkpoint's `attn_implementation` never picks code (a Hub-style value would load a
    compiled kernel)."""
    try:
        with torch.device("meta"):
            lm = AutoModelForCausalLM.from_config(config, trust_remote_code=False, attn_implementation="eager")
    except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError, ImportError) as exc:
        raise CheckpointError(f"{checkpoint.path}: transformers could not build the model: {exc}") from exc
    return lm.eval()


def decoder_stack(lm: PreTrainedModel) -> DecoderStack:
    """The ModuleList of decoder layers: the list of `num_hidden_layers` modules holding the most parameters."""
    depth = lm.config.get_text_config().num_hidden_layers
    lists = [(path, m) for path, m in lm.named_modules() if isinstance(m, nn.ModuleList) and len(m) == depth and path]
    if not lists:
        raise UnsupportedArchitectureError(
            f"{type(lm).__name__} has no list of {depth} decoder layers that hubtrace can stream block by block"
        )
    path, layers = max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    parent_path = path.rsplit(".", 1)[0] if "." in path else ""
    return DecoderStack(base=lm.get_submodule(parent_path), layers=layers, layers_path=path)


def not_decoder_only(config, stack: DecoderStack) -> str | None:
    """Why a causal-LM class is not a decoder-only language model (None when it is): the decoder of an
    encoder-decoder (BART, Marian: `is_encoder_decoder`), or an encoder run as a decoder (BERT-style `...ForCausalLM`,
    whose layers live under `encoder.`)."""
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder: hubtrace tests decoder-only language models"
    if "encoder" in stack.layers_path.split("."):
        return (f"an encoder run as a decoder ({type(stack.layers[0]).__name__} under {stack.layers_path}): hubtrace "
                "tests decoder-only language models")
    return None
