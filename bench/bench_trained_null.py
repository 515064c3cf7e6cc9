"""phi_MATCH on independently trained models of every MLP kind: how many independent pairs reject, against uniform.

    python bench/bench_trained_null.py                      # seed 0: the suite's null zoos (null-* in the zoo cache)
    python bench/bench_trained_null.py --seeds 1 2 3        # other seeds, built there as null-*-seed<s>
    python bench/bench_trained_null.py --seeds 1 --power    # and the power on fine-tunes of each kind's first model
    python bench/bench_trained_null.py --rules greedy exact  # each matching rule on the same fingerprints

The zoo cache is HUBTRACE_TEST_CACHE, else .hubtrace-cache, as for the tests. Each seed trains
tests/null_support.py's zoo of every kind (8 models on one synthetic language, one recipe; a few minutes of CPU per
seed) unless the cache holds it, and compares all 28 pairs from fingerprints, as a scan does. Per kind and seed, and
pooled over the seeds: the pairs at p <= 0.05 and p <= 0.01 (with the count a valid test expects), the one-sided KS
p-value of the pair p-values against uniform (small: too many small p-values), and the smallest log10 p. For the
plain kinds it also reports the views of fingerprint format 1 (the fc pre-activation and the proj column read back
on the MLP input, its projection on the first view removed unit by unit: the plain statistic before its fix),
recomputed here from the live model so both statistics read the same models.

--coupling prints, per kind and block, the mean over pairs of the correlation between the two views' similarity
matrices (the cosines of every unit of A with every unit of B, in view 1 and in view 2): near 0 when the matchings
of the two views are unrelated under independence, as phi_MATCH's null needs; a shared read-to-write coupling
makes it positive (docs/statistics.md).

--power fine-tunes each kind's first model on another language with the zoo's recipe (150 Adam steps, lr 1e-3) and
two heavier ones (400 steps at lr 1e-3; 150 at the pre-training lr 5e-3) and prints log10 p against its base.

--rules: the matching rules (scanner.stats.matching) each figure is given for, on the same fingerprints (default: the
default rule alone); the statistic column reads "now" for the default rule, else the rule's name.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kstest
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.fingerprints.inputs import canonical_inputs  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.quiet import no_progress_bars  # noqa: E402
from scanner.reading.activations import MLPActivations  # noqa: E402
from scanner.reading.architectures.module_tree import decoder_stack  # noqa: E402
from scanner.reading.architectures.sites import find_sites, site_weights  # noqa: E402
from scanner.stats.independence import phi_match  # noqa: E402
from scanner.stats.logp import log10_fisher  # noqa: E402
from scanner.stats.matching import MATCHING_RULES  # noqa: E402
from scanner.zoo.derivations import finetune  # noqa: E402
from scanner.zoo.languages import MarkovLanguage  # noqa: E402
from scanner.zoo.training import TrainSpec  # noqa: E402
from tests.null_support import NULL_KINDS, null_zoo  # noqa: E402

CACHE = Path(os.environ.get("HUBTRACE_TEST_CACHE") or ROOT / ".hubtrace-cache")
PLAIN_KINDS = ("gpt2", "gpt_neox")
#: (label, Adam steps, lr) of the fine-tunes --power makes: the zoo's recipe, then two heavier ones.
FINE_TUNES = (("zoo recipe 150 @ 1e-3", 150, 1e-3), ("400 @ 1e-3", 400, 1e-3), ("150 @ 5e-3", 150, 5e-3))


def load(path: Path) -> torch.nn.Module:
    with no_progress_bars():
        return AutoModelForCausalLM.from_pretrained(path).float().eval()


@torch.no_grad()
def format1_views(path: Path) -> list[MLPActivations]:
    """Each block's plain views as fingerprint format 1 made them (one dense MLP per block, float32)."""
    model = load(path)
    ids = torch.from_numpy(canonical_inputs(model.config.vocab_size).ids)
    layers = decoder_stack(model).layers
    sites = [find_sites(layer)[0] for layer in layers]
    inputs: dict[int, torch.Tensor] = {}

    def catch(k: int):
        def hook(_module: torch.nn.Module, args: tuple) -> None:
            inputs.setdefault(k, args[0].reshape(-1, args[0].shape[-1]))
        return hook

    hooks = [layer.get_submodule(site.input_modules[0]).register_forward_pre_hook(catch(k))
             for k, (layer, site) in enumerate(zip(layers, sites, strict=True))]
    model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    views = []
    for k, (layer, site) in enumerate(zip(layers, sites, strict=True)):
        w = site_weights(layer, site)[0]
        pre = inputs[k] @ w.up.T + (0 if w.up_bias is None else w.up_bias)
        back = (inputs[k] @ w.down).double()
        scale = (pre.double() * back).sum(0) / pre.double().pow(2).sum(0).clamp_min(1e-300)
        views.append(MLPActivations(gate=pre.T.contiguous().numpy(),
                                    up=(back - pre.double() * scale).T.float().contiguous().numpy()))
    return views


def summary(log10_ps: list[float]) -> str:
    p = 10.0 ** np.asarray(log10_ps)
    ks = kstest(p, "uniform", alternative="greater").pvalue
    return (f"{len(p):>5} {int((p <= 0.05).sum()):>4} ({0.05 * len(p):4.1f}) {int((p <= 0.01).sum()):>4} "
            f"({0.01 * len(p):4.2f}) {ks:>9.3g} {min(log10_ps):>8.2f}")


