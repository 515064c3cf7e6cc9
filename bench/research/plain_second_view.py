"""Research (issue 43, goal 4): a second view for plain MLPs that is valid on trained nulls AND costly to push.

A plain unit i (GPT-2 / GPT-NeoX layout) is (w_i, b_i, d_i): fc row, bias, proj column. Everything the test can read
of it is a function of those and of frames the model defines (the MLP input x and the residual stream s on the
canonical tokens). This script computes candidate views of every unit as differentiable functions of one block's
(x, s, w, b, d), and measures, per candidate view pair:

* ``null``: on the trained plain null zoos (tests/null_support.py, 28 independent pairs per zoo), the pair's log10 p
  (Spearman between the two views' matchings, exact assignment, Fisher over the 4 blocks; a candidate with several
  view pairs takes the smallest p times their number, Bonferroni), the one-sided KS p against uniform, the count at
  p <= 0.01 (bound 3) and the coupling (correlation of the two views' A-by-B cosine matrices, mean over pairs and
  blocks; 0 is what the null needs).
* ``attack``: the adaptive attack of tests/fixtures/adaptive.py (KL to the original on its language + weight * mean
  cos^2 of the pushed views with the original's), pushing the views named by ``--push``; per weight it prints the KL
  paid, every candidate view's cos^2 with the original after the attack, and every candidate's log10 p of original
  against the (permuted) copy.

View names (each block, canonical tokens of seed 0): z the fc pre-activation (the product's view 1); r the raw
write read-back s d_i; e r less its prediction from z by one shared linear map (the product's second view); e<k> r
less the rank-k part of that prediction (reduced-rank regression: k = 0 is r, k = 65 is e); rdec r less its
projection on the unit's own z (one coefficient per unit, as the gated version 2 decouples up from gate); rdec<k>
both; f, f<k> z less what r predicts (full, rank k); zdec z less its projection on r; ztop<k>/zlow<k> the read on the
top-k principal directions of x / on the rest (bias with the top part); zodd/zeven the read on x's principal
directions of odd / even rank (each half of the variance; no bias); z3a/b/c the same dealt in three; rtop/rlow,
rodd/reven the same splits of the write on the stream's principal directions.

The statistic here is the research one (no canonical form, no duplicate screen, exact matching): a stricter test of
validity than the product's screened rule, the same matchings on a copy. It reads the null zoos from
HUBTRACE_TEST_CACHE.

    python bench/research/plain_second_view.py null --kinds gpt2 gpt_neox --seeds 0 1 2 [--candidates ...]
    python bench/research/plain_second_view.py attack --kind gpt2 --push z r --weights 0.01 0.1 1
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment
from scipy.stats import kstest
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.inputs import canonical_inputs  # noqa: E402
from scanner.quiet import no_progress_bars  # noqa: E402
from scanner.reading.activations import unpredicted  # noqa: E402
from scanner.reading.architectures.module_tree import decoder_stack  # noqa: E402
from scanner.reading.architectures.norms import mean_free, norms_remove_mean  # noqa: E402
from scanner.reading.architectures.sites import find_sites, site_weights  # noqa: E402
from scanner.stats.logp import log10_fisher, log10_matching_p  # noqa: E402
from scanner.stats.matching import spearman, unit_rows_tensor  # noqa: E402
from scanner.zoo.languages import MarkovLanguage  # noqa: E402
from tests.fixtures.adaptive import attack  # noqa: E402
from tests.null_support import null_zoo  # noqa: E402

CACHE = Path(os.environ.get("HUBTRACE_TEST_CACHE") or ROOT / ".hubtrace-cache")


@dataclass
class Block:
    """One plain MLP block on the canonical tokens: its input x (T, d), the residual stream s (T, d; mean-free where
    the block's norms remove the mean, rows at unit length, as the fingerprint reads it), fc rows w (h, d), bias b
    (h,), proj columns d as rows (h, d); and the next block's fc rows and input where there is one."""

    x: torch.Tensor
    s: torch.Tensor
    w: torch.Tensor
    b: torch.Tensor
    d: torch.Tensor


def blocks_of(model: torch.nn.Module, ids: torch.Tensor) -> list[Block]:
    """Every block's `Block`, carrying gradients to the weights when they require them."""
    stack = decoder_stack(model)
    captured: dict[tuple[int, str], torch.Tensor] = {}
    hooks, sites = [], []

    def keep(key):
        def hook(_m, args, kwargs):
            if key not in captured:
                captured[key] = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))
        return hook

    for index, layer in enumerate(stack.layers):
        (site,) = find_sites(layer)
        sites.append((index, layer, site))
        hooks.append(layer.register_forward_pre_hook(keep((index, "stream")), with_kwargs=True))
        hooks.append(layer.get_submodule(site.input_modules[0]).register_forward_pre_hook(keep((index, "x")),
                                                                                           with_kwargs=True))
    try:
        model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    out = []
    for index, layer, site in sites:
        x = captured[(index, "x")].reshape(-1, captured[(index, "x")].shape[-1]).double()
        s = captured[(index, "stream")].reshape(-1, x.shape[-1]).float()
        if norms_remove_mean(layer, s.shape[-1]):
            s = mean_free(s)
        s = s.double()
        s = s / torch.linalg.vector_norm(s, dim=1, keepdim=True).clamp_min(1e-30)
        (w,) = site_weights(layer, site, trainable=True)
        out.append(Block(x=x, s=s, w=w.up.double(), b=w.up_bias.double(), d=w.down.T.double()))
    return out


