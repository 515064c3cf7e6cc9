"""phi_MATCH stays valid on null stress: independent Llamas made as alike as training makes them (issue 43).

The null-stress zoos (scanner.zoo.null_stress, cached by tests/conftest.py) hold 8 tiny Llamas each, of their own
random inits on one synthetic language and one data order: students distilled from one teacher on identical batches,
models trained on identical data in identical order, and models so trained at 8 MLP widths. No weight is shared, so
every pair is independent. Every model is fingerprinted once and the pairs tested from the fingerprints with the
production statistic and rule, as `hubtrace test` and a scan do (bench/bench_null_stress.py gives the figures of
every kind and other seeds; docs/statistics.md, "On trained models").

Held per family: a one-sided KS test of the 28 pair p-values against uniform at KS_ALPHA = 1e-3 and at most
binomial_bound(28) = 3 pairs at p <= 0.01; for the distilled family also at most binomial_bound(8) = 2 of the teacher's
8 pairs with its students at p <= 0.01. False failures, for exactly valid p-values: 0.1% (KS; pairs that share a
model widen its spread a little) plus 1.7e-4 (the 28 pairs' count) per family and 5e-5 (the teacher's count), about
0.35% for the three families. Measured (seed 0): one-sided KS p 0.999, 0.72, 1.00 (distilled, same order, widths),
no pair at p <= 0.01 (smallest log10 p -1.97), none of the teacher's pairs either.

A small build of each family (fast tier) checks that the recipe makes what the figures claim: one language and one
data order, an init of each model's own, the family's widths, no weight shared.
"""

from __future__ import annotations

from itertools import combinations

import pytest
import torch
from safetensors.torch import load_file
from scipy.stats import kstest

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.zoo import ArchSpec, Zoo
from scanner.zoo.null_stress import (
    STRESS_FAMILIES,
    TEACHER,
    NullStressSpec,
    build_null_stress,
    stress_pairs,
    teacher_pairs,
)
from tests.null_support import N_NULL, binomial_bound

KS_ALPHA = 1e-3
#: Counts at p <= LEVEL are held to what valid p-values exceed with probability at most COUNT_ALPHA.
LEVEL, COUNT_ALPHA = 0.01, 1e-3


def test_phi_match_p_values_under_null_stress_are_valid(null_stress_zoo: Zoo) -> None:
    prints = {m: fingerprint_model(null_stress_zoo[m].path) for m in null_stress_zoo.ids}
    family = null_stress_zoo.root.name
    pairs = stress_pairs(null_stress_zoo)
    assert len(pairs) == N_NULL * (N_NULL - 1) // 2
    teachers = teacher_pairs(null_stress_zoo)
    results = {(a, b): compare_fingerprints(prints[a], prints[b]) for a, b in [*pairs, *teachers]}
    untested = [pair for pair, result in results.items() if result.log10_p is None]
    assert not untested, f"{family}: cannot test {untested}"
    p_values = [10.0 ** results[pair].log10_p for pair in pairs]
    ks = kstest(p_values, "uniform", alternative="greater")  # p-values smaller than uniform's: too many rejections
    small = sum(p <= LEVEL for p in p_values)
    assert ks.pvalue >= KS_ALPHA, f"{family}: one-sided KS D={ks.statistic:.3f}, p={ks.pvalue:.2g}"
    assert small <= binomial_bound(len(pairs), LEVEL, COUNT_ALPHA), f"{family}: {small} of {len(pairs)} at p <= {LEVEL}"
    taught = sum(10.0 ** results[pair].log10_p <= LEVEL for pair in teachers)
    assert taught <= binomial_bound(len(teachers), LEVEL, COUNT_ALPHA), f"{family}: {taught} teacher pairs"


@pytest.mark.parametrize("family", STRESS_FAMILIES)
def test_a_null_stress_zoo_shares_data_and_no_weight(family: str, tmp_path) -> None:
    """Built small (3 GPT-2s, 2 steps): every trained model drew the same batches from the same language, from an
    init of its own, at the family's widths; no weight tensor of one model equals another's."""
    spec = NullStressSpec(family=family, kind="gpt2", n=3, steps=2, arch=ArchSpec(num_layers=2))
    zoo = build_null_stress(tmp_path, spec)
    trained = [m for m in zoo.ids if m != TEACHER]
    assert len(trained) == 3 and (TEACHER in zoo.ids) == (family == "distilled")
    logs = [zoo[m].details["training"] for m in trained]
    assert len({(log["language_seed"], log["data_seed"]) for log in logs}) == 1
    assert len({zoo[m].details["init_seed"] for m in trained}) == 3
    widths = [zoo[m].arch.intermediate_size for m in trained]
    assert widths == ([64, 96, 128] if family == "widths" else [128] * 3)
    assert all(zoo[m].relation == ("distilled" if family == "distilled" else "base") for m in trained)
    weights = {m: load_file(zoo[m].path / "model.safetensors") for m in zoo.ids}
    for a, b in combinations(zoo.ids, 2):
        shared = [k for k in weights[a] if k in weights[b] and weights[a][k].shape == weights[b][k].shape
                  and weights[a][k].numel() > weights[a][k].shape[-1] and torch.equal(weights[a][k], weights[b][k])]
        assert not shared, f"{a} and {b} share {shared}"
