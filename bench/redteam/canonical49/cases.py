"""canonical49 red-team cases (see README.md).

null-split + decoy leaders (plain MLPs behind a LayerNorm):
  LayerNorm's output x satisfies x . (1/g) = beta . (1/g) for every token, so a plain unit (k, b; w) computes exactly
  the same function as (k + c u, b - c u.beta; w) for any c (u = (1/g)/|1/g|).  Split every unit into n parts with
  c in CS (times |k|), each writing w/n: all parts compute one function (pre-activation cosine 1 on the inputs), so the
  canonical form would join them -- but groups are bounded and led in order of mass.  For each part add a *decoy*
  pair (L, bL; w') and (L, bL; -w'), which cancel exactly, with L at stored cosine 0.96 to the part (same length,
  offset orthogonal to span(k, u)) and a column LOUD x the layer's largest: the decoy leads, takes its part (stored
  cosine >= SAME_GATE_COSINE) and nothing else (the other parts are > 5% longer/shorter or at |cos| < 0.95; the decoy's
  pre-activation is far from the unit's).  Each group's sum is w/n: a live canonical unit with the unit's write, key
  the mass-weighted mean direction (~ the decoy's).  So every real unit becomes n canonical units with identical
  write (and plain second view) and different gate views.

decoy (gated, no null direction): one decoy twin pair (k_L, +-v, w') per unit at stored cosine 0.96, offset along the
  inputs' largest direction; the real unit's canonical gate becomes ~ the decoy's.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from bench.redteam.case_cli import case_arguments
from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import SiteWeights, find_sites, site_weights
from tests.adversary_support import KINDS, probe_ids, save, trained_model
from tests.fixtures import adversary as adv

CACHE = Path("/work/main/.hubtrace-cache")
GATED = CACHE / "zoo/aurora-labs/aurora-base"
WORK = Path("/tmp/canonical49")
RESULTS = Path(__file__).with_name("results.jsonl")
DTYPE = torch.float32


def _mlp_norm(layer):
    for name in ("ln_2", "post_attention_layernorm"):
        if hasattr(layer, name):
            return getattr(layer, name)
    raise adv.UnsupportedDisguise("no MLP norm found")


def _orth(vec, basis):
    for b in basis:
        bn = b / b.norm()
        vec = vec - (vec @ bn) * bn
    return vec


def _rebuild_sites(model, per_layer_change, width):
    for i, layer in enumerate(decoder_stack(model).layers):
        for site in find_sites(layer):
            adv._write_site(layer, site, [per_layer_change(i, layer, w) for w in site_weights(layer, site)])
    return adv._rebuilt(model, {key: width for key in adv.WIDTH_KEYS})


def null_split(cs=(0.0, 1.0, -1.0, 4.0, -4.0), cosine=0.96, loud=2.0, decoys=True, shuffle=True):
    n = len(cs)
    per = 3 if decoys else 1

    def disguise(model, generator):
        def change(i, layer, w: SiteWeights) -> SiteWeights:
            assert w.gate is None
            norm = _mlp_norm(layer)
            g, beta = norm.weight.double(), norm.bias.double()
            u = 1.0 / g
            u = u / u.norm()
            up, down = w.up.double(), w.down.double()
            h, d = up.shape
            bias = w.up_bias.double() if w.up_bias is not None else torch.zeros(h, dtype=torch.float64)
            big = down.norm(dim=0).max() * loud
            keys, biases, cols = [], [], []
            for j in range(h):
                k, b = up[j], bias[j]
                for c in cs:
                    a = k + c * k.norm() * u
                    ab = b - c * k.norm() * (u @ beta)
                    keys.append(a)
                    biases.append(ab)
                    cols.append(down[:, j] / n)
                    if decoys:
                        full = torch.cat([a, ab[None]])
                        e = torch.randn(d, dtype=torch.float64, generator=generator)
                        e = _orth(e, [k, u, a])
                        e = torch.cat([e, torch.zeros(1, dtype=torch.float64)])
                        tan = math.sqrt(1 / cosine**2 - 1)
                        e = e / e.norm() * tan * full.norm()
                        lf = (full + e) * (full.norm() / (full + e).norm())
                        col = torch.randn(down.shape[0], dtype=torch.float64, generator=generator)
                        col = col / col.norm() * big
                        keys += [lf[:d], lf[:d]]
                        biases += [lf[d], lf[d]]
                        cols += [col, -col]
            K = torch.stack(keys)
            B = torch.stack(biases)
            W = torch.stack(cols, dim=1)
            order = torch.randperm(K.shape[0], generator=generator) if shuffle else torch.arange(K.shape[0])
            return SiteWeights(
                up=K[order].float(),
                down=W[:, order].float(),
                up_bias=B[order].float() if w.up_bias is not None else None,
            )

        return _rebuild_sites(model, change, width=lambda hh: hh * n * per)

    return disguise


def decoy_gated(cosine=0.96, loud=2.0, along="random"):
    """Gated: per unit a decoy twin pair (k_L, v, w'), (k_L, -v, w') with k_L at stored cosine ``cosine`` to k_A."""

    def disguise(model, generator):
        def change(i, layer, w: SiteWeights) -> SiteWeights:
            gate, up, down = w.gate.double(), w.up.double(), w.down.double()
            h, d = gate.shape
            mass = down.norm(dim=0) * up.norm(dim=1)
            big = float(mass.max()) * loud
            gates, ups, cols = [gate], [up], [down]
            tan = math.sqrt(1 / cosine**2 - 1)
            common = torch.randn(d, dtype=torch.float64, generator=generator)
            for j in range(h):
                k = gate[j]
                e = common.clone() if along == "common" else torch.randn(d, dtype=torch.float64, generator=generator)
                e = _orth(e, [k])
                e = e / e.norm() * tan * k.norm()
                kl = (k + e) * (k.norm() / (k + e).norm())
                v = torch.randn(d, dtype=torch.float64, generator=generator)
                v = v / v.norm() * math.sqrt(big)
                col = torch.randn(down.shape[0], dtype=torch.float64, generator=generator)
                col = col / col.norm() * math.sqrt(big)
                gates.append(torch.stack([kl, kl]))
                ups.append(torch.stack([v, -v]))
                cols.append(torch.stack([col, col], 1))
            G = torch.cat(gates)
            U = torch.cat(ups)
            W = torch.cat(cols, 1)
            order = torch.randperm(G.shape[0], generator=generator)
            return SiteWeights(up=U[order].float(), down=W[:, order].float(), gate=G[order].float())

        return _rebuild_sites(model, change, width=lambda hh: hh * 3)

    return disguise


def null_shift_all(times=10.0, jitter=0.0):
    """Every plain unit's input row moved along u = (1/g)/|1/g| (LayerNorm's output never moves along it) by the same
    length C = ``times`` x the layer's longest row, bias compensated: each unit computes exactly what it did, and all
    rows are stored within a small angle of u (and, for C >> |k|, at one length)."""

    def disguise(model, generator):
        def change(i, layer, w: SiteWeights) -> SiteWeights:
            norm = _mlp_norm(layer)
            g, beta = norm.weight.double(), norm.bias.double()
            u = 1.0 / g
            u = u / u.norm()
            up = w.up.double()
            h = up.shape[0]
            bias = w.up_bias.double() if w.up_bias is not None else torch.zeros(h, dtype=torch.float64)
            C = times * float(up.norm(dim=1).max())
            c = C * (1 + jitter * torch.rand(h, dtype=torch.float64, generator=generator))
            K = up + c[:, None] * u[None, :]
            B = bias - c * (u @ beta)
            return SiteWeights(up=K.float(), down=w.down, up_bias=B.float() if w.up_bias is not None else None)

        for i, layer in enumerate(decoder_stack(model).layers):
            for site in find_sites(layer):
                adv._write_site(layer, site, [change(i, layer, w) for w in site_weights(layer, site)])
        return model

    return disguise


def widened_shift_all(times=10.0, extra=4):
    """RMSNorm models: the stream widened by ``extra`` always-zero coordinates (tests/fixtures/null_shift.widened), then
    every gate row moved by the same length C = ``times`` x the layer's longest gate row along the new coordinates
    (which the MLP input never takes): each unit computes exactly what it did; all gate rows are stored within a
    small angle of one another at one length."""

    def disguise(model, generator):
        from tests.fixtures.null_shift import widened

        wide = widened(model, extra)

        def change(w: SiteWeights, _degree) -> SiteWeights:
            k = w.gate.double()
            width = k.shape[1]
            direction = torch.zeros(width, dtype=torch.float64)
            direction[width - extra :] = 1.0 / math.sqrt(extra)
            C = times * float(k.norm(dim=1).max())
            return SiteWeights(up=w.up, down=w.down, gate=(k + C * direction).float())

        return adv._transform_sites(wide, change)

    return disguise


WRITERS = ("o_proj.weight", "down_proj.weight", "out_proj.weight", "experts.down_proj", "w2.weight")


@torch.no_grad()
def widened_any(model, extra: int = 4):
    """tests/fixtures/null_shift.widened for any RMSNorm model whose tensors name their role (Mixtral, Jamba): norms
    of the stream's width get gains x sqrt(d/(d+z)) and one more ones (eps x d/(d+z)); maps that write the stream get
    zero new rows; everything that reads it (or embeds into it) zero new columns."""
    config = copy.deepcopy(model.config)
    d = config.hidden_size
    heads = config.num_attention_heads
    if hasattr(config, "head_dim") or True:
        config.head_dim = getattr(model.config, "head_dim", None) or d // heads
    config.hidden_size = d + extra
    config.rms_norm_eps = model.config.rms_norm_eps * d / (d + extra)
    if hasattr(config, "mamba_expand"):  # Jamba: keep the Mamba inner width and dt rank
        inner = int(model.config.mamba_expand * d)
        assert inner % (d + extra) == 0, "choose extra so that d + extra divides the Mamba width"
        config.mamba_expand = inner // (d + extra)
        config.mamba_dt_rank = math.ceil(d / 16) if model.config.mamba_dt_rank == "auto" else model.config.mamba_dt_rank
    gain = math.sqrt(d / (d + extra))
    out = type(model)(config)
    state = {}
    for name, t in model.state_dict().items():
        t = t.double()
        if t.ndim == 1 and t.shape[0] == d and name.endswith("norm.weight"):
            t = torch.cat([t * gain, torch.ones(extra, dtype=t.dtype)])
        elif name.endswith("experts.down_proj"):  # (E, d, I)
            assert t.shape[1] == d
            t = torch.cat([t, torch.zeros(t.shape[0], extra, t.shape[2], dtype=t.dtype)], dim=1)
        elif name.endswith(WRITERS) and t.ndim == 2 and t.shape[0] == d:
            t = torch.cat([t, torch.zeros(extra, t.shape[1], dtype=t.dtype)])
        elif t.shape[-1] == d and t.ndim >= 2:
            t = torch.cat([t, torch.zeros(*t.shape[:-1], extra, dtype=t.dtype)], dim=-1)
        state[name] = t.float()
    missing, unexpected = out.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all("rotary" in m or "inv_freq" in m for m in missing), missing
    return out.eval()


def widened_shift_any(times=10.0, extra=4):
    def disguise(model, generator):
        wide = widened_any(model, extra)

        def change(w: SiteWeights, _degree) -> SiteWeights:
            k = w.gate.double()
            width = k.shape[1]
            direction = torch.zeros(width, dtype=torch.float64)
            direction[width - extra :] = 1.0 / math.sqrt(extra)
            C = times * float(k.norm(dim=1).max())
            return SiteWeights(up=w.up, down=w.down, gate=(k + C * direction).float())

        return adv._transform_sites(wide, change)

    return disguise


CASES = {
    "nullsplit5-plain-gelu": ("plain-gelu", lambda: null_split()),
    "nullsplit5-plain-relu": ("plain-relu", lambda: null_split()),
    "nullsplit5-nodecoy-plain-gelu": ("plain-gelu", lambda: null_split(decoys=False)),
    "nullsplit3-plain-gelu": ("plain-gelu", lambda: null_split(cs=(0.0, 1.0, -1.0))),
    "nullsplit9-plain-gelu": ("plain-gelu", lambda: null_split(cs=(0.0, 1.0, -1.0, 3.0, -3.0, 8.0, -8.0, 20.0, -20.0))),
    "decoy-gated": ("gated", lambda: decoy_gated()),
    "decoy-common-gated": ("gated", lambda: decoy_gated(along="common")),
}


def original_of(kind: str):
    if kind == "gated":
        m = AutoModelForCausalLM.from_pretrained(GATED).eval()
        folder = GATED
    else:
        k = next(x for x in KINDS if x.name == kind)
        folder = WORK / kind / "original"
        if (folder / "config.json").exists():
            m = AutoModelForCausalLM.from_pretrained(folder).eval()
        else:
            m = trained_model(k, 1)
            save(m, folder)
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
    copy_model = build()(copy.deepcopy(original), torch.Generator().manual_seed(7))
    if DTYPE != torch.float32:
        copy_model = copy_model.to(DTYPE).float()
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
        verdict_backward=bwd.verdict()[:160],
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


CASES.update(
    {
        "widenshift10-moe-dense-first": ("moe-dense-first", lambda: widened_shift_any(10.0)),
        "widen-only-moe-dense-first": ("moe-dense-first", lambda: widened_shift_any(0.0)),
        "widenshift3.5-gated": ("gated", lambda: widened_shift_all(3.5)),
        "widenshift3.5-moe-softmax": ("moe-softmax", lambda: widened_shift_any(3.5)),
        "widenshift4.0-gated": ("gated", lambda: widened_shift_all(4.0)),
        "widenshift5.0-gated": ("gated", lambda: widened_shift_all(5.0)),
        "nullshift2.0-plain-relu": ("plain-relu", lambda: null_shift_all(2.0)),
        "nullshift3.0-plain-relu": ("plain-relu", lambda: null_shift_all(3.0)),
        "widenshift1.0-gated": ("gated", lambda: widened_shift_all(1.0)),
        "widenshift2.0-gated": ("gated", lambda: widened_shift_all(2.0)),
        "widenshift3.0-gated": ("gated", lambda: widened_shift_all(3.0)),
        "nullshift1.0-plain-gelu": ("plain-gelu", lambda: null_shift_all(1.0)),
        "nullshift2.0-plain-gelu": ("plain-gelu", lambda: null_shift_all(2.0)),
        "nullshift3.0-plain-gelu": ("plain-gelu", lambda: null_shift_all(3.0)),
        "widenshift10x192-gated": ("gated", lambda: widened_shift_all(10.0, extra=192)),
        "widenshift10x192-moe-softmax": ("moe-softmax", lambda: widened_shift_any(10.0, extra=192)),
        "widenshift10-moe-softmax": ("moe-softmax", lambda: widened_shift_any(10.0)),
        "widen-only-moe-softmax": ("moe-softmax", lambda: widened_shift_any(0.0)),
        "widenshift10-hybrid": ("hybrid", lambda: widened_shift_any(10.0, extra=64)),
        "widen-only-hybrid": ("hybrid", lambda: widened_shift_any(0.0, extra=64)),
        "widenshift10-gated": ("gated", lambda: widened_shift_all(10.0)),
        "widen-only-gated": ("gated", lambda: widened_shift_all(0.0)),
        "nullshift10-plain-gelu": ("plain-gelu", lambda: null_shift_all(10.0)),
        "nullshift10-plain-relu": ("plain-relu", lambda: null_shift_all(10.0)),
        "nullshift4-plain-gelu": ("plain-gelu", lambda: null_shift_all(4.0)),
        "nullshift100-plain-gelu": ("plain-gelu", lambda: null_shift_all(100.0)),
        "nullsplit9-cos0.99-plain-gelu": (
            "plain-gelu",
            lambda: null_split(cs=(0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0), cosine=0.99),
        ),
        "nullsplit7-angles-plain-relu": (
            "plain-relu",
            lambda: null_split(
                cs=tuple(math.tan(math.radians(a)) for a in (0, 28, -28, 52, -52, 75, -75)), cosine=0.99
            ),
        ),
        "decoy1-plain-gelu": ("plain-gelu", lambda: null_split(cs=(0.0,))),
        "nullsplit5-cos0.99-plain-gelu": ("plain-gelu", lambda: null_split(cosine=0.99)),
        "nullsplit7-plain-relu": ("plain-relu", lambda: null_split(cs=(0.0, 1.0, -1.0, 3.0, -3.0, 6.0, -6.0))),
    }
)


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    DTYPE = dtype or DTYPE
    for name in names or list(CASES):
        run(name, threads)
