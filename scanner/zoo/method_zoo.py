"""Method zoos: merges of every method mergekit 0.1.5 ships beyond the merge zoo's (scanner.zoo.tool_zoo), and the
recipes people publish around them, for measuring family trees on recipes no lineage rule was written for.

One family of a base and five fine-tunes (one with SGD, one a LoRA made with PEFT and merged), merged with DELLA,
DELLA-linear, breadcrumbs, breadcrumbs-TIES, SCE, NuSLERP (with and without a base), Karcher means (two and three
models), multi-SLERP (with and without a base), Arcee Fusion, NearSwap, RAM and RAM+ (tensor-local), with 2 and 3
sources; a merge of two merges; a fine-tune and a LoRA trained after merging; three checkpoints of one training run;
a block expansion (new identity blocks trained alone, as LLaMA Pro was made), a prune of the block whose output is
most like its input (angular distance), a width prune healed by distillation from its parent; and a second family
(a base, two fine-tunes and their NuSLERP merge). Weights, densities, steps and the merged pairs' parameters are
drawn from the seed. mergekit's card and ``mergekit_config.yml`` are kept beside each merge, as it writes them.

Ground truth, as the merge zoo's: a merge's parents are every model whose weights enter it, its base included.
Each model's ``details["recipe"]`` names the recipe family it belongs to for held-out-recipe measurements.
"""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from scanner.zoo.arch import ArchSpec
from scanner.zoo.build import Zoo, ZooBuilder, build_recipe, derived_seed
from scanner.zoo.derivations import prune_depth, prune_width, scattered_units
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.surgery import angular_distances, expand_blocks
from scanner.zoo.tools import lora_finetune, mergekit_merge, model_reference, weighted
from scanner.zoo.training import train_lm

SEEDS = (61, 62, 63, 64, 65, 66)
"""Method zoos built after the rules of issue 47 were written, only measured."""


