"""Builds a small fake hub of tiny Llama models with known lineage, and its ground truth.

``build_zoo`` writes ``<root>/<org>/<name>/`` (config.json, model.safetensors, README.md) per model
and ``<root>/ground_truth.json``; a root already holding the same zoo version and spec is reused
without retraining. ``train_independent_models`` does the same for many unrelated bases, which a
validity study needs (n models give n(n-1)/2 independent pairs). Two models are dependent iff they
share a family, i.e. descend from the same independently initialised base.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Protocol

import torch
import transformers
from transformers import PreTrainedModel

from scanner.declared.cards import Card, read_card
from scanner.zoo.arch import ArchSpec, ModelKind, arch_of, new_model, save_model
from scanner.zoo.camouflage import camouflage
from scanner.zoo.cards import CardClass, classify_card, make_card, write_card
from scanner.zoo.derivations import (
    distill,
    finetune,
    merge,
    prune_depth,
    prune_width,
    retrain_mlps,
    scattered_units,
    upscale_depth,
)
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import Optimizer, TrainSpec, eval_loss, train_lm

ZOO_VERSION = 1
GROUND_TRUTH = "ground_truth.json"
RELATIONS = ("base", "finetune", "merge", "prune_depth", "prune_width", "retrained_mlp", "camouflage", "upscale_depth",
             "distilled", "frankenmerge")


@dataclass(frozen=True)
class ZooSpec:
    """Knobs of the default zoo; its hash decides whether a cached build can be reused."""

    seed: int = 0
    arch: ArchSpec = field(default_factory=ArchSpec)
    batch_size: int = 8
    base_steps: int = 250
    base_lr: float = 5e-3
    finetune_steps: int = 150
    finetune_lr: float = 1e-3
    sgd_lr: float = 0.05
    long_finetune_steps: int = 1000
    long_finetune_lr: float = 5e-3
    heal_steps: int = 80
    retrain_blocks: tuple[int, ...] = (1, 3)
    retrain_steps: int = 6000
    retrain_lr: float = 3e-3
    retrain_batch_size: int = 512

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class IndependentSpec:
    """Knobs of an independent-models zoo: model k, of ``kind``, trains on language k mod ``languages`` from its own
    init (one language: the same data and recipe for every model, only the seeds differ)."""

    n: int
    seed: int = 0
    arch: ArchSpec = field(default_factory=ArchSpec)
    steps: int = 150
    lr: float = 5e-3
    batch_size: int = 8
    languages: int = 3
    kind: ModelKind = "llama"

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.kind == "llama":  # the spec as it was before zoos had kinds, so a Llama zoo cached then is reused
            del out["kind"]
        return out


@dataclass(frozen=True)
class ChainSpec:
    """Knobs of a fine-tune chain: one base, then each model a further Adam fine-tune of the previous one on a
    language of its own (what family trees must draw as a path)."""

    length: int = 3
    seed: int = 0
    arch: ArchSpec = field(default_factory=ArchSpec)
    base_steps: int = 150
    base_lr: float = 5e-3
    finetune_steps: int = 80
    finetune_lr: float = 1e-3
    batch_size: int = 8

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ZooModel:
    """One model of the zoo and its true lineage next to what its card declares."""

    id: str
    path: Path
    family: str
    parents: tuple[str, ...]
    relation: str
    card: CardClass
    declared_base_model: tuple[str, ...]
    declared_relation: str | None
    license: str
    arch: ArchSpec
    details: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(path=self.id, parents=list(self.parents), declared_base_model=list(self.declared_base_model))
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], root: Path) -> ZooModel:
        return cls(
            id=data["id"],
            path=root / data["path"],
            family=data["family"],
            parents=tuple(data["parents"]),
            relation=data["relation"],
            card=data["card"],
            declared_base_model=tuple(data["declared_base_model"]),
            declared_relation=data["declared_relation"],
            license=data["license"],
            arch=ArchSpec(**data["arch"]),
            details=data["details"],
        )


@dataclass(frozen=True)
class Zoo:
    """A built zoo: models in build order (parents first) plus pair-level ground truth."""

    root: Path
    kind: str
    spec_hash: str
    build_seconds: float
    models: dict[str, ZooModel]

    @property
    def ids(self) -> list[str]:
        return list(self.models)

    def __getitem__(self, model_id: str) -> ZooModel:
        return self.models[model_id]

    def dependent(self, a: str, b: str) -> bool:
        """True lineage: same family (one descends from the other, or both from one base)."""
        return self.models[a].family == self.models[b].family

    def pairs(self, dependent: bool) -> list[tuple[str, str]]:
        """All unordered pairs of distinct models that are (or are not) dependent, in build order."""
        return [(a, b) for a, b in combinations(self.ids, 2) if self.dependent(a, b) == dependent]

    def with_relation(self, relation: str) -> list[ZooModel]:
        return [m for m in self.models.values() if m.relation == relation]

    def to_json(self, spec: dict[str, Any]) -> dict[str, Any]:
        return {
            "zoo_version": ZOO_VERSION,
            "kind": self.kind,
            "spec_hash": self.spec_hash,
            "spec": spec,
            "build_seconds": self.build_seconds,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "models": [m.to_json() for m in self.models.values()],
            "dependent_pairs": [list(p) for p in self.pairs(True)],
            "independent_pairs": [list(p) for p in self.pairs(False)],
        }

    @classmethod
    def load(cls, root: Path) -> Zoo:
        """Read ``<root>/ground_truth.json`` (model paths become absolute under ``root``)."""
        root = Path(root)
        data = json.loads((root / GROUND_TRUTH).read_text(encoding="utf-8"))
        models = [ZooModel.from_json(m, root) for m in data["models"]]
        return cls(root, data["kind"], data["spec_hash"], data["build_seconds"], {m.id: m for m in models})


def derived_seed(seed: int, name: str) -> int:
    """A stable 31-bit seed per (zoo seed, purpose), so adding a model never reshuffles the others."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def spec_hash(kind: str, spec: dict[str, Any]) -> str:
    payload = json.dumps({"zoo_version": ZOO_VERSION, "kind": kind, "spec": spec}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def relative_drift(parent: PreTrainedModel, child: PreTrainedModel) -> float:
    """||child - parent|| / ||parent|| over all parameters: how far a same-shape derivative moved."""
    p, c = parent.state_dict(), child.state_dict()
    diff = sum(float((c[k] - p[k]).double().pow(2).sum()) for k in p)
    return (diff / sum(float(v.double().pow(2).sum()) for v in p.values())) ** 0.5


class ZooBuilder:
    """Derives, saves, documents and records models one at a time; keeps them in memory as parents."""

    def __init__(self, root: Path, seed: int, batch_size: int) -> None:
        self.root, self.seed, self.batch_size = root, seed, batch_size
        self.models: dict[str, PreTrainedModel] = {}
        self.languages: dict[str, MarkovLanguage] = {}
        self.records: dict[str, ZooModel] = {}

    def train_spec(self, model_id: str, steps: int, lr: float, optimizer: Optimizer = "adam") -> TrainSpec:
        return TrainSpec(steps, lr, optimizer, self.batch_size, derived_seed(self.seed, f"{model_id}/data"))

    def add(
        self,
        model_id: str,
        model: PreTrainedModel,
        *,
        parents: Sequence[str],
        relation: str,
        policy: CardClass,
        license_id: str,
        language: MarkovLanguage,
        details: dict[str, Any],
        false_base: str | None = None,
    ) -> None:
        card = make_card(policy, parents, relation, license_id, false_base)
        if classify_card(card, parents) != policy:
            raise ValueError(f"{model_id}: card does not realise policy {policy!r}")
        path = self.root / model_id
        if path.exists():
            shutil.rmtree(path)
        save_model(model, path)
        write_card(path, model_id, card)
        self._keep(model_id, model, parents, relation, card, language, details)

    def keep_written(self, model_id: str, model: PreTrainedModel, *, parents: Sequence[str], relation: str,
                     language: MarkovLanguage, details: dict[str, Any]) -> None:
        """Record a model that a tool wrote under the root itself, with the tool's own card (mergekit's): ground
        truth gets the card's class as the tool left it."""
        self._keep(model_id, model, parents, relation, read_card(self.root / model_id), language, details)

    def _keep(self, model_id: str, model: PreTrainedModel, parents: Sequence[str], relation: str, card: Card,
              language: MarkovLanguage, details: dict[str, Any]) -> None:
        families = {self.records[p].family for p in parents}
        if len(families) > 1:
            raise ValueError(f"{model_id}: parents from different families {families}")
        self.models[model_id], self.languages[model_id] = model, language
        self.records[model_id] = ZooModel(
            id=model_id,
            path=self.root / model_id,
            family=families.pop() if families else model_id,
            parents=tuple(parents),
            relation=relation,
            card=classify_card(card, parents),
            declared_base_model=card.base_model,
            declared_relation=card.base_model_relation,
            license=card.license or "",
            arch=arch_of(model),
            details=details,
        )

    def base(
        self,
        model_id: str,
        language: MarkovLanguage,
        arch: ArchSpec,
        steps: int,
        lr: float,
        *,
        policy: CardClass = "honest",
        license_id: str = "apache-2.0",
        false_base: str | None = None,
        twin_of: str | None = None,
        kind: ModelKind = "llama",
        data_of: str | None = None,
    ) -> None:
        """An independently initialised model trained on ``language``, on the data order of ``data_of`` (a name
        whose draws other runs can share; by default the model's own)."""
        init_seed = derived_seed(self.seed, f"{model_id}/init")
        model = new_model(arch, init_seed, kind)
        log = train_lm(model, language, self.train_spec(data_of or model_id, steps, lr))
        details: dict[str, Any] = {"init_seed": init_seed, "training": log.to_json()}
        if twin_of is not None:
            details["twin_of"] = twin_of
        self.add(model_id, model, parents=(), relation="base", policy=policy, license_id=license_id,
                 language=language, details=details, false_base=false_base)

    def finetune(
        self, model_id: str, parent: str, language: MarkovLanguage, steps: int, lr: float, optimizer: Optimizer,
        *, policy: CardClass, license_id: str, hard_case: bool = False,
    ) -> None:
        child, log = finetune(self.models[parent], language, self.train_spec(model_id, steps, lr, optimizer))
        details = {"training": log.to_json(), "relative_drift": relative_drift(self.models[parent], child),
                   "hard_case": hard_case}
        self.add(model_id, child, parents=(parent,), relation="finetune", policy=policy, license_id=license_id,
                 language=language, details=details)

    def merge(self, model_id: str, parents: Sequence[str], weights: Sequence[float], *, policy: CardClass,
              license_id: str) -> None:
        child = merge([self.models[p] for p in parents], weights)
        self.add(model_id, child, parents=parents, relation="merge", policy=policy, license_id=license_id,
                 language=self.languages[parents[0]], details={"weights": list(weights)})

    def prune_depth(self, model_id: str, parent: str, kept_blocks: Sequence[int], heal_steps: int, lr: float,
                    *, policy: CardClass, license_id: str) -> None:
        child = prune_depth(self.models[parent], kept_blocks)
        language = self.languages[parent]
        log = train_lm(child, language, self.train_spec(model_id, heal_steps, lr))
        self.add(model_id, child, parents=(parent,), relation="prune_depth", policy=policy, license_id=license_id,
                 language=language, details={"kept_blocks": list(kept_blocks), "training": log.to_json()})

    def prune_width(self, model_id: str, parent: str, keep: int, heal_steps: int, lr: float,
                    *, policy: CardClass, license_id: str) -> None:
        config = self.models[parent].config
        units = scattered_units(config.intermediate_size, keep, config.num_hidden_layers,
                                torch.Generator().manual_seed(derived_seed(self.seed, f"{model_id}/units")))
        child = prune_width(self.models[parent], units)
        language = self.languages[parent]
        log = train_lm(child, language, self.train_spec(model_id, heal_steps, lr))
        self.add(model_id, child, parents=(parent,), relation="prune_width", policy=policy, license_id=license_id,
                 language=language, details={"kept_units": units, "training": log.to_json()})

    def retrain_mlps(self, model_id: str, parent: str, spec: ZooSpec, *, policy: CardClass,
                     license_id: str) -> None:
        source = self.models[parent]
        child, log = retrain_mlps(source, spec.retrain_blocks, spec.retrain_steps, spec.retrain_lr,
                                  spec.retrain_batch_size, derived_seed(self.seed, f"{model_id}/retrain"))
        language = self.languages[parent]
        details = {"retrain": log.to_json(), "eval_loss_parent": eval_loss(source, language),
                   "eval_loss": eval_loss(child, language), "eval_language_seed": language.seed}
        self.add(model_id, child, parents=(parent,), relation="retrained_mlp", policy=policy, license_id=license_id,
                 language=language, details=details)

    def upscale_depth(self, model_id: str, parent: str, blocks: Sequence[int], heal_steps: int, lr: float,
                      *, policy: CardClass, license_id: str) -> None:
        child = upscale_depth(self.models[parent], blocks)
        language = self.languages[parent]
        log = train_lm(child, language, self.train_spec(model_id, heal_steps, lr))
        self.add(model_id, child, parents=(parent,), relation="upscale_depth", policy=policy, license_id=license_id,
                 language=language, details={"blocks": list(blocks), "training": log.to_json()})

    def distill(self, model_id: str, teacher: str, steps: int, lr: float, *, policy: CardClass,
                license_id: str, kind: ModelKind = "llama", data_of: str | None = None) -> None:
        """A student with weights of its own: a base of a new family (no weight lineage), its teacher in details. It
        takes the teacher's shape, so ``kind`` must be the teacher's; ``data_of`` as for `base`."""
        init_seed = derived_seed(self.seed, f"{model_id}/init")
        language = self.languages[teacher]
        student, log = distill(self.models[teacher], arch_of(self.models[teacher]), init_seed, language,
                               self.train_spec(data_of or model_id, steps, lr), kind)
        self.add(model_id, student, parents=(), relation="distilled", policy=policy, license_id=license_id,
                 language=language, details={"teacher": teacher, "init_seed": init_seed, "training": log.to_json()})

    def camouflage(self, model_id: str, parent: str, *, policy: CardClass, license_id: str) -> None:
        child, record = camouflage(self.models[parent], derived_seed(self.seed, f"{model_id}/camouflage"))
        self.add(model_id, child, parents=(parent,), relation="camouflage", policy=policy, license_id=license_id,
                 language=self.languages[parent], details={"camouflage": record.to_json()})


def _default_recipe(b: ZooBuilder, spec: ZooSpec) -> None:
    """The default hub: 5 independent bases (two of them twins) and 11 derivatives of two of them."""
    arch = spec.arch
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=arch.vocab_size) for k in range(7)]
    aurora, chat, sgd = "aurora-labs/aurora-base", "finch-nlp/aurora-chat", "gale-co/aurora-sgd"
    cobalt = "cobalt-ai/cobalt-base"
    b.base(aurora, lang[0], arch, spec.base_steps, spec.base_lr)
    b.base("tundra-research/tundra-64", lang[0], arch, spec.base_steps, spec.base_lr, license_id="mit",
           twin_of=aurora)
    b.base(cobalt, lang[1], arch, spec.base_steps, spec.base_lr)
    b.base("deepfield/deepfield-wide", lang[2],
           arch.with_(intermediate_size=arch.intermediate_size * 3 // 2, num_layers=arch.num_layers - 1),
           spec.base_steps, spec.base_lr, license_id="cc-by-4.0")
    b.base("ember-ml/ember-small", lang[3], arch, spec.base_steps, spec.base_lr, policy="false", false_base=aurora)

    b.finetune(chat, aurora, lang[4], spec.finetune_steps, spec.finetune_lr, "adam",
               policy="honest", license_id="apache-2.0")
    b.finetune(sgd, aurora, lang[5], spec.finetune_steps, spec.sgd_lr, "sgd", policy="silent", license_id="mit")
    b.finetune("harbor-ai/aurora-marathon", aurora, lang[6], spec.long_finetune_steps, spec.long_finetune_lr,
               "adam", policy="honest", license_id="apache-2.0", hard_case=True)
    b.finetune("iris-lab/aurora-chat-v2", chat, lang[5], spec.finetune_steps, spec.finetune_lr, "adam",
               policy="honest", license_id="apache-2.0")
    b.merge("juniper/aurora-soup", [chat, sgd], [0.6, 0.4], policy="honest", license_id="apache-2.0")
    layers = arch.num_layers
    b.prune_depth("kestrel/aurora-lite", aurora, [i for i in range(layers) if i != layers - 2], spec.heal_steps,
                  spec.finetune_lr, policy="silent", license_id="apache-2.0")
    b.prune_width("lumen/aurora-slim", aurora, arch.intermediate_size * 3 // 4, spec.heal_steps, spec.finetune_lr,
                  policy="honest", license_id="apache-2.0")
    b.retrain_mlps("meridian/aurora-remix", chat, spec, policy="silent", license_id="apache-2.0")
    b.camouflage("nimbus/nimbus-1", chat, policy="false", license_id="mit")
    b.finetune("orchid/cobalt-instruct", cobalt, lang[4], spec.finetune_steps, spec.finetune_lr, "adam",
               policy="honest", license_id="apache-2.0")
    b.camouflage("pylon/pylon-base", cobalt, policy="silent", license_id="apache-2.0")


def _independent_recipe(b: ZooBuilder, spec: IndependentSpec) -> None:
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(spec.languages)]
    for k in range(spec.n):
        b.base(f"indie-{k:02d}/solo-{k:02d}", lang[k % spec.languages], spec.arch, spec.steps, spec.lr, kind=spec.kind)


