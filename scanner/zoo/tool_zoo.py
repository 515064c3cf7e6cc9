"""Merge zoos: a hub of merges made with mergekit and LoRA fine-tunes made with PEFT, the way people make them.

Every merge method in common use, on fine-tunes of one base, no two merges of the same parents: linear (two and
three parents), SLERP, TIES, DARE (linear and TIES), task arithmetic, model stock (three parents), a merge of a model
with its own child, a passthrough frankenmerge (blocks of two siblings stacked) and a passthrough depth up-scaling
(one model's blocks stacked twice, then healed by training, as SOLAR-10.7B was made), a fine-tune of a TIES merge, a
LoRA fine-tune merged into its base, near and far fine-tunes and a chain; a second family (a base, two fine-tunes
and their SLERP merge) and an independent twin base trained on the first base's data. mergekit writes each merge's own
card (which names no base: its models are local paths) and ``mergekit_config.yml``. Weights, steps, densities and merge
parameters are drawn from the seed, so each seed is a different hub.

Ground truth: a merge's parents are every model whose weights enter it, the base of a task-vector method (TIES,
DARE, task arithmetic, model stock) included, as the Hub's model tree lists them.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scanner.zoo.arch import ArchSpec, save_model
from scanner.zoo.build import Zoo, ZooBuilder, build_recipe, derived_seed
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.tools import lora_finetune, mergekit_merge, model_reference, slices, weighted
from scanner.zoo.training import train_lm

FITTED_SEEDS = (21, 22)
"""Merge zoos the lineage's merge, stacking and direction rules were developed on (fitted)."""
HELD_OUT_SEEDS = tuple(range(23, 46))
"""Merge zoos looked at once the rules were set (held-out): 25-27 were final until two wrong arrows in 26 and 27 led
to the tree's order test (lineage_graph.phylogeny._swappable), 28-33 until their four wrong arrows led to the
weight-value evidence (lineage_graph.value_sources), 34-39 until the wrong arrow of 39's task-arithmetic merge led to
leaving links among entangled models undecided, 40-45 until a wrong arrow in their group's recipe zoo 27 led to the
weight values' veto on merges the distances alone suggest."""
FINAL_SEEDS = (46, 47, 48, 49, 50, 51)
"""Merge zoos built after every rule was frozen, only measured (final)."""


@dataclass(frozen=True)
class MergeZooSpec:
    """Knobs of a merge zoo; the seed also draws the recipe's variations (see the module docstring)."""

    seed: int = FITTED_SEEDS[0]
    arch: ArchSpec = field(default_factory=ArchSpec)
    batch_size: int = 8
    base_steps: int = 150
    base_lr: float = 5e-3
    heal_steps: int = 40
    lora_rank: int = 8
    step_scale: float = 1.0
    """Every training run's step count (drawn or fixed) times this: the test suite's cached merge zoo trains half as
    long as the benchmark's."""
    version: int = 2
    """The recipe's version: part of the cache key, so a changed recipe is rebuilt."""

    def to_json(self) -> dict[str, Any]:
        """The spec as its cache key hashes it (step_scale only when not 1: zoos built before it existed keep their
        key)."""
        out = asdict(self)
        if self.step_scale == 1.0:
            del out["step_scale"]
        return out


