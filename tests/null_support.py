"""The null zoos: independently trained tiny models of every MLP kind, one language and one recipe, other seeds.

Shared by the fixture that caches them (tests/conftest.py), the tests that read them (tests/test_trained_null.py)
and the benchmark that reports their figures on other seeds (bench/bench_trained_null.py).
"""

from __future__ import annotations

from pathlib import Path

from scanner.zoo import ArchSpec, Zoo, train_independent_models

#: One kind of MLP each: gated (Llama), plain with learned positions and tied embeddings (GPT-2), plain with rotary
#: positions and parallel attention (GPT-NeoX), routed gated experts (Mixtral).
NULL_KINDS = ("llama", "gpt2", "gpt_neox", "mixtral")
#: The zoo's default shape (width 64, 4 layers), with the MLP width of each kind's own convention: GPT-2 and GPT-NeoX
#: four times the residual width, the gated kinds twice.
NULL_ARCH = {kind: ArchSpec(intermediate_size=256) if kind in ("gpt2", "gpt_neox") else ArchSpec()
             for kind in NULL_KINDS}
#: Models per kind: 28 independent pairs.
N_NULL = 8
#: Adam steps (lr 5e-3, batch 8) on the one language: the loss falls from 5.5 to about 2.2-2.3 nats, and the plain
#: statistic before its second view was fixed failed on GPT-2s trained so (docs/statistics.md).
NULL_STEPS = 400


def null_zoo(cache: Path, kind: str, seed: int = 0) -> Zoo:
    """N_NULL independent models of ``kind`` on one language, cached (file-locked) under cache/null-<kind>; another
    seed (the benchmark's held-out figures) goes to a folder of its own."""
    folder = cache / (f"null-{kind}" if seed == 0 else f"null-{kind}-seed{seed}")
    return train_independent_models(folder, n=N_NULL, seed=seed, steps=NULL_STEPS, arch=NULL_ARCH[kind], kind=kind,
                                    languages=1)