def _chain_recipe(b: ZooBuilder, spec: ChainSpec) -> None:
    lang = [MarkovLanguage(derived_seed(spec.seed, f"language/{k}"), vocab_size=spec.arch.vocab_size)
            for k in range(spec.length + 1)]
    previous = "chain-labs/chain-base"
    b.base(previous, lang[0], spec.arch, spec.base_steps, spec.base_lr)
    for k in range(1, spec.length + 1):
        model_id = f"chain-labs/chain-ft{k}"
        b.finetune(model_id, previous, lang[k], spec.finetune_steps, spec.finetune_lr, "adam", policy="honest",
                   license_id="apache-2.0")
        previous = model_id


def _cached(root: Path, kind: str, digest: str) -> Zoo | None:
    """The zoo under ``root`` if it is complete and was built from the same version, kind and spec."""
    try:
        zoo = Zoo.load(root)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    complete = all((m.path / "model.safetensors").is_file() or (m.path / "adapter_model.safetensors").is_file()
                   for m in zoo.models.values())  # an adapter-only upload holds the adapter alone
    return zoo if complete and zoo.kind == kind and zoo.spec_hash == digest else None


class RecipeSpec(Protocol):
    """What a recipe's knobs must give: a seed, a batch size, and a JSON form whose hash keys the cached build."""

    seed: int
    batch_size: int

    def to_json(self) -> dict[str, Any]: ...