# ---- candidate views: (units, tokens) float64, each a function of one block -------------------------------------

def _u(rows: torch.Tensor) -> torch.Tensor:
    return unit_rows_tensor(rows)


def _perunit_less(target: torch.Tensor, by: torch.Tensor) -> torch.Tensor:
    t, g = _u(target), _u(by)
    return t - (t * g).sum(dim=1, keepdim=True) * g


def _reduced_rank_less(target: torch.Tensor, by: torch.Tensor, rank: int) -> torch.Tensor:
    """target rows less their best rank-``rank`` linear prediction from ``by``'s rows (one map for all units)."""
    y, x = _u(target), _u(by)
    fitted = y - unpredicted(y, x)
    if rank <= 0:
        return y
    # the subspace held fixed for the gradient (the SVD of a rank-deficient
    # matrix has no finite one); the attack re-reads it every step
    _, _, vh = torch.linalg.svd(fitted.detach(), full_matrices=False)
    basis = vh[:rank].T
    return y - fitted @ basis @ basis.T


def _principal(frame: torch.Tensor, k: int) -> torch.Tensor:
    """The top-k right singular vectors (d, k) of a (T, d) frame: a subspace the model defines, rotation-covariant."""
    _, _, vh = torch.linalg.svd(frame, full_matrices=False)
    return vh[:k].T


def z_view(bk: Block) -> torch.Tensor:
    return (bk.x @ bk.w.T + bk.b).T


def r_view(bk: Block) -> torch.Tensor:
    return (bk.s @ bk.d.T).T


def _split(k: int, top: bool) -> Callable[[Block], torch.Tensor]:
    def view(bk: Block) -> torch.Tensor:
        v = _principal(bk.x, k)
        part = bk.x @ v @ v.T if top else bk.x - bk.x @ v @ v.T
        return (part @ bk.w.T + (bk.b if top else 0.0)).T
    return view


def _write_split(k: int, top: bool) -> Callable[[Block], torch.Tensor]:
    def view(bk: Block) -> torch.Tensor:
        v = _principal(bk.s, k)
        part = bk.s @ v @ v.T if top else bk.s - bk.s @ v @ v.T
        return (part @ bk.d.T).T
    return view


