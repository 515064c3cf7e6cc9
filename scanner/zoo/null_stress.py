"""Null-stress zoos: independently initialised models made as alike as training can make them without sharing a
weight, where a dependence test is most likely to mistake shared training for shared weights.

Three families, each of one model kind, one synthetic language and one recipe:

- ``distilled``: students of their own random inits distilled from one teacher (KL to its next-token distributions)
  on identical batches; the teacher is in the zoo too (a student shares its behaviour, not its weights);
- ``same-order``: models of their own inits trained on identical data in identical order;
- ``widths``: as ``same-order``, each model at another MLP width (intermediate size).

Every pair is independent (no weight of one was ever derived from the other), so every pair's p-value should be
uniform or conservative (bench/bench_null_stress.py, tests/test_null_stress.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any, Literal, get_args

from scanner.zoo.arch import ArchSpec, ModelKind
from scanner.zoo.build import Zoo, ZooBuilder, build_recipe, derived_seed
from scanner.zoo.languages import MarkovLanguage

StressFamily = Literal["distilled", "same-order", "widths"]
STRESS_FAMILIES: tuple[str, ...] = get_args(StressFamily)
#: The name whose data order every training run of a stress zoo draws (identical batches in identical order).
SHARED_DATA = "shared-data"
TEACHER = "teacher/teacher"


@dataclass(frozen=True)
class NullStressSpec:
    """Knobs of a null-stress zoo: ``n`` models of ``kind`` in ``family`` (plus the teacher of ``distilled``), each
    trained (or distilled) for ``steps`` Adam steps at ``lr`` on the seed's one language and one data order."""

    family: StressFamily
    kind: ModelKind = "llama"
    n: int = 8
    seed: int = 0
    arch: ArchSpec = field(default_factory=ArchSpec)
    steps: int = 400
    lr: float = 5e-3
    batch_size: int = 8
    version: int = 1
    """The recipe's version: part of the cache key, so a changed recipe is rebuilt."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def stress_widths(spec: NullStressSpec) -> list[int]:
    """The ``widths`` family's MLP widths: half the arch's to (n + 1) / 4 times it, in quarter steps, all distinct."""
    quarter = spec.arch.intermediate_size // 4
    return [2 * quarter + k * quarter for k in range(spec.n)]


def build_null_stress(root: Path, spec: NullStressSpec, *, force: bool = False) -> Zoo:
    """Build (or reuse) the null-stress zoo of ``spec`` under ``root`` (a few CPU-minutes: n + 1 tiny trainings)."""
    return build_recipe(root, "null-stress", spec, force, lambda b: _recipe(b, spec))


def stress_pairs(zoo: Zoo) -> list[tuple[str, str]]:
    """The pairs a family is judged on: every pair of its trained models (the teacher of ``distilled`` left out,
    see `teacher_pairs`)."""
    return list(combinations([m for m in zoo.ids if m != TEACHER], 2))


def teacher_pairs(zoo: Zoo) -> list[tuple[str, str]]:
    """The teacher against each of its students (none outside ``distilled``)."""
    return [(TEACHER, m) for m in zoo.ids if m != TEACHER] if TEACHER in zoo.models else []


def _recipe(b: ZooBuilder, spec: NullStressSpec) -> None:
    language = MarkovLanguage(derived_seed(spec.seed, "language"), vocab_size=spec.arch.vocab_size)
    honest = {"policy": "honest", "license_id": "apache-2.0"}
    if spec.family == "distilled":
        b.base(TEACHER, language, spec.arch, spec.steps, spec.lr, kind=spec.kind)
        for k in range(spec.n):
            b.distill(f"student-{k:02d}/student-{k:02d}", TEACHER, spec.steps, spec.lr, kind=spec.kind,
                      data_of=SHARED_DATA, **honest)
        return
    widths = stress_widths(spec) if spec.family == "widths" else [spec.arch.intermediate_size] * spec.n
    for k, width in enumerate(widths):
        b.base(f"{spec.family}-{k:02d}/model-{k:02d}", language, spec.arch.with_(intermediate_size=width), spec.steps,
               spec.lr, kind=spec.kind, data_of=SHARED_DATA)