@dataclass(frozen=True)
class MethodZooSpec:
    """Knobs of a method zoo; the seed draws the recipe's variations (see the module docstring)."""

    seed: int = SEEDS[0]
    arch: ArchSpec = field(default_factory=ArchSpec)
    batch_size: int = 8
    base_steps: int = 150
    base_lr: float = 5e-3
    lora_rank: int = 8

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_method_zoo(root: Path, *, spec: MethodZooSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the method zoo of ``spec.seed`` under ``root`` (several CPU-minutes)."""
    spec = spec or MethodZooSpec()
    return build_recipe(root, "methods", spec, force, lambda b: _recipe(b, spec))


def _recipe(b: ZooBuilder, spec: MethodZooSpec) -> None:
    draw = random.Random(derived_seed(spec.seed, "recipe"))
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(14)]
    honest = {"policy": "honest", "license_id": "apache-2.0"}
    base, a, bb, c, d, lora = "oak/base", "oak/ft-a", "oak/ft-b", "oak/ft-c", "oak/ft-d", "oak/lora"
    b.base(base, lang[0], spec.arch, spec.base_steps, spec.base_lr)
    b.finetune(a, base, lang[1], draw.choice((60, 100)), draw.choice((1e-3, 2e-3)), "adam", **honest)
    b.finetune(bb, base, lang[2], draw.choice((60, 100, 150)), 1e-3, "adam", **honest)
    b.finetune(c, base, lang[3], draw.choice((150, 250)), 2e-3, "adam", **honest)
    b.finetune(d, base, lang[4], draw.choice((80, 120)), 0.05, "sgd", **honest)
    model, log = lora_finetune(b.models[base], lang[5], b.train_spec(lora, draw.choice((100, 150)), 5e-3),
                               spec.lora_rank)
    b.add(lora, model, parents=(base,), relation="finetune", language=lang[5],
          details={"tool": "peft", "lora_rank": spec.lora_rank, "training": log.to_json()}, **honest)

    density = draw.choice((0.5, 0.6, 0.7))
    t = draw.choice((0.3, 0.5, 0.7))
    on_base = {"base_model": model_reference(base)}
    merges: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
        ("pine/della", (a, bb, base), {"merge_method": "della", **on_base, "models": weighted(
            (a, bb), weight=(0.5, 0.5), density=(density, density), epsilon=(0.1, 0.1))}),
        ("pine/della-linear-3", (bb, c, lora, base), {"merge_method": "della_linear", **on_base, "models": weighted(
            (bb, c, lora), weight=(0.4, 0.3, 0.3), density=(density,) * 3, epsilon=(0.1,) * 3)}),
        ("pine/breadcrumbs", (a, c, base), {"merge_method": "breadcrumbs", **on_base, "models": weighted(
            (a, c), weight=(0.5, 0.5), density=(0.9, 0.9), gamma=(0.01, 0.01))}),
        ("pine/breadcrumbs-ties-3", (a, bb, d, base), {"merge_method": "breadcrumbs_ties", **on_base,
                                                       "models": weighted((a, bb, d), weight=(1.0, 1.0, 1.0),
                                                                          density=(0.9,) * 3, gamma=(0.01,) * 3)}),
        ("pine/sce-3", (a, bb, c, base), {"merge_method": "sce", **on_base, "models": weighted((a, bb, c)),
                                          "parameters": {"select_topk": draw.choice((0.5, 1.0))}}),
        ("pine/nuslerp", (bb, d), {"merge_method": "nuslerp", "models": weighted((bb, d), weight=(1 - t, t))}),
        ("pine/nuslerp-base", (c, lora, base), {"merge_method": "nuslerp", **on_base,
                                                "models": weighted((c, lora), weight=(1 - t, t))}),
        ("pine/karcher", (a, c), {"merge_method": "karcher", "models": weighted((a, c))}),
        ("pine/karcher-3", (bb, c, d), {"merge_method": "karcher", "models": weighted((bb, c, d))}),
        ("pine/multislerp-3", (a, bb, c), {"merge_method": "multislerp", "models": weighted(
            (a, bb, c), weight=(1.0, 1.0, 1.0))}),
        ("pine/multislerp-base", (d, lora, base), {"merge_method": "multislerp", **on_base, "models": weighted(
            (d, lora), weight=(0.5, 0.5))}),
        ("pine/arcee-fusion", (bb, base), {"merge_method": "arcee_fusion", **on_base, "models": weighted((bb,))}),
        ("pine/nearswap", (c, base), {"merge_method": "nearswap", **on_base, "models": weighted((c,)),
                                      "parameters": {"t": draw.choice((0.0005, 0.001, 0.002))}}),
        ("pine/ram", (a, d, base), {"merge_method": "ram", **on_base, "models": weighted((a, d))}),
        ("pine/ramplus-3", (bb, c, lora, base), {"merge_method": "ramplus_tl", **on_base,
                                                 "models": weighted((bb, c, lora))}),
    ]
    for model_id, parents, config in merges:
        _merge(b, model_id, parents, config, spec.seed, f"merge: {config['merge_method']}")
    _merge(b, "pine/merge-of-merges", ("pine/karcher", "pine/nuslerp"),
           {"merge_method": "linear", "models": weighted(("pine/karcher", "pine/nuslerp"), weight=(0.5, 0.5))},
           spec.seed, "merge of merges")
    b.finetune("elm/della-ft", "pine/della", lang[6], draw.choice((40, 60)), 1e-3, "adam", **honest)
    b.records["elm/della-ft"].details["recipe"] = "fine-tune of a merge"
    model, log = lora_finetune(b.models["pine/multislerp-3"], lang[7],
                               b.train_spec("elm/multislerp-lora", draw.choice((60, 100)), 5e-3), spec.lora_rank)
    b.add("elm/multislerp-lora", model, parents=("pine/multislerp-3",), relation="finetune", language=lang[7],
          details={"tool": "peft", "recipe": "LoRA of a merge", "training": log.to_json()}, **honest)
    _checkpoints(b, draw, base, lang[8])
    _surgery(b, draw, spec, a, bb, c)

    other, fa, fb = "yew/base", "yew/ft-a", "yew/ft-b"
    b.base(other, lang[11], spec.arch, spec.base_steps, spec.base_lr)
    b.finetune(fa, other, lang[12], draw.choice((60, 100)), 1e-3, "adam", **honest)
    b.finetune(fb, other, lang[13], draw.choice((60, 100)), 1e-3, "adam", **honest)
    _merge(b, "yew/nuslerp", (fa, fb), {"merge_method": "nuslerp", "models": weighted((fa, fb), weight=(0.5, 0.5))},
           spec.seed, "merge: nuslerp")


def _checkpoints(b: ZooBuilder, draw: random.Random, base: str, language: MarkovLanguage) -> None:
    """Three checkpoints of one fine-tuning run of ``base`` (one optimizer, saved at three steps), each published as a
    model: the second derives from the first, the third from the second."""
    every = draw.choice((30, 50))
    run = copy.deepcopy(b.models[base])
    saved = {}
    spec = b.train_spec("ash/checkpoints", 3 * every, 1e-3)
    log = train_lm(run, language, spec, after_step=lambda n: saved.__setitem__(n, copy.deepcopy(run).eval())
                   if n % every == 0 else None)
    previous = base
    for k in (1, 2, 3):
        model_id = f"ash/run-step{k * every}"
        b.add(model_id, saved[k * every], parents=(previous,), relation="finetune", policy="honest",
              license_id="apache-2.0", language=language,
              details={"recipe": "checkpoint of one run", "step": k * every, "training": log.to_json()})
        previous = model_id


def _surgery(b: ZooBuilder, draw: random.Random, spec: MethodZooSpec, a: str, bb: str, c: str) -> None:
    """A block expansion of ``a``, an angular-distance depth prune of ``bb`` healed by training, and a width prune of
    ``c`` healed by distillation from ``c``."""
    honest = {"policy": "honest", "license_id": "apache-2.0"}
    layers = spec.arch.num_layers
    expanded, inserted = expand_blocks(b.models[a], (layers // 2 - 1, layers - 1))
    trained = [p for j in inserted for p in expanded.model.layers[j].parameters()]
    log = train_lm(expanded, b.languages[a], b.train_spec("birch/expanded", draw.choice((60, 100)), 2e-3), trained)
    b.add("birch/expanded", expanded, parents=(a,), relation="upscale_depth", language=b.languages[a],
          details={"recipe": "block expansion", "inserted": inserted, "training": log.to_json()}, **honest)
    distances = angular_distances(b.models[bb], b.languages[bb])
    dropped = min(range(1, layers), key=lambda i: distances[i])  # the first block is never the most redundant one
    pruned = prune_depth(b.models[bb], [i for i in range(layers) if i != dropped])
    log = train_lm(pruned, b.languages[bb], b.train_spec("birch/angular-prune", 40, 1e-3))
    b.add("birch/angular-prune", pruned, parents=(bb,), relation="prune_depth", language=b.languages[bb],
          details={"recipe": "prune by angular distance", "dropped": dropped, "angular": distances,
                   "training": log.to_json()}, **honest)
    config = b.models[c].config
    units = scattered_units(config.intermediate_size, config.intermediate_size * 3 // 4, layers,
                            torch.Generator().manual_seed(derived_seed(spec.seed, "birch/slim")))
    slim = prune_width(b.models[c], units)
    log = train_lm(slim, b.languages[c], b.train_spec("birch/slim-distilled", 80, 1e-3), teacher=b.models[c])
    b.add("birch/slim-distilled", slim, parents=(c,), relation="prune_width", language=b.languages[c],
          details={"recipe": "width prune healed by distillation", "training": log.to_json()}, **honest)


def _merge(b: ZooBuilder, model_id: str, parents: tuple[str, ...], config: dict[str, Any], seed: int,
           recipe: str) -> None:
    model = mergekit_merge(b.root, model_id, {**config, "dtype": "float32"}, derived_seed(seed, f"{model_id}/merge"))
    b.keep_written(model_id, model, parents=parents, relation="merge", language=b.languages[parents[0]],
                   details={"tool": "mergekit", "method": config["merge_method"], "recipe": recipe,
                            "base": "base_model" in config})
