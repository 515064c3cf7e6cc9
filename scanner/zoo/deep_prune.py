"""Deeper parents and their depth-and-width prunes, for measuring `localize` where the residual stream drifts.

The demo zoo's models have 4 blocks, too shallow for a prune to move the stream much. Both builders make an
8-block Llama and a child that drops blocks 2, 4 and 6 and a quarter of every kept block's MLP units (a
scattered subset): the shape of the issue's SmolLM2 prune (10 of 30 blocks, a quarter of the units).

* `build_deep_prune`: a zoo Llama trained on a synthetic language, the child healed briefly on it. Built once,
  cached by its spec (written under a temporary name and renamed: concurrent builders never see half a model).
* `build_random_deep_prune`: untrained, with blocks that write strongly into the residual stream (weights of
  std 0.1 in a 32-wide model) and small noise for healing, so the stream entering a kept block drifts as far
  as in a real pruned model; no training, so tests can afford it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

from scanner.zoo.arch import ArchSpec, new_model, save_model
from scanner.zoo.derivations import prune_depth, prune_width, scattered_units
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import TrainSpec, train_lm


@dataclass(frozen=True)
class DeepPruneSpec:
    layers: int = 8
    dropped: tuple[int, ...] = (2, 4, 6)
    keep_units: int = 96  # of ArchSpec's 128
    base_steps: int = 300
    base_lr: float = 5e-3
    heal_steps: int = 80
    heal_lr: float = 1e-3
    seed: int = 11

    @property
    def kept_blocks(self) -> list[int]:
        return [layer for layer in range(self.layers) if layer not in self.dropped]


@dataclass(frozen=True)
class DeepPrune:
    parent: Path
    child: Path
    kept_blocks: list[int]
    kept_units: list[list[int]]


def build_deep_prune(cache: Path, spec: DeepPruneSpec = DeepPruneSpec()) -> DeepPrune:
    """The parent and its healed depth-and-width prune as Hugging Face folders under ``cache`` (built once)."""
    digest = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    root = cache / f"deep-prune-{digest}"
    if not (root / "details.json").is_file():
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".deep-prune-", dir=cache))
        try:
            _build(staging, spec)
            os.replace(staging, root)
        except OSError:
            if not (root / "details.json").is_file():
                raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    details = json.loads((root / "details.json").read_text())
    return DeepPrune(root / "parent", root / "child", details["kept_blocks"], details["kept_units"])


def build_random_deep_prune(folder: Path, *, seed: int = 0, other_seed: int = 5) -> DeepPrune:
    """An untrained 8-block parent (and an independent model of the same shape, ``folder/other``) and its prune."""
    spec = DeepPruneSpec(keep_units=48)
    parent = _random_deep(seed)
    units = scattered_units(
        parent.config.intermediate_size, spec.keep_units, len(spec.kept_blocks), torch.Generator().manual_seed(seed + 1)
    )
    child = prune_width(prune_depth(parent, spec.kept_blocks), units)
    with torch.no_grad():
        for parameter in child.parameters():
            parameter.add_(0.001 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(seed + 2)))
    for name, model in (("parent", parent), ("child", child), ("other", _random_deep(other_seed))):
        save_model(model, folder / name)
    return DeepPrune(folder / "parent", folder / "child", spec.kept_blocks, units)


def _random_deep(seed: int) -> LlamaForCausalLM:
    arch = ArchSpec(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=8)
    model = new_model(arch, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.fill_(1.0) if "norm" in name else parameter.copy_(0.1 * torch.randn(parameter.shape, generator=g))
    return model


def _build(folder: Path, spec: DeepPruneSpec) -> None:
    arch = ArchSpec(num_layers=spec.layers)
    language = MarkovLanguage(spec.seed, vocab_size=arch.vocab_size)
    parent = new_model(arch, seed=spec.seed)
    train_lm(parent, language, TrainSpec(spec.base_steps, spec.base_lr, data_seed=spec.seed))
    units = scattered_units(
        arch.intermediate_size, spec.keep_units, len(spec.kept_blocks), torch.Generator().manual_seed(spec.seed)
    )
    child = prune_width(prune_depth(parent, spec.kept_blocks), units)
    train_lm(child, language, TrainSpec(spec.heal_steps, spec.heal_lr, data_seed=spec.seed + 1))
    save_model(parent, folder / "parent")
    save_model(child, folder / "child")
    (folder / "details.json").write_text(
        json.dumps({"spec": asdict(spec), "kept_blocks": spec.kept_blocks, "kept_units": units})
    )