def build_merge_zoo(root: Path, *, spec: MergeZooSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the merge zoo of ``spec.seed`` under ``root`` (a few CPU-minutes)."""
    spec = spec or MergeZooSpec()
    return build_recipe(root, "merges", spec, force, lambda b: _merge_recipe(b, spec))


def _merge_recipe(b: ZooBuilder, spec: MergeZooSpec) -> None:
    draw = _Scaled(derived_seed(spec.seed, "recipe"), spec.step_scale)
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(13)]
    arch, layers = spec.arch, spec.arch.num_layers
    honest = {"policy": "honest", "license_id": "apache-2.0"}

    base, ft_a, ft_b, ft_c, ft_d, ft_e = "ash/base", "ash/ft-a", "ash/ft-b", "ash/ft-c", "ash/ft-d", "ash/ft-e"
    near, ft_a2, lora = "ash/ft-near", "ash/ft-a-2", "birch/lora"
    b.base(base, lang[0], arch, draw.steps(spec.base_steps), spec.base_lr)
    b.finetune(ft_a, base, lang[1], draw.choice((60, 100)), draw.choice((1e-3, 2e-3)), "adam", **honest)
    b.finetune(ft_b, base, lang[2], draw.choice((60, 100, 150)), 1e-3, "adam", **honest)
    b.finetune(ft_c, base, lang[3], draw.choice((200, 300)), 2e-3, "adam", **honest)
    b.finetune(ft_d, base, lang[11], draw.choice((60, 100)), 1e-3, "adam", **honest)
    b.finetune(ft_e, base, lang[12], draw.choice((80, 120)), 0.05, "sgd", **honest)
    b.finetune(near, base, lang[4], draw.choice((15, 25)), 5e-4, "adam", **honest)
    b.finetune(ft_a2, ft_a, lang[5], draw.choice((50, 80)), 1e-3, "adam", **honest)
    lora_spec = b.train_spec(lora, draw.choice((100, 150)), 5e-3)
    model, log = lora_finetune(b.models[base], lang[6], lora_spec, spec.lora_rank)
    b.add(lora, model, parents=(base,), relation="finetune", language=lang[6],
          details={"tool": "peft", "lora_rank": spec.lora_rank, "training": log.to_json()}, **honest)

    w = draw.choice((0.3, 0.5, 0.7))
    density = draw.choice((0.5, 0.6, 0.7))
    # Each merge has parents of its own (pairs never repeat), so no merge is a near copy of another.
    merges: list[tuple[str, tuple[str, ...], dict[str, Any]]] = [
        ("cedar/linear", (ft_a, ft_b),
         {"merge_method": "linear", "models": weighted((ft_a, ft_b), weight=(w, 1 - w))}),
        ("cedar/slerp", (ft_c, ft_d), _slerp(ft_c, ft_d, draw.choice((0.3, 0.5, 0.7)), layers)),
        ("cedar/ties", (ft_a, ft_c, base),
         {"merge_method": "ties", "base_model": model_reference(base),
          "models": weighted((ft_a, ft_c), weight=(0.5, 0.5), density=(density, density)),
          "parameters": {"normalize": True}}),
        ("cedar/dare-ties", (ft_b, lora, base),
         {"merge_method": "dare_ties", "base_model": model_reference(base),
          "models": weighted((ft_b, lora), weight=(0.5, 0.5), density=(density, density))}),
        ("cedar/dare-linear", (ft_a, ft_d, base),
         {"merge_method": "dare_linear", "base_model": model_reference(base),
          "models": weighted((ft_a, ft_d), weight=(0.5, 0.5), density=(density, density))}),
        ("cedar/task-arithmetic", (ft_b, ft_c, base),
         {"merge_method": "task_arithmetic", "base_model": model_reference(base),
          "models": weighted((ft_b, ft_c), weight=(draw.choice((0.5, 0.7, 1.0)), draw.choice((0.5, 0.7, 1.0))))}),
        ("cedar/model-stock", (ft_c, ft_e, lora, base),
         {"merge_method": "model_stock", "base_model": model_reference(base), "models": weighted((ft_c, ft_e, lora))}),
        ("cedar/linear-3", (ft_b, ft_d, ft_e),
         {"merge_method": "linear", "models": weighted((ft_b, ft_d, ft_e), weight=(1.0, 1.0, 1.0))}),
        ("cedar/parent-child", (ft_a, ft_a2), _slerp(ft_a, ft_a2, 0.5, layers)),
    ]
    for model_id, parents, config in merges:
        _merge(b, model_id, parents, {**config, "dtype": "float32"}, spec.seed)

    cut = random.Random.choice(draw, (2, 3))  # a block count, not scaled: ft-a's first `cut` blocks, then ft-b's
    # from its second on: a deeper model
    _merge(b, "dogwood/franken", (ft_a, ft_b),
           {"merge_method": "passthrough", "slices": slices((ft_a, 0, cut), (ft_b, 1, layers)),
            "dtype": "float32"}, spec.seed, relation="frankenmerge")
    upscale = "dogwood/upscale"
    _merge(b, upscale, (ft_c,), {"merge_method": "passthrough",
                                 "slices": slices((ft_c, 0, layers - 1), (ft_c, 1, layers)), "dtype": "float32"},
           spec.seed, relation="upscale_depth")
    heal = train_lm(b.models[upscale], b.languages[ft_c], b.train_spec(upscale, draw.steps(spec.heal_steps), 1e-3))
    save_model(b.models[upscale], b.root / upscale)  # healed in place; mergekit's card and config stay
    b.records[upscale].details["healing"] = heal.to_json()
    b.finetune("elm/ties-ft", "cedar/ties", lang[7], draw.choice((40, 60)), 1e-3, "adam", **honest)

    other, fa, fb = "fir/base", "fir/ft-a", "fir/ft-b"
    b.base(other, lang[8], arch, draw.steps(spec.base_steps), spec.base_lr)
    b.finetune(fa, other, lang[9], draw.choice((60, 100)), 1e-3, "adam", **honest)
    b.finetune(fb, other, lang[10], draw.choice((60, 100)), 1e-3, "adam", **honest)
    _merge(b, "fir/slerp", (fa, fb), {**_slerp(fa, fb, draw.choice((0.3, 0.5, 0.7)), layers), "dtype": "float32"},
           spec.seed)
    b.base("gorse/twin-base", lang[0], arch, draw.steps(spec.base_steps), spec.base_lr, twin_of=base)


class _Scaled(random.Random):
    """The recipe's draws, with every step count scaled (at least one step): ``choice`` of a tuple of ints is a step
    count in this recipe; learning rates and weights are floats and come back as drawn."""

    def __init__(self, seed: int, scale: float) -> None:
        super().__init__(seed)
        self.scale = scale

    def steps(self, n: int) -> int:
        return max(1, round(n * self.scale))

    def choice(self, seq):  # type: ignore[override]
        picked = super().choice(seq)
        return self.steps(picked) if isinstance(picked, int) else picked


def _slerp(first: str, second: str, t: float, layers: int) -> dict[str, Any]:
    """A SLERP config as mergekit's examples write it: the two models' blocks side by side, the first the base."""
    return {"merge_method": "slerp", "base_model": model_reference(first),
            "slices": [{"sources": [{"model": model_reference(m), "layer_range": [0, layers]}
                                    for m in (first, second)]}],
            "parameters": {"t": t}}


def _merge(b: ZooBuilder, model_id: str, parents: tuple[str, ...], config: dict[str, Any], seed: int,
           relation: str = "merge") -> None:
    model = mergekit_merge(b.root, model_id, config, derived_seed(seed, f"{model_id}/merge"))
    b.keep_written(model_id, model, parents=parents, relation=relation, language=b.languages[parents[0]],
                   details={"tool": "mergekit", "method": config["merge_method"]})
