"""Benchmark: how much jitter a copier needs to hide a split copy, against what it costs the copy's outputs.

Each unit of the zoo's trained Llama (aurora-labs/aurora-base) is split into k copies with antithetic jitter (the
copies share the output column equally and their jitters sum to zero, so the outputs move only to second order: the
copier's best split). For each k and jitter: the largest logit change (relative to the largest logit, on random
tokens), phi_MATCH's log10 p of original against copy and the closeness. `scanner.stats.degenerate` groups copies
whose directions agree to a cosine of 0.8 in every view; beyond that the copies are unrelated units to the test.

    python bench/bench_adversary.py [--copies 2 4 8] [--jitter 0.1 0.3 0.5 1.0]
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.quiet import no_progress_bars
from scanner.zoo import build_zoo
from tests.fixtures import adversary as adv

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.1, 0.3, 0.5, 1.0])
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args()
    path = build_zoo(CACHE / "zoo")["aurora-labs/aurora-base"].path
    original = AutoModelForCausalLM.from_pretrained(path).eval()
    fp_original = fingerprint_model(path)
    ids = torch.randint(0, original.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    print("| copies | jitter | largest logit change | log10 p | closeness |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for copies in args.copies:
            for jitter in args.jitter:
                split = adv.apply(adv.split_units(copies, jitter, antithetic=True), copy.deepcopy(original), args.seed)
                change = adv.max_logit_change(original, split, ids)
                with no_progress_bars():
                    split.save_pretrained(Path(folder) / "copy")
                result = compare_fingerprints(fp_original, fingerprint_model(Path(folder) / "copy"))
                print(f"| {copies} | {jitter:g} | {change:.1e} | {result.log10_p:.1f} | {result.closeness:.3f} |",
                      flush=True)


if __name__ == "__main__":
    main()
