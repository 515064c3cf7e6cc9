"""Derivatives made with the tools people use on a hub: a LoRA fine-tune with PEFT, merged into its base (as most
uploads of a LoRA fine-tune are), and merges with mergekit, run as a person runs them: from the hub's root, offline,
on local paths, writing mergekit's own card and ``mergekit_config.yml`` beside the weights.

Both are test and development dependencies (pyproject's ``test`` extra): only zoo recipes import this module.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from mergekit.config import MergeConfiguration
from mergekit.io.tasks import LoaderCache
from mergekit.merge import MergeOptions, run_merge
from peft import LoraConfig, get_peft_model
from transformers import LlamaForCausalLM

from scanner.zoo.arch import load_model
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import TrainLog, TrainSpec, single_thread, train_lm

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a block, as the common "all-linear" LoRA recipes target them."""


def lora_finetune(parent: LlamaForCausalLM, language: MarkovLanguage, spec: TrainSpec, rank: int,
                  adapter_folder: Path | None = None, base_id: str = "") -> tuple[LlamaForCausalLM, TrainLog]:
    """A LoRA of ``rank`` trained with PEFT on a copy of ``parent`` (only the adapters learn), then merged into the
    weights (``merge_and_unload``): a full checkpoint whose change from its base has rank ``rank`` per matrix.

    With ``adapter_folder``, the adapter alone is saved there first, as PEFT's ``save_pretrained`` writes an
    adapter-only upload, naming ``base_id`` as its base (what ``from_pretrained("org/name")`` would have recorded)."""
    peft_model = get_peft_model(copy.deepcopy(parent),
                                LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0,
                                           target_modules=list(LORA_TARGETS)))
    trainable = [p for p in peft_model.parameters() if p.requires_grad]
    log = train_lm(peft_model, language, spec, trainable)
    if adapter_folder is not None:
        peft_model.save_pretrained(adapter_folder)
        config_file = adapter_folder / "adapter_config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "base_model_name_or_path": base_id}))
    with single_thread():
        merged = peft_model.merge_and_unload()
    return merged.float().eval(), log


def model_reference(model_id: str) -> str:
    """How a merge config names a model of the hub when mergekit runs from the hub's root: a relative local path
    (a bare ``org/name`` would be looked up on the Hub, which an offline run cannot reach)."""
    return f"./{model_id}"


def mergekit_merge(root: Path, model_id: str, config: Mapping[str, Any], seed: int) -> LlamaForCausalLM:
    """Run mergekit on ``config`` (its YAML form, models named by ``model_reference``) from the hub root ``root``,
    writing ``root/model_id`` (weights, config, mergekit's README.md and mergekit_config.yml), and load the result.

    ``seed`` fixes the random drops of DARE methods. Offline by construction: every model is a local folder, named so
    that mergekit never asks the Hub about it."""
    text = yaml.safe_dump(dict(config), sort_keys=False)
    out = root / model_id
    options = MergeOptions(copy_tokenizer=False, random_seed=seed, write_model_card=True, quiet=True)
    # mergekit keeps one loader per model reference for the life of the process: "./org/name" of an earlier hub
    # would be read again from that hub's folder, so it is emptied before each merge.
    LoaderCache().loaders.clear()
    with contextlib.chdir(root), single_thread():
        run_merge(MergeConfiguration.model_validate(yaml.safe_load(text)), out_path=str(out), options=options,
                  config_source=text)
    return load_model(out)


def slices(*sources: tuple[str, int, int]) -> list[dict[str, Any]]:
    """A passthrough config's slices: one per (model id, first block, end block), stacked in order."""
    return [{"sources": [{"model": model_reference(m), "layer_range": [start, end]}]} for m, start, end in sources]


def weighted(models: Sequence[str], **parameters: Sequence[float]) -> list[dict[str, Any]]:
    """A config's ``models`` list: each model with its own value of every parameter given (weight, density...)."""
    return [{"model": model_reference(m), **({"parameters": {k: v[i] for k, v in parameters.items()}}
                                             if parameters else {})} for i, m in enumerate(models)]
