"""canonical51 diagnostic (see README.md); argv: model folder (contrib.py: and the activation name)."""

import sys

import numpy as np
from transformers import AutoModelForCausalLM

import scanner.reading.canonical_mlp as cm
from bench.redteam.canonical50.cases import _mlp_inputs
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import find_sites, site_weights

m = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
inp = _mlp_inputs(m, None)
layer = decoder_stack(m).layers[0]
site = find_sites(layer)[0]
w = site_weights(layer, site)[0]
x = inp[(0, site.path)].float()
pre = cm._pre_activation(x, w.gate, w.gate_bias)
sizes = cm._written_on_inputs(w, "silu", x, pre, None)
written = cm.row_lengths(w.down.T)
c = written * sizes[0]
print("total", sizes[1], "max contribution", c.max(), "sorted top", np.sort(c)[-3:])
r = cm.canonical_mlp(w, "silu", x)
print(r.stored, r.dead, r.combined)
