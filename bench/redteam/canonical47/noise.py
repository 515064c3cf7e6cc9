"""How much noise the hiding costs: each hidden unit's contribution in the copy (its group of 5 or 3 units) against
the unit's own contribution in the original, on 4096 random inputs in float32 (relative L2 error per unit, worst unit).

Usage: python -m bench.redteam.canonical47.noise ORIGINAL COPY GROUP_SIZE
"""
import sys

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

orig, cop, per = sys.argv[1], sys.argv[2], int(sys.argv[3])
a = AutoModelForCausalLM.from_pretrained(orig, dtype=torch.float32).eval()
b = AutoModelForCausalLM.from_pretrained(cop, dtype=torch.float32).eval()
torch.manual_seed(0)
worst_all = 0.0
for la, lb in zip(a.model.layers, b.model.layers):
    ma, mb = la.mlp, lb.mlp
    x = torch.randn(4096, ma.gate_proj.weight.shape[1])
    with torch.no_grad():
        ha = F.silu(x @ ma.gate_proj.weight.T) * (x @ ma.up_proj.weight.T)  # (n, h)
        hb = F.silu(x @ mb.gate_proj.weight.T) * (x @ mb.up_proj.weight.T)  # (n, per*h)
        h = ha.shape[1]
        worst = 0.0
        for i in range(h):
            ca = ha[:, i:i + 1] * ma.down_proj.weight[:, i]
            cb = hb[:, per * i:per * (i + 1)] @ mb.down_proj.weight[:, per * i:per * (i + 1)].T
            worst = max(worst, float((cb - ca).norm() / ca.norm()))
        full = float((mb(x) - ma(x)).norm() / ma(x).norm())
    worst_all = max(worst_all, worst)
    print(f"layer: worst unit relative error {worst:.2e}; whole MLP relative error {full:.2e}")
print(f"worst over layers {worst_all:.2e}")
