"""A hub as people publish what they made with PEFT and mergekit, with no model cards: a base, fine-tunes, a LoRA
uploaded twice (PEFT's adapter-only folder, and the same LoRA merged into its base), SLERP, TIES and linear merges
and a passthrough frankenmerge that stacks blocks of a fine-tune and then of the base (a deeper model whose blocks past
the first few match the base's only out of line, so that the base is not among the four nearest relatives it is
block-mapped onto), each merge folder keeping the ``mergekit_config.yml`` mergekit wrote, and a fine-tune of the
SLERP merge.

It is the shape of hub that ended a scan in a traceback (issue 47: a frankenmerge declaring a parent whose distance
the tree's table lacked), made small: tiny Llama models, seconds of training each. Every folder's README.md is removed
(mergekit writes one that names no base), so what a scan can read of the lineage is the weights, the merge configs
and the adapter's ``adapter_config.json``.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scanner.zoo.arch import ArchSpec
from scanner.zoo.build import Zoo, ZooBuilder, build_recipe, derived_seed
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.tools import lora_finetune, mergekit_merge, model_reference, slices, weighted

BASE, FT, FT_2, ADAPTER, LORA = "smol/base", "smol/ft", "smol/ft-2", "smol/lora-adapter", "smol/lora"
SLERP, TIES, LINEAR, FRANKEN, SLERP_FT = "smol/slerp", "smol/ties", "smol/linear", "smol/franken", "smol/slerp-ft"


@dataclass(frozen=True)
class ToolHubSpec:
    """Knobs of the tool hub; the seed draws the fine-tunes' step counts and the merges' parameters."""

    seed: int = 0
    arch: ArchSpec = field(default_factory=ArchSpec)
    batch_size: int = 8
    base_steps: int = 150
    base_lr: float = 5e-3
    lora_rank: int = 8

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_tool_hub(root: Path, *, spec: ToolHubSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the tool hub of ``spec.seed`` under ``root`` (about a CPU-minute)."""
    spec = spec or ToolHubSpec()
    return build_recipe(root, "tool-hub", spec, force, lambda b: _recipe(b, spec))


def _recipe(b: ZooBuilder, spec: ToolHubSpec) -> None:
    draw = random.Random(derived_seed(spec.seed, "recipe"))
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(5)]
    silent = {"policy": "silent", "license_id": "apache-2.0"}
    b.base(BASE, lang[0], spec.arch, spec.base_steps, spec.base_lr)  # its card (removed below) claims scratch
    b.finetune(FT, BASE, lang[1], draw.choice((60, 100)), 1e-3, "adam", **silent)
    b.finetune(FT_2, BASE, lang[2], draw.choice((60, 100)), 1e-3, "adam", **silent)
    lora_spec = b.train_spec(LORA, draw.choice((100, 150)), 5e-3)
    merged, log = lora_finetune(b.models[BASE], lang[3], lora_spec, spec.lora_rank, b.root / ADAPTER, BASE)
    details = {"tool": "peft", "lora_rank": spec.lora_rank, "training": log.to_json()}
    b.keep_written(ADAPTER, merged, parents=(BASE,), relation="finetune", language=lang[3],
                   details={**details, "upload": "adapter only"})
    b.add(LORA, merged, parents=(BASE,), relation="finetune", language=lang[3], details=details, **silent)
    layers = spec.arch.num_layers
    merges: list[tuple[str, tuple[str, ...], dict[str, Any], str]] = [
        (SLERP, (FT, FT_2), {"merge_method": "slerp", "base_model": model_reference(FT),
                             "slices": [{"sources": [{"model": model_reference(m), "layer_range": [0, layers]}
                                                     for m in (FT, FT_2)]}],
                             "parameters": {"t": draw.choice((0.3, 0.5, 0.7))}}, "merge"),
        (TIES, (FT, FT_2, BASE), {"merge_method": "ties", "base_model": model_reference(BASE),
                                  "models": weighted((FT, FT_2), weight=(0.5, 0.5), density=(0.6, 0.6)),
                                  "parameters": {"normalize": True}}, "merge"),
        (LINEAR, (FT, LORA), {"merge_method": "linear", "models": weighted((FT, LORA), weight=(0.5, 0.5))}, "merge"),
        (FRANKEN, (FT, BASE), {"merge_method": "passthrough",
                               "slices": slices((FT, 0, layers // 2), (BASE, 1, layers))}, "frankenmerge"),
    ]
    for model_id, parents, config, relation in merges:
        model = mergekit_merge(b.root, model_id, {**config, "dtype": "float32"}, derived_seed(spec.seed, model_id))
        b.keep_written(model_id, model, parents=parents, relation=relation, language=b.languages[parents[0]],
                       details={"tool": "mergekit", "method": config["merge_method"]})
    b.finetune(SLERP_FT, SLERP, lang[4], draw.choice((40, 60)), 1e-3, "adam", **silent)
    for model_id in b.records:  # no cards: what a scan reads of the lineage is the weights and the tools' configs
        (b.root / model_id / "README.md").unlink(missing_ok=True)
