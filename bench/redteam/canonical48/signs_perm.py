"""canonical48: the sign-free write view of signs.py's GPT-2-small-shaped GELU block, compared after matching the
canonical units' order (rows paired by |cos| of the gate view): the same-scale remainder twins join the flipped unit's
gate group, so the canonical units come back permuted (in the order of each group's leader's stored index, not its
lowest) and with the group's key recomputed; the view then agrees to float32 rounding, not bit for bit.
Usage: PYTHONPATH=. python -m bench.redteam.canonical48.signs_perm
"""

import numpy as np
import torch

from bench.redteam.canonical48 import signs as S

torch.set_num_threads(2)
x, h, fc, bias, proj = S.block(0)
flip = torch.rand(S.UNITS, generator=torch.Generator().manual_seed(1)) < 0.5
base = S.views(x, h, fc, bias, proj)
for variant in ["same-scale", "noflip"]:
    if variant == "noflip":
        cu, cb, cd = S.copy(fc, bias, proj, torch.zeros_like(flip), "same-scale")
        # remainder pair for the same subset, nothing negated
        idx = torch.nonzero(flip).flatten()
        cu = torch.cat([fc, fc[idx], -fc[idx]])
        cb = torch.cat([bias, bias[idx], -bias[idx]])
        cd = torch.cat([proj, proj[:, idx], -proj[:, idx]], 1)
    else:
        cu, cb, cd = S.copy(fc, bias, proj, flip, variant)
    v = S.views(x, h, cu, cb, cd)
    g = np.abs(v.gate) - np.abs(base.gate)
    print(
        variant,
        "gate max rel diff",
        np.abs(g).max() / np.abs(base.gate).max(),
        "units gate differing",
        int((np.abs(g).max(1) > 0).sum()),
    )
    d = np.abs(v.write - base.write).max(1)
    print(variant, "write: units differing", int((d > 0).sum()), "quantiles", np.quantile(d, [0.5, 0.9, 0.99, 1.0]))
    print(variant, "second view diff", np.abs(v.up - base.up).max())


def perm(a, b):
    an = np.abs(a) / np.linalg.norm(a, axis=1, keepdims=True)
    bn = np.abs(b) / np.linalg.norm(b, axis=1, keepdims=True)
    return np.argmax(an @ bn.T, axis=1)  # for each row of a, the row of b


results = {}
for variant in ["same-scale", "noflip", "scaled"]:
    idx = torch.nonzero(flip).flatten()
    if variant == "noflip":
        cu = torch.cat([fc, fc[idx], -fc[idx]])
        cb = torch.cat([bias, bias[idx], -bias[idx]])
        cd = torch.cat([proj, proj[:, idx], -proj[:, idx]], 1)
    else:
        cu, cb, cd = S.copy(fc, bias, proj, flip, variant)
    v = S.views(x, h, cu, cb, cd)
    results[variant] = v
    p = perm(v.gate, base.gate)
    print(
        variant, "perm is bijection", len(set(p.tolist())) == len(p), "identity", bool((p == np.arange(len(p))).all())
    )
    g = np.abs(np.abs(v.gate) - np.abs(base.gate[p]))
    w = np.abs(v.write - base.write[p])
    print(
        variant,
        "gate rel diff",
        g.max() / np.abs(base.gate).max(),
        "write: bit-equal",
        bool((w == 0).all()),
        "max",
        w.max(),
        "units differing",
        int((w.max(1) > 0).sum()),
    )
a, b = results["same-scale"], results["noflip"]
p = perm(a.gate, b.gate)
w = np.abs(a.write - b.write[p])
print(
    "flipped vs noflip (same remainder structure): write bit-equal",
    bool((w == 0).all()),
    "max",
    w.max(),
    "perm identity",
    bool((p == np.arange(len(p))).all()),
)
