"""The null zoos: independently trained tiny models of every MLP kind, one language and one recipe, other seeds; and
the null-stress zoos (scanner.zoo.null_stress): students of one teacher, identical data order, other widths.

Shared by the fixtures that cache them (tests/conftest.py), the tests that read them (tests/test_trained_null.py,
tests/test_null_stress.py) and the benchmarks that report their figures on other seeds (bench/bench_trained_null.py,
bench/bench_null_stress.py).
"""

from __future__ import annotations

from pathlib import Path

from scipy.stats import binom

from scanner.zoo import ArchSpec, Zoo, train_independent_models
from scanner.zoo.arch import ModelKind
from scanner.zoo.null_stress import NullStressSpec, StressFamily, build_null_stress

#: One kind of MLP each: gated (Llama), plain with learned positions and tied embeddings (GPT-2), plain with rotary
#: positions and parallel attention (GPT-NeoX), routed gated experts (Mixtral).
NULL_KINDS = ("llama", "gpt2", "gpt_neox", "mixtral")
#: The zoo's default shape (width 64, 4 layers), with the MLP width of each kind's own convention: GPT-2 and GPT-NeoX
#: four times the residual width, the gated kinds twice.
NULL_ARCH = {kind: ArchSpec(intermediate_size=256) if kind in ("gpt2", "gpt_neox") else ArchSpec()
             for kind in NULL_KINDS}
#: Models per kind: 28 independent pairs.
N_NULL = 8
#: Adam steps (lr 5e-3, batch 8) on the one language: the loss falls from 5.5 to about 2.2-2.3 nats, long enough for
#: independently trained models to share features, which is what a view pair that is not valid under training must
#: be caught on (a plain MLP's raw write view fails here: docs/statistics.md).
NULL_STEPS = 400


def null_zoo(cache: Path, kind: str, seed: int = 0) -> Zoo:
    """N_NULL independent models of ``kind`` on one language, cached (file-locked) under cache/null-<kind>; another
    seed (the benchmark's held-out figures) goes to a folder of its own."""
    folder = cache / (f"null-{kind}" if seed == 0 else f"null-{kind}-seed{seed}")
    return train_independent_models(folder, n=N_NULL, seed=seed, steps=NULL_STEPS, arch=NULL_ARCH[kind], kind=kind,
                                    languages=1)


def null_stress_zoo(cache: Path, family: StressFamily, kind: ModelKind, seed: int = 0) -> Zoo:
    """The null-stress zoo of ``family`` and ``kind`` (N_NULL models, the kind's NULL_ARCH, NULL_STEPS of training),
    cached (file-locked) under cache/null-stress-<family>-<kind>; another seed goes to a folder of its own."""
    folder = cache / (f"null-stress-{family}-{kind}" + ("" if seed == 0 else f"-seed{seed}"))
    spec = NullStressSpec(family=family, kind=kind, n=N_NULL, seed=seed, arch=NULL_ARCH[kind], steps=NULL_STEPS)
    return build_null_stress(folder, spec)


def binomial_bound(pairs: int, level: float = 0.01, alpha: float = 1e-3) -> int:
    """The largest count of ``pairs`` p-values at or below ``level`` that valid p-values exceed with probability at
    most ``alpha`` (independent pairs; pairs that share a model spread the count a little more)."""
    return int(binom.isf(alpha, pairs, level))
