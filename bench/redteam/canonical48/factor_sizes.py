"""canonical48: sizes of the canonical units (|w| |r|) of a half-precision split copy's first block, relative to the
largest unit of each gate group: how big the rounding factors kept beside each real unit are.
Usage: PYTHONPATH=. python -m bench.redteam.canonical48.factor_sizes \
    /tmp/canonical48/gated/copy-splitboth0.5x3-gated-bfloat16
"""

import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from scanner.reading.architectures.sites import SiteWeights
from scanner.reading.canonical_mlp import canonical_mlp

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
mlp = model.model.layers[0].mlp
w = SiteWeights(up=mlp.up_proj.weight.detach(), down=mlp.down_proj.weight.detach(), gate=mlp.gate_proj.weight.detach())
c = canonical_mlp(w, "silu")
cw = c.weights
size = (cw.down.double().norm(dim=0) * cw.up.double().norm(dim=1)).numpy()
keys = cw.gate.double().numpy()
_, group = np.unique(np.round(keys / np.abs(keys).max(1, keepdims=True), 5), axis=0, return_inverse=True)
group = group.ravel()
rel = np.concatenate([np.sort(size[group == g])[::-1] / size[group == g].max() for g in np.unique(group)])
lead = np.array([np.sort(size[group == g])[::-1][1] / size[group == g].max() for g in np.unique(group)])
print(
    "stored",
    c.stored,
    "dead",
    c.dead,
    "combined",
    c.combined,
    "canonical units",
    cw.up.shape[0],
    "groups",
    np.unique(group).size,
)
print(f"second factor / leading factor per group: median {np.median(lead):.3g}, max {lead.max():.3g}")
