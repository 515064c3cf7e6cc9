"""A deeper parent and its depth-and-width prune, for measuring `localize` where the residual stream drifts.

The demo zoo's models have 4 blocks, too shallow for a prune to move the stream much. This builds an 8-block
zoo Llama trained on a synthetic language, then a child that drops blocks 2, 4 and 6 and a quarter of every
kept block's MLP units (a scattered subset), healed briefly on the same language: the shape of the issue's
SmolLM2 prune (10 of 30 blocks, a quarter of the units) at zoo scale. Built once, cached by its spec (the
folder is written under a temporary name and renamed, so concurrent builders never see half a model).
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


def _build(folder: Path, spec: DeepPruneSpec) -> None:
    arch = ArchSpec(num_layers=spec.layers)
    language = MarkovLanguage(spec.seed, vocab_size=arch.vocab_size)
    parent = new_model(arch, seed=spec.seed)
    train_lm(parent, language, TrainSpec(spec.base_steps, spec.base_lr, data_seed=spec.seed))
    units = scattered_units(arch.intermediate_size, spec.keep_units, len(spec.kept_blocks),
                            torch.Generator().manual_seed(spec.seed))
    child = prune_width(prune_depth(parent, spec.kept_blocks), units)
    train_lm(child, language, TrainSpec(spec.heal_steps, spec.heal_lr, data_seed=spec.seed + 1))
    save_model(parent, folder / "parent")
    save_model(child, folder / "child")
    (folder / "details.json").write_text(json.dumps({"spec": asdict(spec), "kept_blocks": spec.kept_blocks,
                                                     "kept_units": units}))
