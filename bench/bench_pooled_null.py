"""MoE blocks tested on their units pooled: are the p-values of independently trained MoE models valid?

    python bench/bench_pooled_null.py                   # the suite's MoE kinds, a 64-expert DeepSeek-V3; seeds 100-107
    python bench/bench_pooled_null.py --seeds 200 201 202 203 204 205 206 207

scanner.stats.pooled_units tests each MoE block on all its MLPs' units pooled, beside its experts paired one to one.
Its null argument rests on the pooled units' labels (a fixed pseudo-random order) and on the selection being a function
of each side's own units; what trained experts share (each expert's units alike, a map between views every model
learns) is what could break it. Each kind here is trained as the adversary suite trains it (tests.adversary_support:
40 AdamW steps on a repeating pattern; seeds the suite never uses), fingerprinted, and every pair compared as a scan
does. Per kind: the pairs' p-values (the block's pooled test joined by Bonferroni, as reported), and every MoE block's
pooled p-value alone: how many at p <= 0.01 against the binomial count a valid test exceeds with probability 1e-3, the
one-sided KS p-value against uniform (small: too many small p-values), and the smallest log10 p.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import torch
from scipy.stats import kstest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import block_pooled, compare_fingerprints  # noqa: E402
from scanner.stats.registry import STATISTIC_BY_NAME  # noqa: E402
from tests.adversary_support import KINDS, Kind, save, trained_model  # noqa: E402
from tests.null_support import binomial_bound  # noqa: E402

#: The suite's MoE kinds, and a DeepSeek-V3 with 64 small experts (more experts than any of them: the layout the
#: pooled units' labels are there for).
BENCH_KINDS = [k for k in KINDS if k.moe] + [
    Kind("moe-64-experts", "deepseek_v3", {"n_routed_experts": 64, "moe_intermediate_size": 16}, moe=True)]


def pooled_block_p_values(a: Fingerprint, b: Fingerprint) -> list[float]:
    """log10 p of every MoE block pair's pooled test alone."""
    entry = STATISTIC_BY_NAME["match"]
    out = []
    for layer in range(min(len(a.blocks), len(b.blocks))):
        if max(len(a.blocks[layer]), len(b.blocks[layer])) == 1:
            continue
        x, y = block_pooled(a, layer), block_pooled(b, layer)
        sign_free = a.meta.up_sign_free
        (test,) = entry.compute([(x.gate, x.up, y.gate, y.up)], device=None, rule="screened", up_sign_free=sign_free,
                                screens=[(x.screen(sign_free), y.screen(sign_free))],
                                writes=[None if x.write is None or y.write is None else (x.write, y.write)])
        if not test.cannot_test:
            out.append(test.log10_p)
    return out


def row(name: str, log10_ps: list[float]) -> str:
    p = [10.0**x for x in log10_ps]
    ks = kstest(p, "uniform", alternative="greater").pvalue
    small = sum(x <= 0.01 for x in p)
    return (f"| {name} | {len(p)} | {small} (bound {binomial_bound(len(p))}) | {ks:.3g} | {min(log10_ps):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(100, 108)))
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| kind: p-values | count | at p <= 0.01 | one-sided KS p | smallest log10 p |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in BENCH_KINDS:
            prints = [fingerprint_model(save(trained_model(kind, seed), Path(tmp) / f"{kind.name}-{seed}"))
                      for seed in args.seeds]
            pairs = list(itertools.combinations(prints, 2))
            print(row(f"{kind.name}: pairs as reported", [compare_fingerprints(a, b).log10_p for a, b in pairs]))
            print(row(f"{kind.name}: MoE blocks pooled", [p for a, b in pairs for p in pooled_block_p_values(a, b)]))
            sys.stdout.flush()


if __name__ == "__main__":
    main()
