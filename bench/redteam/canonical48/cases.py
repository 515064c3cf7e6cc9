"""canonical48 red-team cases (see README.md).

near-silent units: the DEAD bar is 1e-6 of the median unit size |w| |r| |k|^degree, the median over units that are
not *exactly* silent on the canonical tokens.  For a non-homogeneous activation (SiLU, GELU: degree 0) the gate row's
length does not enter the size.  A unit with a gate row of length ~1e-20 (SiLU(1e-20 z) = 5e-21 z != 0, so it is not
silent) and up row / output column each LOUD^0.5 times the real units' writes ~1e-20 * LOUD of a real unit: nothing.
Append FACTOR * h of them and the median is theirs; every real unit falls below the bar.

Usage: PYTHONPATH=. HUBTRACE_TEST_CACHE=... python -m bench.redteam.canonical48.cases [case ...] [--threads N]
       [--dtype bfloat16|float16]
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
WORK = Path("/tmp/canonical48")
RESULTS = Path(__file__).with_name("results.jsonl")
DTYPE = torch.float32


def near_silent(factor: float = 1.5, loud: float = 1e8, gate_len: float = 1e-20, twins: bool = False):
    """Append round(factor*h) units (as twin pairs if ``twins``) of size ~loud x the median real unit's, with gate /
    input rows of length ``gate_len`` (relative to the median real gate row) and no bias."""

    def disguise(model, generator):
        plain = adv._plain(model)

        def change(w: SiteWeights, degree) -> SiteWeights:
            if degree:
                raise adv.UnsupportedDisguise("homogeneous activation: the gate length counts in the size")
            h, d = w.up.shape
            n = round(factor * h)
            if twins:
                n += n % 2
            up, down = w.up.double(), w.down.double()
            out = down.shape[0]
            write = torch.randn(out, n, dtype=torch.float64, generator=generator)
            write = write / write.norm(dim=0) * down.norm(dim=0).median()
            key = w.gate.double() if not plain else up
            rows = torch.randn(n, d, dtype=torch.float64, generator=generator)
            rows = rows / rows.norm(dim=1, keepdim=True) * key.norm(dim=1).median() * gate_len
            if plain:
                write = write * loud
                if twins:
                    write[:, 1::2] = -write[:, 0::2]
                    rows[1::2] = rows[0::2]
                ups = torch.cat([up, rows])
                downs = torch.cat([down, write], dim=1)
                order = torch.randperm(h + n, generator=generator)
                bias = (
                    None
                    if w.up_bias is None
                    else torch.cat([w.up_bias.double(), torch.zeros(n, dtype=torch.float64)])[order].float()
                )
                return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), up_bias=bias)
            if w.gate_bias is not None or w.up_bias is not None:
                raise adv.UnsupportedDisguise("gated MLPs without biases only")
            reads = torch.randn(n, d, dtype=torch.float64, generator=generator)
            reads = reads / reads.norm(dim=1, keepdim=True) * up.norm(dim=1).median() * loud**0.5
            write = write * loud**0.5
            if twins:
                reads[1::2] = -reads[0::2]
                rows[1::2] = rows[0::2]
                write[:, 1::2] = write[:, 0::2]
            gates = torch.cat([w.gate.double(), rows])
            ups = torch.cat([up, reads])
            downs = torch.cat([down, write], dim=1)
            order = torch.randperm(h + n, generator=generator)
            return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), gate=gates[order].float())

        return adv._transform_sites(
            model, change, width=lambda h: h + round(factor * h) + (round(factor * h) % 2 if twins else 0)
        )

    return disguise


def flip_same_scale(fraction: float = 0.5, scale: float = 1.0):
    """Plain MLP: a random ``fraction`` of units (k, b; w) -> (-k, -b; w), the linear remainder (k x + b) w written by
    (c k, c b; w / c) and (-c k, -c b; -w / c) appended (act(z) - act(-z) = z; c = ``scale``)."""

    def disguise(model, generator):
        def change(w: SiteWeights, degree) -> SiteWeights:
            assert w.gate is None
            h = w.up.shape[0]
            flip = torch.rand(h, generator=generator) < fraction
            idx = torch.nonzero(flip).flatten()
            sign = torch.where(flip, -1.0, 1.0)
            bias = w.up_bias if w.up_bias is not None else torch.zeros(h)
            up = torch.cat([w.up * sign[:, None], scale * w.up[idx], -scale * w.up[idx]])
            b = torch.cat([bias * sign, scale * bias[idx], -scale * bias[idx]])
            down = torch.cat([w.down, w.down[:, idx] / scale, -w.down[:, idx] / scale], 1)
            # pad to a fixed width with units that write nothing (zero column), so the config stays one width
            pad = 2 * h - 2 * idx.numel()
            up = torch.cat([up, w.up[torch.arange(pad) % h]])
            b = torch.cat([b, bias[torch.arange(pad) % h]])
            down = torch.cat([down, torch.zeros(down.shape[0], pad)], 1)
            return SiteWeights(up=up, down=down, up_bias=b if w.up_bias is not None else None)

        return adv._transform_sites(model, change, width=lambda h: 3 * h)

    return disguise


CASES = {
    "flipsame-plain-gelu": ("plain-gelu", lambda: flip_same_scale()),
    "flipsame-plain-relu": ("plain-relu", lambda: flip_same_scale()),
    "flipscaled-plain-gelu": ("plain-gelu", lambda: flip_same_scale(scale=3.0)),
    "nearsilent-gated": ("gated", lambda: near_silent()),
    "nearsilent-plain-gelu": ("plain-gelu", lambda: near_silent()),
    "nearsilent-moe-softmax": ("moe-softmax", lambda: near_silent()),
    "nearsilent-hybrid": ("hybrid", lambda: near_silent()),
    "nearsilent1e7-gated": ("gated", lambda: near_silent(loud=1e7)),
    "nearsilent-twins-gated": ("gated", lambda: near_silent(twins=True)),
    # half precision: fp16 cannot hold 1e-20 rows -> twins with the smallest gate fp16 holds, size 1e7
    "nearsilent-fp16-gated": ("gated", lambda: near_silent(loud=1e7, gate_len=1e-5, twins=True)),
    "nearsilent-fp16-plain-gelu": ("plain-gelu", lambda: near_silent(loud=1e7, gate_len=1e-5, twins=True)),
    # half precision, inexact cancellation (known weakness): each unit split into 2 parts sharing its gate, up rows
    # u/2 + v and u/2 - v with |v| = spread |u| (not exact in the half format), measured for the evidence it costs
    "splitunlike1-gated": ("gated", lambda: adv.split_unlike(parts=2, spread=1.0)),
    "splitunlike3-gated": ("gated", lambda: adv.split_unlike(parts=2, spread=3.0)),
    "splitunlike3x4-gated": ("gated", lambda: adv.split_unlike(parts=4, spread=3.0)),
    "splitunlike3-plain-gelu": ("plain-gelu", lambda: adv.split_unlike(parts=2, spread=3.0, differ="writes")),
    # reads and writes both differ (3 parts: (k, r/2+v, w+e), (k, r/2-v, w-e), (k, v, -2e)): the half-precision
    # rounding of the parts leaves a rank-2 residue, kept as a small unit
    "splitboth1-gated": ("gated", lambda: adv.split_unlike(parts=3, spread=1.0, differ="both")),
    "splitboth3-gated": ("gated", lambda: adv.split_unlike(parts=3, spread=3.0, differ="both")),
    "splitboth0.5-gated": ("gated", lambda: adv.split_unlike(parts=3, spread=0.5, differ="both")),
    "splitboth0.5x2-gated": (
        "gated",
        lambda: adv.compose(
            adv.split_unlike(parts=3, spread=0.5, differ="both"), adv.split_unlike(parts=3, spread=0.5, differ="both")
        ),
    ),
    "splitboth0.5x3-gated": ("gated", lambda: adv.compose(*[adv.split_unlike(parts=3, spread=0.5, differ="both")] * 3)),
    "splitboth0.25x2-gated": (
        "gated",
        lambda: adv.compose(*[adv.split_unlike(parts=3, spread=0.25, differ="both")] * 2),
    ),
    "splitboth0.25x3-gated": (
        "gated",
        lambda: adv.compose(*[adv.split_unlike(parts=3, spread=0.25, differ="both")] * 3),
    ),
}
EXTRA: dict = {}


def original_of(kind: str):
    if kind == "gated":
        m = AutoModelForCausalLM.from_pretrained(GATED).eval()
        folder = GATED
    else:
        k = next(x for x in KINDS if x.name == kind)
        m = trained_model(k, 1)
        folder = save(m, WORK / kind / "original")
    cost = None
    if DTYPE != torch.float32:
        full = m
        m = copy.deepcopy(m).to(DTYPE)
        folder = save(m, WORK / kind / f"original-{DTYPE}".replace("torch.", ""))
        m = m.float()
        cost = adv.max_logit_change(full, m, probe_ids(full))
    return m, folder, cost


def run(name: str, threads: int, cases=None):
    torch.set_num_threads(threads)
    kind, build = (cases or CASES)[name]
    original, folder, cost = original_of(kind)
    t0 = time.time()
    row = {"case": name, "kind": kind, "threads": threads, "storage": str(DTYPE).replace("torch.", "")}
    try:
        copy_model = build()(copy.deepcopy(original), torch.Generator().manual_seed(7))
    except adv.UnsupportedDisguise as exc:
        row["unsupported"] = str(exc)
        print(json.dumps(row))
        return row
    if DTYPE != torch.float32:
        copy_model = copy_model.to(DTYPE).float()  # measured as the stored half values, in float32 compute
        row["rounding_cost"] = float(f"{cost:.3g}")
    row["max_logit_change"] = float(f"{adv.max_logit_change(original, copy_model, probe_ids(original)):.3g}")
    if DTYPE != torch.float32:
        copy_model = copy_model.to(DTYPE)
    out = save(copy_model, WORK / kind / f"copy-{name}-{row['storage']}")
    fa, fb = fingerprint_model(folder), fingerprint_model(out)
    fwd, bwd = compare_fingerprints(fa, fb), compare_fingerprints(fb, fa)

    def p(r):
        return None if r.log10_p is None else round(float(r.log10_p), 2)

    row.update(
        forward=p(fwd),
        backward=p(bwd),
        verdict_forward=fwd.verdict()[:160],
        units_original=fa.meta.summaries.get("canonical_units"),
        units_copy=fb.meta.summaries.get("canonical_units"),
        seconds=round(time.time() - t0, 1),
    )
    dependent = all(r.cannot_test is None and r.log10_p is not None and r.log10_p <= -20 for r in (fwd, bwd))
    row["exact"] = row["max_logit_change"] <= (1e-4 if DTYPE == torch.float32 else row["rounding_cost"])
    row["dependent_both_orders"] = dependent
    row["breaks_claim"] = row["exact"] and not dependent
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    DTYPE = dtype or DTYPE
    for name in names or list(CASES):
        run(name, threads)
