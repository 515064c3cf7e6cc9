"""phi_MATCH under null stress: independent models made as alike as training can make them (issue 43).

    python bench/bench_null_stress.py                                 # Llama, Mixtral, GPT-2; seed 0
    python bench/bench_null_stress.py --kinds llama --seed 1          # another seed: its own models and language
    python bench/bench_null_stress.py --rules screened exact          # each matching rule on the same fingerprints

Three families per kind (scanner.zoo.null_stress), each 8 models of their own random inits on one synthetic language
and one data order, the null zoos' shape and recipe (tests/null_support.py: 4 blocks of width 64, 400 Adam steps at lr
5e-3, batch 8): ``distilled``, students distilled from one teacher on identical batches; ``same-order``, trained on
identical data in identical order; ``widths``, as same-order at 8 MLP widths from half to 2.25 times the kind's. No
weight is shared, so all 28 pairs of a family are independent; the teacher against its 8 students is reported on a
row of its own. Every model is fingerprinted and every pair tested from the fingerprints with the production
statistic and rule (compare_fingerprints' defaults, as `hubtrace test` and a scan use them); ``--rules`` adds
other matching rules (scanner.stats.matching; `hubtrace test --matching exact`) on the same fingerprints.

Per kind and family, and pooled per family over the kinds: the pairs, the count at p <= 0.01 beside the count a
valid test exceeds with probability at most 1e-3 (tests.null_support.binomial_bound), the one-sided KS p-value of
the pair p-values against uniform (alternative: smaller than uniform; small means too many small p-values) and the
smallest log10 p. The zoos go into the test cache (HUBTRACE_TEST_CACHE, else .hubtrace-cache) as
null-stress-<family>-<kind>[-seed<s>], trained on first use (about 27 trainings of a few seconds each per kind).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kstest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.stats.matching import MATCHING_RULES  # noqa: E402
from scanner.zoo import Zoo  # noqa: E402
from scanner.zoo.null_stress import STRESS_FAMILIES, stress_pairs, teacher_pairs  # noqa: E402
from tests.null_support import binomial_bound, null_stress_zoo  # noqa: E402

CACHE = Path(os.environ.get("HUBTRACE_TEST_CACHE") or ROOT / ".hubtrace-cache")
KINDS = ("llama", "mixtral", "gpt2")
LEVEL = 0.01


def pair_log10_ps(zoo: Zoo, rules: list[str]) -> dict[str, tuple[list[float | None], list[float | None]]]:
    """Per rule, log10 p (None: cannot test) of the family's pairs and of the teacher's pairs, from fingerprints."""
    prints = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}

    def test(pairs: list[tuple[str, str]], rule: str) -> list[float | None]:
        return [compare_fingerprints(prints[a], prints[b], rule=rule).log10_p for a, b in pairs]

    return {rule: (test(stress_pairs(zoo), rule), test(teacher_pairs(zoo), rule)) for rule in rules}


def summary(log10_ps: list[float | None]) -> str:
    tested = np.array([x for x in log10_ps if x is not None])
    p = 10.0 ** tested
    ks = kstest(p, "uniform", alternative="greater").pvalue if len(p) > 1 else float("nan")
    return (f"{len(log10_ps):>5} {len(log10_ps) - len(tested):>6} {int((p <= LEVEL).sum()):>5} "
            f"{binomial_bound(len(tested), LEVEL):>5} {ks:>9.3g} {tested.min():>8.2f}")


def final_losses(zoo: Zoo) -> str:
    losses = [zoo[m].details["training"]["final_loss"] for m in zoo.ids]
    return f"{min(losses):.2f}-{max(losses):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    parser.add_argument("--families", nargs="+", default=list(STRESS_FAMILIES), choices=STRESS_FAMILIES)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rules", nargs="+", choices=MATCHING_RULES, default=["screened"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    started = time.perf_counter()
    print(f"# seed {args.seed}; pairs at p <= {LEVEL} beside the count valid p-values exceed with probability <= 1e-3")
    print(f"{'kind':<8} {'family':<10} {'rule':<8} {'pairs':>5} {'cannot':>6} {'<=.01':>5} {'bound':>5} "
          f"{'KS 1-sided':>9} {'min lg p':>8}  {'loss':>9} {'build s':>7}")
    pooled: dict[tuple[str, str], list[float | None]] = {}
    for kind in args.kinds:
        for family in args.families:
            built = time.perf_counter()
            zoo = null_stress_zoo(CACHE, family, kind, args.seed)
            seconds = time.perf_counter() - built
            for rule, (family_ps, teacher_ps) in pair_log10_ps(zoo, args.rules).items():
                pooled.setdefault((family, rule), []).extend(family_ps)
                print(f"{kind:<8} {family:<10} {rule:<8} {summary(family_ps)}  {final_losses(zoo):>9} "
                      f"{seconds:>7.0f}", flush=True)
                if teacher_ps:
                    pooled.setdefault(("teacher", rule), []).extend(teacher_ps)
                    print(f"{kind:<8} {'teacher':<10} {rule:<8} {summary(teacher_ps)}", flush=True)
    if len(args.kinds) > 1:
        for (family, rule), values in pooled.items():
            print(f"{'all':<8} {family:<10} {rule:<8} {summary(values)}")
        for rule in args.rules:
            everything = [x for (family, r), values in pooled.items() if r == rule and family != "teacher"
                          for x in values]
            print(f"{'all':<8} {'families':<10} {rule:<8} {summary(everything)}")
    print(f"# {time.perf_counter() - started:.0f} s wall")


if __name__ == "__main__":
    main()