def label(rule: str) -> str:
    return "now" if rule == "screened" else rule


def pair_log10_ps(kind: str, seed: int, rules: list[str]) -> dict[str, list[float]]:
    """log10 p of every pair of the kind's null zoo of this seed, by statistic (each rule's label; 'format 1' for
    plain)."""
    zoo = null_zoo(CACHE, kind, seed)
    prints = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
    pairs = zoo.pairs(dependent=False)
    out = {label(rule): [compare_fingerprints(prints[a], prints[b], rule=rule).log10_p for a, b in pairs]
           for rule in rules}
    if kind in PLAIN_KINDS:
        old = {m: format1_views(zoo[m].path) for m in zoo.ids}
        out["format 1"] = [log10_fisher([phi_match(x.gate, x.up, y.gate, y.up).log10_p
                                         for x, y in zip(old[a], old[b], strict=True)]) for a, b in pairs]
    return out


def _unit_rows(views: np.ndarray) -> np.ndarray:
    rows = np.asarray(views, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def coupling(blocks_a: list[MLPActivations], blocks_b: list[MLPActivations]) -> list[float]:
    """Per block: Pearson correlation, over every (unit of A, unit of B), of their view-1 and view-2 cosines."""
    out = []
    for x, y in zip(blocks_a, blocks_b, strict=True):
        first = _unit_rows(x.gate) @ _unit_rows(y.gate).T
        second = _unit_rows(x.up) @ _unit_rows(y.up).T
        out.append(float(np.corrcoef(first.ravel(), second.ravel())[0, 1]))
    return out


def coupling_rows(kind: str, seed: int) -> list[str]:
    """The mean coupling per block over the kind's pairs, for each statistic's views (dense MLPs only)."""
    zoo = null_zoo(CACHE, kind, seed)
    views = {"now": {m: [b[0] for b in fingerprint_model(zoo[m].path).blocks] for m in zoo.ids}}
    if kind in PLAIN_KINDS:
        views["format 1"] = {m: format1_views(zoo[m].path) for m in zoo.ids}
    rows = []
    for statistic, by_model in views.items():
        per_pair = np.array([coupling(by_model[a], by_model[b]) for a, b in zoo.pairs(dependent=False)])
        rows.append(f"{kind:<9} {statistic:<9} {seed:>4}  coupling per block " +
                    " ".join(f"{v:+.3f}" for v in per_pair.mean(axis=0)) + f"  (sd over pairs {per_pair.std():.3f})")
    return rows


def power(kind: str, seed: int, rules: list[str]) -> list[str]:
    """log10 p of fine-tunes of the kind's first model against it, by each rule."""
    zoo = null_zoo(CACHE, kind, seed)
    base = zoo.ids[0]
    parent, base_print = load(zoo[base].path), fingerprint_model(zoo[base].path)
    rows = []
    for name, steps, lr in FINE_TUNES:
        child, log = finetune(parent, MarkovLanguage(seed=4242, vocab_size=parent.config.vocab_size),
                              TrainSpec(steps, lr, data_seed=7))
        with tempfile.TemporaryDirectory() as folder, no_progress_bars():
            child.save_pretrained(folder)
            child_print = fingerprint_model(folder)
        for rule in rules:
            result = compare_fingerprints(base_print, child_print, rule=rule)
            rows.append(f"{kind:<9} {seed:>4}  {name:<22} {rule:<6} loss {log.initial_loss:.2f} -> "
                        f"{log.final_loss:.2f}  log10 p {result.log10_p:8.1f}  blocks "
                        + " ".join(f"{b.log10_p:.0f}" for b in result.layers))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--kinds", nargs="+", default=list(NULL_KINDS), choices=NULL_KINDS)
    parser.add_argument("--coupling", action="store_true")
    parser.add_argument("--power", action="store_true")
    parser.add_argument("--rules", nargs="+", choices=MATCHING_RULES, default=["screened"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'kind':<9} {'statistic':<9} {'seed':>6} {'pairs':>5} {'<=.05':>4} (exp) {'<=.01':>4} (exp)  "
          f"{'KS 1-sided':>9} {'min lg p':>8}")
    for kind in args.kinds:
        pooled: dict[str, list[float]] = {}
        for seed in args.seeds:
            for statistic, values in pair_log10_ps(kind, seed, args.rules).items():
                pooled.setdefault(statistic, []).extend(values)
                print(f"{kind:<9} {statistic:<9} {seed:>6} {summary(values)}", flush=True)
        if len(args.seeds) > 1:
            for statistic, values in pooled.items():
                print(f"{kind:<9} {statistic:<9} {'all':>6} {summary(values)}", flush=True)
    if args.coupling:
        for kind, seed in itertools.product((k for k in args.kinds if k != "mixtral"), args.seeds):
            print("\n".join(coupling_rows(kind, seed)), flush=True)
    if args.power:
        for kind, seed in itertools.product(args.kinds, args.seeds):
            print("\n".join(power(kind, seed, args.rules)), flush=True)


if __name__ == "__main__":
    main()