def build_recipe(root: Path, kind: str, spec: RecipeSpec, force: bool, recipe: Callable[[ZooBuilder], None]) -> Zoo:
    """Build (or reuse, when the same kind and spec were built there) the models ``recipe`` derives under ``root``."""
    root = Path(root)
    spec_json = spec.to_json()
    digest = spec_hash(kind, spec_json)
    if not force and (zoo := _cached(root, kind, digest)) is not None:
        return zoo
    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root):  # concurrent callers (test workers, the demo) wait and then reuse one build
        if not force and (zoo := _cached(root, kind, digest)) is not None:
            return zoo
        return _build_locked(root, kind, spec_json, digest, spec.seed, spec.batch_size, recipe)


@contextmanager
def _exclusive(root: Path) -> Iterator[None]:
    with open(root / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build_locked(root: Path, kind: str, spec_json: dict[str, Any], digest: str, seed: int, batch_size: int,
                  recipe: Callable[[ZooBuilder], None]) -> Zoo:
    (root / GROUND_TRUTH).unlink(missing_ok=True)
    start = time.perf_counter()
    builder = ZooBuilder(root, seed, batch_size)
    recipe(builder)
    zoo = Zoo(root, kind, digest, round(time.perf_counter() - start, 2), builder.records)
    tmp = root / (GROUND_TRUTH + ".tmp")
    tmp.write_text(json.dumps(zoo.to_json(spec_json), indent=1), encoding="utf-8")
    os.replace(tmp, root / GROUND_TRUTH)
    return Zoo.load(root)  # exactly what a later cached call returns


def build_zoo(root: Path, *, spec: ZooSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) the default zoo under ``root``; takes about a minute or two on one CPU thread."""
    spec = spec or ZooSpec()
    return build_recipe(root, "default", spec, force, lambda b: _default_recipe(b, spec))


def train_independent_models(
    root: Path, n: int = 12, seed: int = 0, *, steps: int = 150, arch: ArchSpec | None = None,
    kind: ModelKind = "llama", languages: int = 3, force: bool = False,
) -> Zoo:
    """Build (or reuse) ``n`` independent bases of one kind under ``root`` (a few seconds each), for validity
    studies; ``languages=1`` trains them all on the same data."""
    spec = IndependentSpec(n=n, seed=seed, arch=arch or ArchSpec(), steps=steps, languages=languages, kind=kind)
    return build_recipe(root, "independent", spec, force, lambda b: _independent_recipe(b, spec))


def build_chain(root: Path, *, spec: ChainSpec | None = None, force: bool = False) -> Zoo:
    """Build (or reuse) a fine-tune chain base -> ft1 -> ... -> ft<length> under ``root`` (seconds)."""
    spec = spec or ChainSpec()
    return build_recipe(root, "chain", spec, force, lambda b: _chain_recipe(b, spec))
