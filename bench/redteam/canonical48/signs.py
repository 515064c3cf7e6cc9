"""canonical48: is a plain GELU MLP's sign-free write view (activations.plain_views, `unpredicted_up_to_sign`) bit for
bit unchanged when a copier negates a subset of units' input rows and writes the linear remainder with other units?

GPT-2-small shape: d = 768, 3072 units, 256 tokens, float32, LayerNorm input (so the block's norms remove the
all-ones direction).  Copies (all output-preserving: act(z) - act(-z) = z for GELU, and for c > 0
act(cz)/c - act(-cz)/c = z):
  same-scale : unit i in S -> (-k, -b, w) in place, remainder (k, b, w) and (-k, -b, -w) appended (one gate group)
  scaled     : remainder (c k, c b, w / c) and (-c k, -c b, -w / c), c = 3 (a group of its own, which cancels)
  lead-rem   : as same-scale, but the remainder pair stored before the flipped unit (it leads the group)
Usage: PYTHONPATH=. python -m bench.redteam.canonical48.signs [fraction] [seed]
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch

from scanner.reading.activations import site_activations
from scanner.reading.architectures.sites import SiteWeights

D, UNITS, TOKENS = 768, 3072, 256


def block(seed: int):
    g = torch.Generator().manual_seed(seed)
    randn = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    h = randn(TOKENS, D) * 3 + 1
    c = h - h.mean(1, keepdim=True)
    x = c / c.pow(2).mean(1, keepdim=True).sqrt() * (1 + 0.3 * randn(D)) + 0.2 * randn(D)
    fc = randn(UNITS, D) * 0.03
    proj = (randn(D, UNITS) + 0.7 * randn(D, D) @ fc.T * 10) * 0.02
    bias = randn(UNITS) * 0.1
    return x.float(), h.float(), fc.float(), bias.float(), proj.float()


def copy(fc, bias, proj, flip, variant: str):
    idx = torch.nonzero(flip).flatten()
    sign = torch.where(flip, -1.0, 1.0)
    up, b, down = fc * sign[:, None], bias * sign, proj.clone()
    c = 3.0 if variant == "scaled" else 1.0
    r_up = torch.cat([c * fc[idx], -c * fc[idx]])
    r_b = torch.cat([c * bias[idx], -c * bias[idx]])
    r_down = torch.cat([proj[:, idx] / c, -proj[:, idx] / c], 1)
    if variant == "lead-rem":
        return (torch.cat([r_up, up]), torch.cat([r_b, b]), torch.cat([r_down, down], 1))
    return torch.cat([up, r_up]), torch.cat([b, r_b]), torch.cat([down, r_down], 1)


def output(x, fc, bias, proj):
    return torch.nn.functional.gelu(x @ fc.T + bias) @ proj.T


def views(x, h, fc, bias, proj):
    (v,) = site_activations(x, [SiteWeights(up=fc, down=proj, up_bias=bias)], activation="gelu", stream=h)
    return v


def main():
    fraction = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    torch.set_num_threads(threads)
    x, h, fc, bias, proj = block(seed)
    flip = torch.rand(UNITS, generator=torch.Generator().manual_seed(seed + 1)) < fraction
    base = views(x, h, fc, bias, proj)
    ref_out = output(x, fc, bias, proj)
    for variant in ("scaled", "same-scale", "lead-rem"):
        cu, cb, cd = copy(fc, bias, proj, flip, variant)
        change = float((output(x, cu, cb, cd) - ref_out).abs().max() / ref_out.abs().max())
        v = views(x, h, cu, cb, cd)
        row = {
            "variant": variant,
            "fraction": fraction,
            "seed": seed,
            "threads": threads,
            "flipped": int(flip.sum()),
            "units": [int(v.write.shape[0]), v.dead, v.combined],
            "output_change": float(f"{change:.3g}"),
        }
        if v.write.shape == base.write.shape:
            order = np.arange(UNITS)
            if variant == "lead-rem":  # canonical units come in the order of their groups' lowest index
                order = np.concatenate([np.flatnonzero(flip.numpy()), np.flatnonzero(~flip.numpy())])
            ref = base.write[order]
            wd = np.abs(v.write - ref)
            row["write_bit_equal"] = bool(np.array_equal(v.write, ref))
            row["write_units_differing"] = int((wd.max(1) > 0).sum())
            row["write_max_abs_diff"] = float(f"{wd.max():.3g}")
            row["write_rel_diff"] = float(f"{wd.max() / np.abs(base.write).max():.3g}")
            g0 = np.abs(base.gate[order])
            row["gate_abs_bit_equal"] = bool(np.array_equal(np.abs(v.gate), g0))
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
