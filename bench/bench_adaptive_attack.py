"""Benchmark: what a near copy costs its maker. The adaptive attack (scanner.testing.adaptive) fine-tunes a copy to keep
its original's outputs while pushing every view the test reads away from the original's, at several prices; for each
it prints the KL paid (nats per token, KL(original || copy) on held-out text of the model's language) beside phi_MATCH's
log10 p of original against copy in both argument orders. Goal (issue 43): at KL <= 0.01 the copy tests at
log10 p <= -6.

The originals: each null zoo's first model (tests/null_support.py: 4 blocks of width 64 trained 400 steps on one
synthetic language; gated Llama, plain GPT-2 and GPT-NeoX, Mixtral's routed experts), built into the test cache on
first use (``--seed`` picks another null zoo: its models and its language).

    python bench/bench_adaptive_attack.py [--kinds llama gpt2 gpt_neox mixtral] [--weights 0 0.1 0.3 1 3]
        [--steps 300] [--views read | all]

``--views read`` pushes the views the test reads (the default); ``all`` every view the fingerprint holds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprint import fingerprint_model  # noqa: E402
from scanner.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.inputs import canonical_inputs  # noqa: E402
from scanner.quiet import no_progress_bars  # noqa: E402
from scanner.testing.adaptive import VIEWS, attack, read_views  # noqa: E402
from scanner.zoo.languages import MarkovLanguage  # noqa: E402
from tests.null_support import NULL_KINDS, null_zoo  # noqa: E402

CACHE = ROOT / ".hubtrace-cache"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kinds", nargs="+", default=list(NULL_KINDS), choices=NULL_KINDS)
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.1, 0.3, 1.0, 3.0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--views", choices=("read", "all"), default="read")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    canonical = torch.from_numpy(canonical_inputs(256).ids)
    print(f"# {args.steps} Adam steps at lr {args.lr:g}, views pushed: {args.views}; null zoo seed {args.seed}")
    print("| kind | weight | KL nats/token | log10 p (A, copy) | log10 p (copy, A) | views' cos^2 after | seconds |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: |")
    with tempfile.TemporaryDirectory() as folder:
        for kind in args.kinds:
            first = null_zoo(CACHE, kind, args.seed)["indie-00/solo-00"]
            path = first.path
            language = MarkovLanguage(first.details["training"]["language_seed"], vocab_size=256)
            original = AutoModelForCausalLM.from_pretrained(path).eval()
            fp_original = fingerprint_model(path)
            views = VIEWS if args.views == "all" else read_views(fp_original.meta.mlp_kind)
            for weight in args.weights:
                started = time.perf_counter()
                copy = attack(original, lambda g, lang=language: lang.sample(8, 64, g), canonical, weight=weight,
                              views=views, steps=args.steps, lr=args.lr, seed=args.seed)
                target = Path(folder) / f"{kind}-{weight:g}"
                with no_progress_bars():
                    copy.model.save_pretrained(target)
                fp_copy = fingerprint_model(target)
                forward = compare_fingerprints(fp_original, fp_copy)
                backward = compare_fingerprints(fp_copy, fp_original)
                moved = ", ".join(f"{v} {a:.3f}" for v, a in copy.agreement.items())
                print(f"| {kind} | {weight:g} | {copy.kl:.4f} | {_p(forward.log10_p)} | {_p(backward.log10_p)} | "
                      f"{moved} | {time.perf_counter() - started:.0f} |", flush=True)


def _p(log10_p: float | None) -> str:
    return "cannot test" if log10_p is None else f"{log10_p:.1f}"


if __name__ == "__main__":
    main()
