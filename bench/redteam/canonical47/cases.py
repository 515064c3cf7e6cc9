"""canonical47 red-team: a float32 checkpoint whose MLP output maps are bfloat16-exact (each float32 output column
written exactly as the sum of 3 bfloat16-exact columns, one unit per part, all sharing the unit's gate and up rows),
so `storage_step` takes bfloat16's step for the cancellation tolerance, while the up rows stay float32: loud twins
(k, v, b1), (k, -v, b1) with |v| = LOUD * |r| cancel to float32 rounding (no noise), yet push the group's true
singular value below 8 * 2^-7 of the bound, so the group (a real unit) is dropped as dead.

Usage: PYTHONPATH=. HUBTRACE_TEST_CACHE=... python -m bench.redteam.canonical47.cases [case ...] [--threads N]
"""
from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from bench.redteam.case_cli import case_arguments
from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.architectures.sites import SiteWeights
from tests.adversary_support import KINDS, probe_ids, save, trained_model
from tests.fixtures import adversary as adv

CACHE = Path("/work/main/.hubtrace-cache")
GATED = CACHE / "zoo/aurora-labs/aurora-base"
WORK = Path("/tmp/canonical47")
RESULTS = Path(__file__).with_name("results.jsonl")


def bf16_parts(w: torch.Tensor, parts: int = 3) -> list[torch.Tensor]:
    """float32 w as an exact sum of `parts` bfloat16-exact float32 tensors."""
    out, rest = [], w.float().clone()
    for _ in range(parts - 1):
        b = rest.to(torch.bfloat16).float()
        out.append(b)
        rest = rest - b  # exact in float32 (Sterbenz-like: b is rest rounded)
    out.append(rest)
    for b in out:
        assert torch.equal(b.to(torch.bfloat16).float(), b), "part not bfloat16-exact"
    return out


def hide(loud: float, fraction: float = 1.0, twins: bool = True, gen_seed: int = 0):
    """Each unit -> 3 bf16-exact write parts (same gate, up); a fraction of units also gets loud cancelling twins."""
    per = 5

    def change(w: SiteWeights, degree):
        assert w.gate is not None, "gated MLPs only"
        g = torch.Generator().manual_seed(gen_seed)
        h = w.up.shape[0]
        hidden_mask = torch.rand(h, generator=g) < fraction
        gates, ups, downs = [], [], []
        for i in range(h):
            k, r, col = w.gate[i], w.up[i], w.down[:, i]
            b = bf16_parts(col, 3)
            for j in range(3):
                gates.append(k)
                ups.append(r)
                downs.append(b[j])
            if twins and hidden_mask[i]:
                v = torch.randn(r.shape, generator=g, dtype=torch.float64)
                v = (v / v.norm() * loud * r.double().norm()).float()
                gates += [k, k]
                ups += [v, -v]
                downs += [b[0], b[0]]
            else:  # keep the width uniform: silent padding of the same unit's parts (zero up row: writes nothing)
                gates += [k, k]
                ups += [torch.zeros_like(r), torch.zeros_like(r)]
                downs += [b[0], b[0]]
        return SiteWeights(up=torch.stack(ups), down=torch.stack(downs, 1), gate=torch.stack(gates))

    def disguise(model, generator):
        return adv._transform_sites(model, change, width=lambda x: x * per)

    return disguise


def hide_plain(loud: float):
    """Plain MLP (act(k x + b) w): each unit -> 3 bf16-exact write parts (same input row and bias) plus twins
    (k, b, u), (k, b, -u), u bf16-exact of length loud * |w|: they cancel exactly in any format."""

    def change(w: SiteWeights, degree):
        assert w.gate is None
        g = torch.Generator().manual_seed(0)
        h = w.up.shape[0]
        ups, biases, downs = [], [], []
        for i in range(h):
            k, col = w.up[i], w.down[:, i]
            bias = None if w.up_bias is None else w.up_bias[i]
            u = torch.randn(col.shape, generator=g, dtype=torch.float64)
            u = (u / u.norm() * loud * col.double().norm()).float().to(torch.bfloat16).float()
            for part in bf16_parts(col, 3) + [u, -u]:
                ups.append(k)
                biases.append(bias)
                downs.append(part)
        return SiteWeights(up=torch.stack(ups), down=torch.stack(downs, 1),
                           up_bias=None if w.up_bias is None else torch.stack(biases))

    def disguise(model, generator):
        return adv._transform_sites(model, change, width=lambda x: x * 5)

    return disguise


def twins_only(loud: float):
    """Half-precision original: each unit kept as stored, plus twins (k, v, w), (k, -v, w) (gated) or (k, b, u),
    (k, b, -u) (plain), |v| = loud |r|; v rounded to the model's dtype so both twins are exact negatives there."""

    def change(w: SiteWeights, degree):
        g = torch.Generator().manual_seed(0)
        h = w.up.shape[0]
        idx = torch.arange(h).repeat_interleave(3)
        if w.gate is not None:
            v = torch.randn(w.up.shape, generator=g, dtype=torch.float64)
            v = v / v.norm(dim=1, keepdim=True) * loud * w.up.double().norm(dim=1, keepdim=True)
            v = v.to(DTYPE).float()
            up = torch.stack([w.up, v, -v], 1).reshape(3 * h, -1)
            return SiteWeights(up=up, down=w.down[:, idx], gate=w.gate[idx],
                               gate_bias=None if w.gate_bias is None else w.gate_bias[idx],
                               up_bias=None if w.up_bias is None
                               else torch.stack([w.up_bias, 0 * w.up_bias, 0 * w.up_bias], 1).reshape(-1))
        u = torch.randn(w.down.T.shape, generator=g, dtype=torch.float64)
        u = (u / u.norm(dim=1, keepdim=True) * loud * w.down.T.double().norm(dim=1, keepdim=True)).to(DTYPE).float()
        down = torch.stack([w.down.T, u, -u], 1).reshape(3 * h, -1).T
        return SiteWeights(up=w.up[idx], down=down, up_bias=None if w.up_bias is None else w.up_bias[idx])

    def disguise(model, generator):
        return adv._transform_sites(model, change, width=lambda x: x * 3)

    return disguise


