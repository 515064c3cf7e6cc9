"""phi_MATCH on independently trained models of every MLP kind: valid p-values, and their fine-tunes still found.

The null zoos (tests/null_support.py, cached by tests/conftest.py) hold, per kind, 8 tiny models trained on one
synthetic language with one recipe from their own seeds: gated (Llama), plain with learned positions and tied
embeddings (GPT-2), plain with rotary positions and parallel attention (GPT-NeoX) and routed gated experts
(Mixtral). Training gives them structure in common that random weights lack (docs/statistics.md: before the plain
statistic's second view was fixed, the GPT-2s failed the KS test, p = 5.0e-4). Every model is fingerprinted
once and the 28 pairs compared from the fingerprints, as a scan does.

What is held: issue 33 asks for a one-sided KS p >= 0.01 over every pair. With phi_MATCH version 2 (the up view
decoupled from the gate view, scanner.stats.views) the suite's zoos give Llama 0.29, GPT-2 0.097, GPT-NeoX 0.42 and
Mixtral 0.67, and bench/bench_trained_null.py meets the bar on 19 of 20 zoos over five seeds (docs/statistics.md,
"On trained models"; version 1 gave 1.2e-4 on a held-out Llama zoo). A test at 0.01 on four kinds would fail one run
in 25 for a perfect statistic, and a CI machine trains its own zoos, so this test guards the KS at KS_ALPHA = 1e-3
(fingerprint format 1's plain views fail it: GPT-2 KS 1.9e-5) and no more than binomial_bound(28) = 3 pairs at
p <= 0.01. False failures, for exactly valid p-values: 0.1% (KS; the pairs share models, which widens the KS spread a
little) plus 1.7e-4 (the count) per kind, about 0.5% for the four.
"""

from __future__ import annotations

import pytest
from scipy.stats import kstest
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.quiet import no_progress_bars
from scanner.zoo import Zoo, ZooSpec
from scanner.zoo.derivations import finetune
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import TrainSpec
from tests.null_support import binomial_bound

KS_ALPHA = 1e-3
#: The largest count of pairs at p <= LEVEL that valid p-values exceed with probability at most COUNT_ALPHA.
LEVEL, COUNT_ALPHA = 0.01, 1e-3
DEPENDENT = -20.0  # log10 p a fine-tune must reach


@pytest.fixture(scope="module")
def null_prints(null_zoo: Zoo) -> dict[str, Fingerprint]:
    return {m: fingerprint_model(null_zoo[m].path) for m in null_zoo.ids}


def test_phi_match_p_values_of_independently_trained_models_are_valid(null_zoo: Zoo, null_prints) -> None:
    pairs = null_zoo.pairs(dependent=False)
    assert len(pairs) == 28
    log10_ps = [compare_fingerprints(null_prints[a], null_prints[b]).log10_p for a, b in pairs]
    p_values = [10.0**x for x in log10_ps]
    ks = kstest(p_values, "uniform", alternative="greater")  # p-values smaller than uniform's: too many rejections
    small = sum(p <= LEVEL for p in p_values)
    kind = next(iter(null_prints.values())).meta.model_type
    assert ks.pvalue >= KS_ALPHA, f"{kind}: one-sided KS D={ks.statistic:.3f}, p={ks.pvalue:.2g}"
    bound = binomial_bound(len(pairs), LEVEL, COUNT_ALPHA)
    assert small <= bound, f"{kind}: {small} of {len(pairs)} pairs at p <= {LEVEL}"


def test_a_fine_tune_of_a_trained_model_tests_dependent(null_zoo: Zoo, null_prints, tmp_path) -> None:
    """The zoo's fine-tune recipe (150 Adam steps at lr 1e-3 on another language) on the first model of each kind:
    the loss on the new language falls, and the fine-tune is found (log10 p <= -20)."""
    base = null_zoo.ids[0]
    spec = ZooSpec()
    with no_progress_bars():
        parent = AutoModelForCausalLM.from_pretrained(null_zoo[base].path).float().eval()
    child, log = finetune(parent, MarkovLanguage(seed=4242, vocab_size=parent.config.vocab_size),
                          TrainSpec(spec.finetune_steps, spec.finetune_lr, data_seed=7))
    assert log.final_loss < log.initial_loss
    with no_progress_bars():
        child.save_pretrained(tmp_path / "tuned")
    result = compare_fingerprints(null_prints[base], fingerprint_model(tmp_path / "tuned"))
    assert result.log10_p <= DEPENDENT, f"{null_zoo[base].path}: log10 p {result.log10_p:.1f}"