def _interleaved(frame_of: Callable[[Block], torch.Tensor], rows_of: Callable[[Block], torch.Tensor], parity: int,
                 parts: int = 2) -> Callable[[Block], torch.Tensor]:
    """A unit's read (or write) on the frame's principal directions of rank = parity mod ``parts`` only: the frame's
    spectrum dealt out in turn, so each part holds about 1/parts of its variance (and of what moving it costs)."""
    def view(bk: Block) -> torch.Tensor:
        frame = frame_of(bk)
        _, _, vh = torch.linalg.svd(frame.detach(), full_matrices=False)
        v = vh[parity::parts].T
        return (frame @ v @ v.T @ rows_of(bk).T).T
    return view


VIEWS: dict[str, Callable[[Block], torch.Tensor]] = {
    "z": z_view,
    "r": r_view,
    "e": lambda bk: unpredicted(_u(r_view(bk)), _u(z_view(bk))),  # the product's second view
    "f": lambda bk: unpredicted(_u(z_view(bk)), _u(r_view(bk))),  # read less what the write predicts
    "rdec": lambda bk: _perunit_less(r_view(bk), z_view(bk)),
    "zdec": lambda bk: _perunit_less(z_view(bk), r_view(bk)),
    "e1": lambda bk: _reduced_rank_less(r_view(bk), z_view(bk), 1),
    "e4": lambda bk: _reduced_rank_less(r_view(bk), z_view(bk), 4),
    "e8": lambda bk: _reduced_rank_less(r_view(bk), z_view(bk), 8),
    "e16": lambda bk: _reduced_rank_less(r_view(bk), z_view(bk), 16),
    "e32": lambda bk: _reduced_rank_less(r_view(bk), z_view(bk), 32),
    "rdec2": lambda bk: _perunit_less(_reduced_rank_less(r_view(bk), z_view(bk), 2), z_view(bk)),
    "rdec4": lambda bk: _perunit_less(_reduced_rank_less(r_view(bk), z_view(bk), 4), z_view(bk)),
    "rdec8": lambda bk: _perunit_less(_reduced_rank_less(r_view(bk), z_view(bk), 8), z_view(bk)),
    "f4": lambda bk: _reduced_rank_less(z_view(bk), r_view(bk), 4),
    "f8": lambda bk: _reduced_rank_less(z_view(bk), r_view(bk), 8),
    "f16": lambda bk: _reduced_rank_less(z_view(bk), r_view(bk), 16),
    "ztop8": _split(8, True), "zlow8": _split(8, False),
    "ztop32": _split(32, True), "zlow32": _split(32, False),
    "zodd": _interleaved(lambda bk: bk.x, lambda bk: bk.w, 0),
    "zeven": _interleaved(lambda bk: bk.x, lambda bk: bk.w, 1),
    "rodd": _interleaved(lambda bk: bk.s, lambda bk: bk.d, 0),
    "reven": _interleaved(lambda bk: bk.s, lambda bk: bk.d, 1),
    "z3a": _interleaved(lambda bk: bk.x, lambda bk: bk.w, 0, 3),
    "z3b": _interleaved(lambda bk: bk.x, lambda bk: bk.w, 1, 3),
    "z3c": _interleaved(lambda bk: bk.x, lambda bk: bk.w, 2, 3),
    "rtop8": _write_split(8, True), "rlow8": _write_split(8, False),
    "rtop32": _write_split(32, True), "rlow32": _write_split(32, False),
}

