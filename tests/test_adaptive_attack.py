"""Issue 43: a near copy costs its maker. The adaptive attack (tests.fixtures.adaptive) fine-tunes a copy of a trained
model to keep its outputs while pushing every view the test reads (gate, decoupled up, write) away from the original's;
the copy must either pay for it in its outputs (KL above 0.01 nats/token on held-out text of the model's language) or
still test dependent at log10 p <= -6 in both argument orders. The originals: the gated Llama and Mixtral's routed
experts (each null zoo's first model, tests/null_support.py).

Each case's price ``weight`` puts the KL near 0.01 on this machine, where the assertion is hardest to meet. Measured
(Xeon, loaded 2-core VM; docs/statistics.md "Known to defeat the test", BENCHMARKS.md): the Llama at weight 0 KL
0.0010, log10 p -851 (the attack's own noise); at weight 0.1 KL 0.0093, -207 (the two-view statistic, version 3, fell
to -1.3 on that copy, so the assertion could fail); Mixtral at weight 0.3 KL 0.0085, -35.1 and -35.2 (version 3:
-0.0). Why another machine's build of the null zoo will not flip them: the attack and the training are seeded, and a
zoo built elsewhere differs in the last bits, which moves the KL and the p-values a little. A failure needs a copy
that pays at most 0.01 and reaches above -6, which on these curves takes a KL of 0.017 or more (Llama 0.0165 gives
-14.9; Mixtral falls from -35.1 at 0.0085 to -4.2 at 0.019): the copy would have to hide as well as one that paid
70% more. Plain MLPs and the hybrid (a tiny Jamba) are not here: their copies hide at a KL far below 0.01 (GPT-2
0.0011, GPT-NeoX 0.0003, Jamba 0.0006), a known defeat (docs/statistics.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.fingerprints.inputs import canonical_inputs
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.quiet import no_progress_bars
from scanner.zoo import Zoo
from scanner.zoo.languages import MarkovLanguage
from scanner.zoo.training import single_thread
from tests.fixtures.adaptive import attack, mlp_ablation_kl, read_views

PRICE_PAID, STILL_DEPENDENT = 0.01, -6.0
#: The price is small only against what the MLPs carry: replacing every MLP's output by its mean costs the null zoos'
#: models 3.7 and 3.9 nats/token (Llama, Mixtral; GPT-2 4.2, GPT-NeoX 2.9): a copy that pays 0.01 kept their work.
MLPS_CARRY_AT_LEAST = 1.0


@pytest.mark.parametrize(("null_zoo", "weight"), [("llama", 0.0), ("llama", 0.1), ("mixtral", 0.3)],
                         indirect=["null_zoo"])
def test_a_copy_fine_tuned_against_the_statistic_pays_or_stays_dependent(null_zoo: Zoo, weight: float,
                                                                         tmp_path: Path) -> None:
    first = null_zoo["indie-00/solo-00"]
    language = MarkovLanguage(first.details["training"]["language_seed"], vocab_size=256)
    original = AutoModelForCausalLM.from_pretrained(first.path).eval()
    assert mlp_ablation_kl(original, language.sample(16, 64, torch.Generator().manual_seed(5))) > MLPS_CARRY_AT_LEAST
    fp_original = fingerprint_model(first.path)
    with single_thread():  # reproducible reductions, and no threads spin-waiting on a loaded machine
        copy = attack(original, lambda g: language.sample(8, 64, g), torch.from_numpy(canonical_inputs(256).ids),
                      weight=weight, views=read_views(fp_original.meta.mlp_kind), steps=300)
    if weight > 0:  # the attack did push: the views moved far from the original's
        assert max(copy.agreement[view] for view in copy.pushed) < 0.5, copy.agreement
    with no_progress_bars():
        copy.model.save_pretrained(tmp_path)
    fp_copy = fingerprint_model(tmp_path)
    forward, backward = compare_fingerprints(fp_original, fp_copy), compare_fingerprints(fp_copy, fp_original)
    assert copy.kl > PRICE_PAID or max(forward.log10_p, backward.log10_p) <= STILL_DEPENDENT, \
        (copy.kl, forward.log10_p, backward.log10_p)
