"""Validity after selection: φ_MATCH p-values of independent pairs that candidate retrieval selected stay uniform.

Synthetic independent models whose units are exchangeable (iid given the model) but not alike across models:
each model mixes a shared low-rank component (what training on the same data gives every model) into its units
with its own strength, so some independent pairs collide far more often than others and the retrieval, with its
threshold lowered, selects a few hundred of them. Their φ_MATCH p-values must pass a KS test against uniform
(α = 0.001: a false-failure rate of 0.1% for exactly uniform p-values; fixed seeds, so the outcome is fixed).

The control shows the check has the power to fail: a selection of the same size by a score that looks at unit
labels (a quick look at block 0's matchings) makes the selected p-values non-uniform.
"""

from __future__ import annotations

import dataclasses
from itertools import combinations

import numpy as np
import pytest
from scipy.stats import kstest

from scanner.activations import MLPActivations
from scanner.fingerprint import Fingerprint
from scanner.fingerprint_compare import compare_fingerprints
from scanner.retrieval.candidates import scored_pairs
from scanner.retrieval.index import RetrievalIndex, SearchParams
from scanner.retrieval.signatures import retrieval_entry
from scanner.stats.independence import phi_match
from tests.synthetic_fingerprints import template_fingerprint

MODELS, BLOCKS, UNITS, TOKENS, RANK = 44, 2, 48, 64, 3
ALPHA = 0.001
SELECTED = 320


def _independent_models(template: Fingerprint) -> dict[str, Fingerprint]:
    rng = np.random.default_rng(7)
    shared = rng.standard_normal((RANK, TOKENS)).astype(np.float32)
    models = {}
    for m in range(MODELS):
        strength = rng.uniform(0.0, 3.0)

        def part(strength: float = strength) -> np.ndarray:
            return (strength * rng.standard_normal((UNITS, RANK)) @ shared
                    + rng.standard_normal((UNITS, TOKENS))).astype(np.float32)

        blocks = [[MLPActivations(part(), part())] for _ in range(BLOCKS)]
        meta = dataclasses.replace(template.meta, model=f"indie-{m:02d}", n_layers=BLOCKS, intermediate_size=UNITS)
        models[meta.model] = Fingerprint(meta, blocks)
    return models


def _label_score(a: Fingerprint, b: Fingerprint) -> float:
    """A selection score that is NOT invariant to relabelling units: a quick look at block 0 (how far its gate and
    up matchings agree unit by unit, phi_MATCH's own rho there)."""
    x, y = a.blocks[0][0], b.blocks[0][0]
    return phi_match(x.gate, x.up, y.gate, y.up).rho


@pytest.fixture(scope="module")
def null_pairs(tmp_path_factory):
    template = template_fingerprint(tmp_path_factory.mktemp("template"), TOKENS)
    models = _independent_models(template)
    entries = {(name, "r"): retrieval_entry(fp) for name, fp in models.items()}
    index = RetrievalIndex(tmp_path_factory.mktemp("index"), template.meta.input_set,
                           search=SearchParams(neighbours=64, threshold=0.45))
    index.sync({key: (lambda e=entry: e) for key, entry in entries.items()})
    scored = scored_pairs(index, entries)
    min_score = sorted((p.score for p in scored), reverse=True)[SELECTED - 1]   # the threshold, lowered to this
    scores = {(p.model_a, p.model_b): p.score for p in scored if p.score >= min_score}
    log10_p = {(a, b): compare_fingerprints(models[a], models[b]).log10_p for a, b in combinations(sorted(models), 2)}
    return models, scores, log10_p


def test_p_values_of_retrieval_selected_independent_pairs_are_uniform(null_pairs) -> None:
    _, scores, log10_p = null_pairs
    assert len(scores) >= 200, f"the lowered threshold selected only {len(scores)} pairs"
    assert len(scores) <= 0.8 * len(log10_p), "the selection must leave pairs out to be a selection"
    selected = np.array([10 ** log10_p[pair] for pair in scores])
    assert kstest(selected, "uniform").pvalue > ALPHA


def test_a_selection_that_looks_at_unit_labels_would_fail_the_same_check(null_pairs) -> None:
    models, scores, log10_p = null_pairs
    by_labels = sorted(log10_p, key=lambda pair: -_label_score(models[pair[0]], models[pair[1]]))[:len(scores)]
    selected = np.array([10 ** log10_p[pair] for pair in by_labels])
    assert kstest(selected, "uniform").pvalue < ALPHA
