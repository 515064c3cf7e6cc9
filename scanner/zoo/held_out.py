"""Held-out zoos: derivation recipes and seeds that no threshold or reliability of the lineage is fitted on.

The default zoo, its small seeds 1-3 and the fine-tune chain are where hubtrace's direction rules and their
reliabilities were set; a tree measured there says how well the rules fit, not how well they work. This recipe
draws, per seed, what an investigator meets on a hub and the fitted zoos lack or hold only once: chains of 3-5
further fine-tunes, siblings fine-tuned from one parent for different lengths, learning rates and optimizers, a
retrained MLP of a fine-tune, prunes of fine-tunes, a fine-tune trained further on its own data (a later checkpoint
of the same run, published as a model of its own), a depth up-scaling, merges of two siblings and of a parent with
its own child, and a distilled student (a behavioural copy with weights of its own: a family of its own). A second
family (base, two fine-tunes, a prune of one) keeps families apart. Step counts, learning rates, merge weights and
the retrained block are drawn from the seed, so each seed is a different hub, not the same one re-trained.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from scanner.zoo.arch import ArchSpec
from scanner.zoo.build import Zoo, ZooBuilder, ZooSpec, build_recipe, derived_seed
from scanner.zoo.languages import MarkovLanguage

FITTED_SEEDS = (11, 12, 13)
"""Seeds the default direction level was chosen on, and the merge, stacking and direction rules of issue 36 were
developed on: fitted now (bench/bench_family_trees.py)."""
HELD_OUT_SEEDS = tuple(range(14, 29))
"""Seeds no lineage rule was fitted on, looked at once those rules were set: 14-16 (the final seeds before issue 36),
17-19 (final until the tree's order test, phylogeny._swappable, was made after their merge zoos' two wrong arrows
were seen), 20-22 (final until the weight-value evidence, lineage_graph.value_sources, was made after the wrong
arrows of their merge zoos were seen), 23-25 (final until a task-arithmetic merge's wrong arrow in their merge zoos
led to undecided links among entangled models) and 26-28 (final until seed 27's wrong arrow, a fine-tune trained
further on its parent's data that version 1's prune had left unpruned, led to the weight values ruling out merges
the distances alone suggest, ValueSources.rules_out_merge; their version-2 zoos are new, their other zoos were
seen)."""
FINAL_SEEDS = (29, 30, 31)
"""Seeds built after every rule and level was frozen, only measured."""


@dataclass(frozen=True)
class HeldOutSpec:
    """Knobs of a held-out zoo; the seed also draws the recipe's variations (see the module docstring)."""

    seed: int = FITTED_SEEDS[0]
    arch: ArchSpec = field(default_factory=ArchSpec)
    batch_size: int = 8
    base_steps: int = 150
    base_lr: float = 5e-3
    heal_steps: int = 40
    retrain_steps: int = 1500
    retrain_batch_size: int = 256
    distill_steps: int = 300
    version: int = 2
    """The recipe's version: part of the cache key, so a changed recipe is rebuilt. Version 1 drew the depth prune's
    removed block anew for every block, so a seed's "prune" removed none to three of them; version 2 removes one and
    adds the continued fine-tune."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_held_out_zoo(root: Path, *, spec: HeldOutSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the held-out zoo of ``spec.seed`` under ``root`` (a few CPU-minutes)."""
    spec = spec or HeldOutSpec()
    return build_recipe(root, "held-out", spec, force, lambda b: _held_out_recipe(b, spec))


def _held_out_recipe(b: ZooBuilder, spec: HeldOutSpec) -> None:
    draw = random.Random(derived_seed(spec.seed, "recipe"))
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(12)]
    arch, layers = spec.arch, spec.arch.num_layers
    honest = {"policy": "honest", "license_id": "apache-2.0"}

    base = "alder/base"
    b.base(base, lang[0], arch, spec.base_steps, spec.base_lr)
    chain = [base]
    for k in range(1, 3 + spec.seed % 3 + 1):  # 3, 4 or 5 further fine-tunes
        chain.append(f"alder/chain-{k}")
        b.finetune(chain[-1], chain[-2], lang[k], draw.choice((50, 80, 120)), draw.choice((5e-4, 1e-3, 2e-3)),
                   "adam", **honest)
    short, long, sgd = "birch/sibling-short", "birch/sibling-long", "birch/sibling-sgd"
    b.finetune(short, base, lang[6], draw.choice((20, 30, 40)), 1e-3, "adam", **honest)
    b.finetune(long, base, lang[7], draw.choice((250, 300, 400)), draw.choice((2e-3, 3e-3)), "adam", **honest)
    b.finetune(sgd, base, lang[8], draw.choice((80, 120)), 0.05, "sgd", **honest)
    weight = draw.choice((0.3, 0.5, 0.7))
    b.merge("cedar/siblings-merge", [short, long], [weight, 1 - weight], **honest)
    b.merge("cedar/parent-child-merge", [base, chain[1]], [0.5, 0.5], **honest)
    removed = draw.randrange(1, layers)
    b.prune_depth("dogwood/chain-1-lite", chain[1], [i for i in range(layers) if i != removed], spec.heal_steps, 1e-3,
                  **honest)
    b.finetune("dogwood/chain-1-continued", chain[1], lang[1], draw.choice((20, 40, 60)), 1e-3, "adam", **honest)
    b.prune_width("dogwood/sibling-slim", long, arch.intermediate_size * 3 // 4, spec.heal_steps, 1e-3, **honest)
    retrain = ZooSpec(seed=spec.seed, retrain_blocks=(draw.randrange(layers),), retrain_steps=spec.retrain_steps,
                      retrain_batch_size=spec.retrain_batch_size)
    b.retrain_mlps("elm/chain-2-remix", chain[2], retrain, **honest)
    b.upscale_depth("fir/base-up", base, [*range(layers - 1), *range(1, layers)], spec.heal_steps, 1e-3, **honest)
    b.distill("ginkgo/student", base, spec.distill_steps, spec.base_lr, **honest)

    other = "hazel/base"
    b.base(other, lang[9], arch, spec.base_steps, spec.base_lr)
    b.finetune("hazel/ft-a", other, lang[10], draw.choice((60, 100)), 1e-3, "adam", **honest)
    b.finetune("hazel/ft-b", other, lang[11], draw.choice((60, 100)), 1e-3, "adam", **honest)
    b.prune_width("hazel/ft-a-slim", "hazel/ft-a", arch.intermediate_size // 2, spec.heal_steps, 1e-3, **honest)
