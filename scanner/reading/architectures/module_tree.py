"""A checkpoint's model as transformers builds it on the meta device, with its stored tensors placed block by block.

Which stored tensor belongs to which module is transformers' own answer: its checkpoint conversion mapping for the
model type (renamed prefixes, per-expert tensors fused into 3-D ones, split or interleaved maps) and its loader
`convert_and_load_state_dict_in_model`, given one block's tensors at a time. So hubtrace holds no table of file
names per family; a block's tensors are those whose converted name lies under that decoder layer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
import transformers
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoModelForMaskedLM, PreTrainedModel
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import (
    WeightConverter,
    WeightRenaming,
    convert_and_load_state_dict_in_model,
    rename_source_key,
)
from transformers.modeling_utils import LoadStateDictConfig
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

from scanner.errors import CheckpointError, UnsupportedArchitectureError, one_line
from scanner.quiet import no_progress_bars
from scanner.reading.architectures.names import TOWER_WORDS
from scanner.reading.architectures.sites import MLPSite, find_sites
from scanner.reading.architectures.tasks import Task, encoder_by_default, encoder_decoder_by_default, model_task
from scanner.reading.checkpoint import Checkpoint


@dataclass(frozen=True)
class DecoderStack:
    """Where the decoder layers are: the base model that runs them and the ModuleList that holds them."""

    base: nn.Module
    layers: nn.ModuleList
    layers_path: str  # e.g. "model.layers", "transformer.h"
    base_path: str = ""  # e.g. "model", "transformer", "bert", "model.language_model" ("": the model itself)


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
        try:
            with no_progress_bars():  # one bar per block would bury a scan's log
                info, _ = convert_and_load_state_dict_in_model(
                    self.lm, state, LoadStateDictConfig(weight_mapping=self._mapping, dtype=torch.float32)
                )
        except Exception as exc:  # transformers' converters raise assorted errors on tensors that do not fit
            raise CheckpointError(f"{self.checkpoint.path}: transformers could not place its tensors: {exc}") from exc
        problems = [*sorted(info.mismatched_keys)[:3], *sorted(info.unexpected_keys)[:3], *info.conversion_errors][:6]
        if problems:
            raise CheckpointError(
                f"{self.checkpoint.path}: tensors {', '.join(map(str, problems))} do not fit the model its config.json "
                "describes (shape or name)"
            )

    def materialize_buffers(self, device: str, dtype: torch.dtype) -> None:
        """Every buffer of the model (rotary tables, masks, Falcon-H1's muP vector) real on `device` and filled by the
        model's own `_init_weights`, as `from_pretrained` fills what no file stores; parameters stay on meta.

        Once, before a forward pass: some of them are set by a parent module (FalconH1Model fills each layer's), and
        they stay while the layers' parameters come and go."""
        for module in self.lm.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer is not None and buffer.is_meta:
                    module._buffers[name] = torch.empty_like(buffer, device=device)
        owners = init_owners(self.lm)
        for module in reversed(list(self.lm.modules())):  # children first, as transformers does (a parent may fill
            owners[id(module)]._init_weights(module)      # its children's buffers, and then has the last word)
        for module in self.lm.modules():
            for name, buffer in list(module.named_buffers(recurse=False)):
                if buffer is not None and buffer.is_floating_point():
                    module._buffers[name] = buffer.to(dtype)

    def load_layer(self, layer: int, device: str, dtype: torch.dtype, *, left_out: Sequence[str] = (),
                   left_out_modules: Sequence[str] = ()) -> nn.Module:
        """Decoder layer `layer` with every parameter real on `device` in `dtype`; refused when one stays unstored.
        `release_layer` puts its parameters back on the meta device. ``left_out``: stored tensors not loaded, and
        ``left_out_modules`` (paths under the layer) whose parameters stay on the meta device: routed experts read
        one at a time instead (`scanner.reading.expert_stream`)."""
        module = self.stack.layers[layer]
        skipped = set(left_out)
        self.load([n for n in self.stored_by_layer.get(layer, []) if n not in skipped], device, dtype)
        self._load_tied(layer, device, dtype)
        kept_out = tuple(f"{path}." for path in left_out_modules)
        missing = [name for name, p in module.named_parameters() if p.is_meta and not name.startswith(kept_out)]
        if missing:
            raise CheckpointError(
                f"{self.checkpoint.path}: block {layer} stores no tensor for {', '.join(missing[:3])}"
                + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
            )
        for sub in module.modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                if not param.is_meta:
                    sub._parameters[name] = nn.Parameter(param.to(device=device, dtype=dtype), requires_grad=False)
        return module

    def _load_tied(self, layer: int, device: str, dtype: torch.dtype) -> None:
        """Parameters of layer `layer` tied to another layer's (Zamba's shared transformer block is stored once,
        under the first hybrid layer): read from the tensor stored for the parameter they are tied to."""
        prefix = f"{self.stack.layers_path}.{layer}."
        tied = getattr(self.lm, "all_tied_weights_keys", None) or {}
        for key, source in tied.items():
            if not key.startswith(prefix) or not self.lm.get_parameter(key).is_meta:
                continue
            stored = self.stored_name(source)
            if stored is not None:
                owner, name = key.rsplit(".", 1)
                tensor = self.checkpoint.get(stored).to(device=device, dtype=dtype)
                self.lm.get_submodule(owner)._parameters[name] = nn.Parameter(tensor, requires_grad=False)

    def release_layer(self, layer: int) -> None:
        """Layer `layer`'s parameters back on the meta device (its buffers stay: they are small and set once)."""
        for sub in self.stack.layers[layer].modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                sub._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=False)
        self.checkpoint.close()  # drop the block's memory maps too


def init_owners(lm: PreTrainedModel) -> dict[int, PreTrainedModel]:
    """id(module) -> the model whose `_init_weights` initialises it: the nearest transformers model at or above it
    (Gemma 3n's and xLSTM's inner models read their own attributes there), as `initialize_weights` dispatches."""
    owners: dict[int, PreTrainedModel] = {}
    stack: list[tuple[nn.Module, PreTrainedModel]] = [(lm, lm)]
    while stack:
        module, owner = stack.pop()
        owner = module if isinstance(module, PreTrainedModel) else owner
        owners[id(module)] = owner
        stack.extend((child, owner) for child in module.children())
    return owners


def build_meta_model(checkpoint: Checkpoint, config) -> PreTrainedModel:
    """The architecture's transformers model with every tensor on the meta device (built-in classes only), eager
    attention chosen here: a checkpoint's `attn_implementation` never picks code (a Hub-style value would load a
    compiled kernel)."""
    try:
        lm = meta_model(config, model_task(config))
    except Exception as exc:  # a config transformers accepts but cannot build a model of (head_dim 0: a zero division)
        raise CheckpointError(f"{checkpoint.path}: transformers could not build the model: {one_line(exc)}") from exc
    return lm.eval()


def meta_model(config, task: Task) -> PreTrainedModel:
    """The model of one kind (`scanner.reading.architectures.tasks`) on the meta device, through transformers' auto
    class for it (or the text model's own `...ForCausalLM` where the auto mapping has none)."""
    with torch.device("meta"):
        if task == "masked-lm":
            return AutoModelForMaskedLM.from_config(config, trust_remote_code=False, attn_implementation="eager")
        if task == "image-text-to-text":
            return AutoModelForImageTextToText.from_config(config, trust_remote_code=False,
                                                           attn_implementation="eager")
        model_class = _text_causal_lm_class(config)
        if model_class is not None:
            return model_class._from_config(config, attn_implementation="eager")
        return AutoModelForCausalLM.from_config(config, trust_remote_code=False, attn_implementation="eager")


def _text_causal_lm_class(config) -> type[PreTrainedModel] | None:
    """The built-in `...ForCausalLM` class that config.architectures names, where transformers' auto mapping has
    none for the config's class: the text model of a multimodal family saved on its own (Emu3's and Mllama's
    `...TextConfig`). Only a class of the transformers package whose config class is exactly this config's."""
    if type(config) in MODEL_FOR_CAUSAL_LM_MAPPING:
        return None
    names = getattr(config, "architectures", None)
    name = names[0] if isinstance(names, list) and names else None
    if not (isinstance(name, str) and name.endswith("ForCausalLM")):
        return None
    candidate = getattr(transformers, name, None)
    built_in = isinstance(candidate, type) and issubclass(candidate, PreTrainedModel)
    return candidate if built_in and candidate.config_class is type(config) else None


def decoder_stack(lm: PreTrainedModel) -> DecoderStack:
    """The ModuleList of decoder layers: of the lists outside a vision or audio tower, the one of `num_hidden_layers`
    modules holding the most parameters, else (LongCat-Flash, whose layers hold two sublayers each; BLT, whose global
    transformer sits between byte-level encoder and decoder stacks) the list holding the most parameters."""
    depth = getattr(lm.config.get_text_config(), "num_hidden_layers", None)  # BLT's config names none
    lists = [(path, m) for path, m in lm.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) and path and not _in_tower(path)]
    if not lists:
        raise UnsupportedArchitectureError(
            f"{type(lm).__name__} has no list of decoder layers that hubtrace can stream block by block"
        )
    exact = [item for item in lists if len(item[1]) == depth]
    path, layers = max(exact or lists, key=lambda item: sum(p.numel() for p in item[1].parameters()))
    base_path = _base_model_path(lm, path)
    return DecoderStack(base=lm.get_submodule(base_path), layers=layers, layers_path=path, base_path=base_path)