DTYPE = torch.float32


def split_only():
    return hide(0.0, twins=False)


def original_of(kind: str):
    if kind == "gated":
        m = AutoModelForCausalLM.from_pretrained(GATED).eval()
        folder = GATED
    else:
        k = next(x for x in KINDS if x.name == kind)
        m = trained_model(k, 1)
        folder = save(m, WORK / kind / "original")
    if DTYPE != torch.float32:  # the original rounded to the half format, saved in it; held as float32 values
        full = m
        m = copy.deepcopy(m).to(DTYPE)
        folder = save(m, WORK / kind / f"original-{DTYPE}".replace("torch.", ""))
        m = m.float()
        global ROUNDING_COST
        ROUNDING_COST = adv.max_logit_change(full, m, probe_ids(full))
    return m, folder


ROUNDING_COST = 0.0


CASES = {
    # name: (kind, disguise builder)
    "split3-gated": ("gated", split_only),
    "loud40-all-gated": ("gated", lambda: hide(40.0)),
    "loud40-half-gated": ("gated", lambda: hide(40.0, fraction=0.5)),
    "loud12-all-gated": ("gated", lambda: hide(12.0)),
    "loud12-plain-relu": ("plain-relu", lambda: hide_plain(12.0)),
    "loud12-plain-gelu": ("plain-gelu", lambda: hide_plain(12.0)),
    "loud6-all-gated": ("gated", lambda: hide(6.0)),
    "loud8-all-gated": ("gated", lambda: hide(8.0)),
    "loud40-tenth-gated": ("gated", lambda: hide(40.0, fraction=0.1)),
    "twins6-gated": ("gated", lambda: twins_only(6.0)),
    "twins12-moe-softmax": ("moe-softmax", lambda: twins_only(12.0)),
    "twins12-hybrid": ("hybrid", lambda: twins_only(12.0)),
    "twins12-plain-relu": ("plain-relu", lambda: twins_only(12.0)),
    "twins2e5-gated": ("gated", lambda: twins_only(2e5)),
    "twins1.2e6-gated": ("gated", lambda: twins_only(1.2e6)),
    "twins12-gated": ("gated", lambda: twins_only(12.0)),
    "twins100-gated": ("gated", lambda: twins_only(100.0)),
    "twins12-plain-gelu": ("plain-gelu", lambda: twins_only(12.0)),
    "twins100-plain-gelu": ("plain-gelu", lambda: twins_only(100.0)),
    "loud40-all-moe-softmax": ("moe-softmax", lambda: hide(40.0)),
    "loud40-all-moe-dense-first": ("moe-dense-first", lambda: hide(40.0)),
}


def run(name: str, threads: int):
    torch.set_num_threads(threads)
    kind, build = CASES[name]
    original, folder = original_of(kind)
    t0 = time.time()
    row = {"case": name, "kind": kind, "threads": threads}
    try:
        copy_model = build()(copy.deepcopy(original), torch.Generator().manual_seed(7))
    except adv.UnsupportedDisguise as exc:
        row["unsupported"] = str(exc)
        print(json.dumps(row))
        return row
    row["max_logit_change"] = float(f"{adv.max_logit_change(original, copy_model, probe_ids(original)):.3g}")
    if DTYPE != torch.float32:
        row["storage"] = str(DTYPE)
        row["rounding_cost"] = float(f"{ROUNDING_COST:.3g}")
        row["exact_bits"] = all(torch.equal(t.to(DTYPE).float(), t) for t in copy_model.state_dict().values()
                                if t.is_floating_point())
        copy_model = copy_model.to(DTYPE)
    out = save(copy_model, WORK / kind / f"copy-{name}")
    fa, fb = fingerprint_model(folder), fingerprint_model(out)
    fwd, bwd = compare_fingerprints(fa, fb), compare_fingerprints(fb, fa)
    def p(r):
        return None if r.log10_p is None else round(float(r.log10_p), 2)

    row.update(forward=p(fwd), backward=p(bwd), verdict_forward=fwd.verdict()[:160],
               verdict_backward=bwd.verdict()[:160],
               units_original=fa.meta.summaries.get("canonical_units"),
               units_copy=fb.meta.summaries.get("canonical_units"), seconds=round(time.time() - t0, 1))
    dependent = all(r.cannot_test is None and r.log10_p is not None and r.log10_p <= -20 for r in (fwd, bwd))
    same_counts = [u[0] - u[1] - u[2] for u in fa.meta.summaries["canonical_units"]] == \
                  [u[0] - u[1] - u[2] for u in fb.meta.summaries["canonical_units"]]
    row["exact"] = row["max_logit_change"] <= (1e-4 if DTYPE == torch.float32 else row["rounding_cost"])
    row["dependent_both_orders"] = dependent
    row["same_canonical_count"] = same_counts
    row["breaks_claim"] = row["exact"] and not (dependent and same_counts)
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    DTYPE = dtype or DTYPE
    for name in names or list(CASES):
        run(name, threads)