#: Candidate statistics: name -> the view pairs whose matchings are compared (Bonferroni over pairs).
CANDIDATES: dict[str, tuple[tuple[str, str], ...]] = {
    "z-e (product)": (("z", "e"),),
    "z-r (raw write)": (("z", "r"),),
    "z-rdec": (("z", "rdec"),),
    "zdec-r": (("zdec", "r"),),
    "f-r": (("f", "r"),),
    "f-e": (("f", "e"),),
    "z-e1": (("z", "e1"),),
    "z-e4": (("z", "e4"),),
    "z-e8": (("z", "e8"),),
    "z-e16": (("z", "e16"),),
    "z-e32": (("z", "e32"),),
    "z-rdec + zdec-r": (("z", "rdec"), ("zdec", "r")),
    "z-rdec2": (("z", "rdec2"),),
    "z-rdec4": (("z", "rdec4"),),
    "z-rdec8": (("z", "rdec8"),),
    "z-rdec + z-e16": (("z", "rdec"), ("z", "e16")),
    "f4-r": (("f4", "r"),),
    "f8-r": (("f8", "r"),),
    "f16-r": (("f16", "r"),),
    "z-e8 + f8-r": (("z", "e8"), ("f8", "r")),
    "ztop8-zlow8": (("ztop8", "zlow8"),),
    "ztop32-zlow32": (("ztop32", "zlow32"),),
    "zodd-zeven": (("zodd", "zeven"),),
    "rodd-reven": (("rodd", "reven"),),
    "zodd-reven": (("zodd", "reven"),),
    "z-split + r-split": (("zodd", "zeven"), ("rodd", "reven")),
    "z 3-split": (("z3a", "z3b"), ("z3a", "z3c"), ("z3b", "z3c")),
    "rtop8-rlow8": (("rtop8", "rlow8"),),
    "rtop32-rlow32": (("rtop32", "rlow32"),),
    "z-e + f-r": (("z", "e"), ("f", "r")),
}


@torch.no_grad()
def model_views(model: torch.nn.Module, ids: torch.Tensor, names: list[str]) -> list[dict[str, np.ndarray]]:
    """Per block: view name -> unit rows (units, tokens) float32."""
    return [{n: _u(VIEWS[n](bk)).float().numpy() for n in names} for bk in blocks_of(model, ids)]