def _base_model_path(lm: PreTrainedModel, layers_path: str) -> str:
    """Where the model that embeds the tokens and runs the layers is: the nearest ancestor of the layer list that is
    a transformers model with a token embedding (GPT-2's transformer, CPM-Ant's model around its `encoder.layers`,
    BERT's model around its `encoder.layer`, a VLM's language model); "" for the model itself."""
    parts = layers_path.split(".")[:-1]
    for end in range(len(parts), 0, -1):
        module = lm.get_submodule(".".join(parts[:end]))
        if isinstance(module, PreTrainedModel) and _embeds_tokens(module):
            return ".".join(parts[:end])
    return ""


def _embeds_tokens(model: PreTrainedModel) -> bool:
    try:
        return isinstance(model.get_input_embeddings(), nn.Module)
    except (NotImplementedError, AttributeError):  # BLT's global transformer takes patch vectors, not tokens
        return False


def _in_tower(path: str) -> bool:
    return any(word in part for part in path.split(".") for word in TOWER_WORDS)


def not_decoder_only(config, stack: DecoderStack) -> str | None:
    """Why a causal-LM class is not a decoder-only language model (None when it is): the decoder of an
    encoder-decoder (BART, Marian: its model type is one by default, whatever a saved `...ForCausalLM` config says),
    or an encoder run as a decoder (a BERT-style config with `is_decoder: true`, whose layers live under
    `encoder.`; with `is_decoder: false` the same model is read as an encoder,
    `scanner.reading.architectures.tasks`)."""
    if getattr(config, "is_encoder_decoder", False) or encoder_decoder_by_default(config.model_type):
        return "encoder-decoder: hubtrace reads decoder-only and encoder-only language models"
    if "encoder" in stack.layers_path.split(".") and encoder_by_default(config.model_type):
        return (f"an encoder run as a decoder ({type(stack.layers[0]).__name__} under {stack.layers_path}): hubtrace "
                "reads this model type as an encoder only (is_decoder: false)")
    return None


