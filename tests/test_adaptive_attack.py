"""Issue 43: a near copy costs its maker. The adaptive attack (scanner.testing.adaptive) fine-tunes a copy of a trained
gated model (the Llama null zoo's first model) to keep its outputs while pushing every view the test reads (gate,
decoupled up, write) away from the original's; the copy must either pay for it in its outputs (KL above 0.01
nats/token on held-out text) or still test dependent at log10 p <= -6 in both argument orders.

The attack and the training are seeded; on another machine's build of the null zoo the KL and the p-values move a
little, and the margins below are wide (measured on this machine: KL 0.009 at weight 0.1 with log10 p about -200,
docs/statistics.md "Known to defeat the test" and BENCHMARKS.md). The two-view statistic fell to -1.3 on that copy,
so the assertion could fail.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from scanner.fingerprint import fingerprint_model
from scanner.fingerprint_compare import compare_fingerprints
from scanner.inputs import canonical_inputs
from scanner.testing.adaptive import attack, read_views
from scanner.zoo.languages import MarkovLanguage
from tests.conftest import CACHE
from tests.null_support import null_zoo

PRICE_PAID, STILL_DEPENDENT = 0.01, -6.0


@pytest.fixture(scope="module")
def original():
    first = null_zoo(CACHE, "llama")["indie-00/solo-00"]
    language = MarkovLanguage(first.details["training"]["language_seed"], vocab_size=256)
    return first.path, AutoModelForCausalLM.from_pretrained(first.path).eval(), language


@pytest.mark.parametrize("weight", [0.0, 0.1])
def test_a_gated_copy_fine_tuned_against_the_statistic_pays_or_stays_dependent(original, weight: float) -> None:
    path, model, language = original
    copy = attack(model, lambda g: language.sample(8, 64, g), torch.from_numpy(canonical_inputs(256).ids),
                  weight=weight, views=read_views("gated"), steps=300)
    if weight > 0:  # the attack did push: the views moved far from the original's
        assert max(copy.agreement.values()) < 0.5, copy.agreement
    with tempfile.TemporaryDirectory() as folder:
        copy.model.save_pretrained(folder)
        fp_copy = fingerprint_model(Path(folder))
    fp_original = fingerprint_model(path)
    forward, backward = compare_fingerprints(fp_original, fp_copy), compare_fingerprints(fp_copy, fp_original)
    assert copy.kl > PRICE_PAID or max(forward.log10_p, backward.log10_p) <= STILL_DEPENDENT, \
        (copy.kl, forward.log10_p, backward.log10_p)