def matching(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The exact MATCH of A's units to B's (equal widths): b index of each a unit."""
    rows, cols = linear_sum_assignment(a @ b.T, maximize=True)
    out = np.empty(a.shape[0], dtype=int)
    out[rows] = cols
    return out


def pair_stats(va: list[dict[str, np.ndarray]], vb: list[dict[str, np.ndarray]],
               candidates: dict[str, tuple[tuple[str, str], ...]]) -> tuple[dict[str, float], dict[str, float]]:
    """(candidate -> log10 p over blocks, candidate -> mean coupling of its first view pair over blocks)."""
    per_block: dict[str, list[float]] = {c: [] for c in candidates}
    couple: dict[str, list[float]] = {c: [] for c in candidates}
    for a, b in zip(va, vb, strict=True):
        names = sorted({n for pairs in candidates.values() for pair in pairs for n in pair})
        matched = {n: matching(a[n], b[n]) for n in names}
        cos = {n: (a[n] @ b[n].T).ravel() for n in names}
        for c, pairs in candidates.items():
            logs = [log10_matching_p(spearman(matched[i].astype(float), matched[j].astype(float)), a[i].shape[0])
                    for i, j in pairs]
            per_block[c].append(min(0.0, min(logs) + math.log10(len(pairs))))
            i, j = pairs[0]
            couple[c].append(float(np.corrcoef(cos[i], cos[j])[0, 1]))
    return ({c: log10_fisher(v) for c, v in per_block.items()}, {c: float(np.mean(v)) for c, v in couple.items()})


def load(path: Path) -> torch.nn.Module:
    with no_progress_bars():
        return AutoModelForCausalLM.from_pretrained(path).double().eval()


def canonical_ids(model: torch.nn.Module, seed: int = 0) -> torch.Tensor:
    from scanner.fingerprints.inputs import InputSpec
    return torch.from_numpy(canonical_inputs(model.config.vocab_size, InputSpec(seed=seed)).ids)


def run_null(args: argparse.Namespace) -> None:
    candidates = {c: CANDIDATES[c] for c in (args.candidates or CANDIDATES)}
    names = sorted({n for pairs in candidates.values() for pair in pairs for n in pair})
    print(f"{'kind':<9} {'seed':>4} {'candidate':<16} {'coupling':>8} {'<=.05':>5} {'<=.01':>5} {'KS 1-sided':>10} "
          f"{'min lg p':>8}")
    for kind in args.kinds:
        for seed in args.seeds:
            zoo = null_zoo(CACHE, kind, seed)
            views = {}
            for m in zoo.ids:
                model = load(zoo[m].path)
                views[m] = model_views(model, canonical_ids(model), names)
            logs: dict[str, list[float]] = {c: [] for c in candidates}
            couples: dict[str, list[float]] = {c: [] for c in candidates}
            for a, b in zoo.pairs(dependent=False):
                lp, cp = pair_stats(views[a], views[b], candidates)
                for c in candidates:
                    logs[c].append(lp[c])
                    couples[c].append(cp[c])
            for c in candidates:
                p = 10.0 ** np.asarray(logs[c])
                ks = kstest(p, "uniform", alternative="greater").pvalue
                print(f"{kind:<9} {seed:>4} {c:<16} {np.mean(couples[c]):>+8.3f} {int((p <= 0.05).sum()):>5} "
                      f"{int((p <= 0.01).sum()):>5} {ks:>10.3g} {min(logs[c]):>8.2f}", flush=True)


def research_reader(names: list[str]) -> Callable[[torch.nn.Module, torch.Tensor], dict]:
    """The research views ``names`` of every block, as tests.fixtures.adaptive.attack reads views to push."""
    def read(model: torch.nn.Module, ids: torch.Tensor) -> dict[tuple[str, int, int], torch.Tensor]:
        return {(n, index, 0): VIEWS[n](bk) for index, bk in enumerate(blocks_of(model, ids)) for n in names}

    return read


def run_attack(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    zoo = null_zoo(CACHE, args.kind, args.seed)
    first = zoo["indie-00/solo-00"]
    language = MarkovLanguage(first.details["training"]["language_seed"], vocab_size=256)
    original = load(first.path).float()
    ids = canonical_ids(original)
    candidates = {c: CANDIDATES[c] for c in (args.candidates or CANDIDATES)}
    names = sorted({n for pairs in candidates.values() for pair in pairs for n in pair} | set(args.push))
    base = model_views(original, ids, names)
    print(f"# {args.kind} seed {args.seed}: push {args.push}, {args.steps} steps at lr {args.lr:g}")
    for weight in args.weights:
        started = time.perf_counter()
        copy = attack(original, lambda g: language.sample(8, 64, g), ids, weight=weight, views=args.push,
                      steps=args.steps, lr=args.lr, read=research_reader(names))
        lp, _ = pair_stats(base, model_views(copy.model, ids, names), candidates)
        print(f"weight {weight:g}  KL {copy.kl:.4f}  ({time.perf_counter() - started:.0f} s)")
        print("  cos2 " + " ".join(f"{n} {copy.agreement[n]:.3f}" for n in names))
        print("  log10 p " + "; ".join(f"{c} {v:.1f}" for c, v in lp.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    null = sub.add_parser("null")
    null.add_argument("--kinds", nargs="+", default=["gpt2", "gpt_neox"])
    null.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    null.add_argument("--candidates", nargs="+", choices=list(CANDIDATES))
    att = sub.add_parser("attack")
    att.add_argument("--kind", default="gpt2")
    att.add_argument("--seed", type=int, default=0)
    att.add_argument("--push", nargs="+", default=["z", "e"], choices=list(VIEWS))
    att.add_argument("--weights", type=float, nargs="+", default=[0.01, 0.1, 1.0])
    att.add_argument("--steps", type=int, default=300)
    att.add_argument("--lr", type=float, default=1e-3)
    att.add_argument("--candidates", nargs="+", choices=list(CANDIDATES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    run_null(args) if args.command == "null" else run_attack(args)


if __name__ == "__main__":
    main()
