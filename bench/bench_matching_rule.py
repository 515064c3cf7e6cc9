"""Benchmark: MATCH's matching rules (scanner.stats.matching) against the exact assignment, in cost and in power.

    python bench/bench_matching_rule.py --cost                 # 11008-unit matrices: time and agreement per k
    python bench/bench_matching_rule.py --zoos                 # every related pair of the cached zoos, both rules
    python bench/bench_matching_rule.py --adversary            # the suite's hardest disguise: jittered splits

``--cost``: cosine matrices of 11008 x 11008 units on 256 tokens (Gaussian activations; a dependent pair is a
permuted copy plus noise, ``--noise`` times the activations' scale: 1.0 gives the true partner a cosine of about
0.7, 4.0 about 0.24), matched exactly (the certified solver) and greedily with ``--candidates`` per row: seconds, the
total cosine lost per unit against the optimum, the share of units paired as the exact assignment pairs them, and
the share paired with their true partner.

``--zoos``: every pair of related models in the cached zoos (the suite's zoo, the small seed zoos, the fine-tune
chain, the merge zoo; built on first use, as the tests build them, under HUBTRACE_TEST_CACHE or .hubtrace-cache),
compared from fingerprints as a scan does (every block), with each rule (exact, the default screened rule, greedy):
the weakest pairs first, how many
verdicts differ at alpha = 0.01 and at log10 p = -20, how far each rule's closeness is from the exact one's; then the
smallest log10 p over the unrelated pairs. The null zoos' validity and their fine-tunes: bench/bench_trained_null.py
--rules.

``--adversary``: the zoo's trained Llama split unit by unit into k copies with antithetic jitter (bench_adversary.py's
disguise, the suite's hardest), log10 p of original against copy with each rule.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.quiet import no_progress_bars  # noqa: E402
from scanner.stats.assignment.greedy import greedy_matching  # noqa: E402
from scanner.stats.matching import cosine_similarity_matrix, match_similarity  # noqa: E402
from scanner.zoo import Zoo, build_chain, build_zoo  # noqa: E402
from scanner.zoo.tool_zoo import build_merge_zoo  # noqa: E402

CACHE = Path(os.environ.get("HUBTRACE_TEST_CACHE") or ROOT / ".hubtrace-cache")
RULES = ("exact", "screened", "greedy")


def cost(args: argparse.Namespace) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((args.units, 256), dtype=np.float32)
    print("| pair | rule | seconds | cosine lost per unit | paired as exact pairs | true partner |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for noise in [None, *args.noise]:
        if noise is None:
            b, truth, label = rng.standard_normal(a.shape, dtype=np.float32), None, "independent"
        else:
            permutation = rng.permutation(args.units)
            b = a[permutation] + noise * rng.standard_normal(a.shape, dtype=np.float32)
            truth, label = np.argsort(permutation), f"dependent, noise {noise:g}"
        similarity = cosine_similarity_matrix(a, b)
        rows = np.arange(args.units)
        runs = [("exact", "exact", 0)] + [(f"greedy k={k}", "greedy", k) for k in args.candidates]
        exact = None
        for name, rule, k in runs:
            start = time.perf_counter()
            columns = (match_similarity(similarity, "exact").b_index if rule == "exact" else
                       greedy_matching(similarity, candidates=k))
            seconds = time.perf_counter() - start
            exact = columns if exact is None else exact
            lost = float(similarity[rows, exact].sum(dtype=np.float64)
                         - similarity[rows, columns].sum(dtype=np.float64))
            recovered = "" if truth is None else f"{np.mean(columns == truth):.4f}"
            print(f"| {label} | {name} | {seconds:.2f} | {lost / args.units:.5f} | {np.mean(columns == exact):.4f} | "
                  f"{recovered} |", flush=True)


def zoos() -> list[tuple[str, Zoo]]:
    from tests.lineage_support import seed_zoo

    found = [("zoo", build_zoo(CACHE / "zoo"))]
    found += [(f"seed {s}", seed_zoo(CACHE, s)) for s in (1, 2, 3)]
    found.append(("chain", build_chain(CACHE / "chain", spec=_chain_spec())))
    found.append(("merges", build_merge_zoo(CACHE / "merge-zoo-test", spec=_merge_spec())))
    return found


def _chain_spec():  # noqa: ANN202 - the suite's spec, read where the suite defines it
    from tests.conftest import CHAIN_SPEC

    return CHAIN_SPEC


def _merge_spec():  # noqa: ANN202
    from tests.conftest import MERGE_ZOO_SPEC

    return MERGE_ZOO_SPEC


def zoo_power(weakest: int) -> None:
    related, unrelated = [], {rule: 0.0 for rule in RULES}
    for name, zoo in zoos():
        prints = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
        for dependent in (True, False):
            for a, b in zoo.pairs(dependent=dependent):
                result = {rule: compare_fingerprints(prints[a], prints[b], rule=rule) for rule in RULES}
                if dependent:
                    related.append((name, a, b, result))
                else:
                    unrelated = {rule: min(unrelated[rule], result[rule].log10_p) for rule in RULES}
        print(f"# {name}: {len(zoo.ids)} models", flush=True)
    related.sort(key=lambda row: -row[3]["exact"].log10_p)
    print(f"\n{len(related)} related pairs; the {weakest} weakest by the exact rule, log10 p (closeness):")
    print("| zoo | pair | " + " | ".join(RULES) + " |")
    print("| --- | --- |" + " ---: |" * len(RULES))
    for name, a, b, result in related[:weakest]:
        print(f"| {name} | {a} vs {b} | " + " | ".join(f"{result[r].log10_p:.1f} ({result[r].closeness:.4f})"
                                                      for r in RULES) + " |")
    for rule in RULES[1:]:
        exact = np.array([r["exact"].log10_p for *_, r in related])
        other = np.array([r[rule].log10_p for *_, r in related])
        closer = np.array([r[rule].closeness - r["exact"].closeness for *_, r in related])
        weak = exact > -30
        flips = [int(((exact <= level) != (other <= level)).sum()) for level in (-2, -20)]
        change = other[weak] - exact[weak]
        print(f"{rule}: verdicts that differ from exact at log10 p <= -2: {flips[0]}, at -20: {flips[1]} (of "
              f"{len(related)}); log10 p minus exact on the {int(weak.sum())} pairs above -30: median "
              f"{np.median(change):+.1f}, largest loss {change.max():+.1f}; closeness minus exact: mean "
              f"{closer.mean():+.5f}, min {closer.min():+.5f}, max {closer.max():+.5f}")
    print("unrelated pairs, smallest log10 p: " + ", ".join(f"{r} {unrelated[r]:.2f}" for r in RULES))


def adversary(copies: list[int], jitter: list[float]) -> None:
    from transformers import AutoModelForCausalLM

    from tests.fixtures import adversary as adv

    path = build_zoo(CACHE / "zoo")["aurora-labs/aurora-base"].path
    original = AutoModelForCausalLM.from_pretrained(path).eval()
    fp_original = fingerprint_model(path)
    print("| copies | jitter | " + " | ".join(f"{r} log10 p" for r in RULES) + " |")
    print("| ---: | ---: |" + " ---: |" * len(RULES))
    with tempfile.TemporaryDirectory() as folder:
        for k in copies:
            for size in jitter:
                split = adv.apply(adv.split_units(k, size, antithetic=True), copy.deepcopy(original), 5)
                with no_progress_bars():
                    split.save_pretrained(Path(folder) / "copy")
                fp_copy = fingerprint_model(Path(folder) / "copy")
                p = [compare_fingerprints(fp_original, fp_copy, rule=r).log10_p for r in RULES]
                print(f"| {k} | {size:g} | " + " | ".join(f"{x:.1f}" for x in p) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cost", action="store_true")
    parser.add_argument("--units", type=int, default=11008)
    parser.add_argument("--noise", type=float, nargs="*", default=[1.0, 4.0])
    parser.add_argument("--candidates", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--zoos", action="store_true")
    parser.add_argument("--weakest", type=int, default=12)
    parser.add_argument("--adversary", action="store_true")
    parser.add_argument("--copies", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.3, 1.0])
    args = parser.parse_args()
    if args.cost:
        cost(args)
    if args.zoos:
        zoo_power(args.weakest)
    if args.adversary:
        adversary(args.copies, args.jitter)


if __name__ == "__main__":
    main()
