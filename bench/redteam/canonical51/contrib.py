"""canonical51 diagnostic (see README.md); argv: model folder (contrib.py: and the activation name)."""

import sys

import numpy as np
from transformers import AutoModelForCausalLM

import scanner.reading.canonical_mlp as cm
from bench.redteam.canonical50.cases import _mlp_inputs
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import find_sites, site_weights

m = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
act = sys.argv[2]
inp = _mlp_inputs(m, None)
for i, layer in enumerate(decoder_stack(m).layers):
    site = find_sites(layer)[0]
    w = site_weights(layer, site)[0]
    x = inp[(i, site.path)].float()
    key, kb = (w.gate, w.gate_bias) if w.gate is not None else (w.up, w.up_bias)
    pre = cm._pre_activation(x, key, kb)
    sizes = cm._written_on_inputs(w, act, x, pre, None)
    c = cm.row_lengths(w.down.T) * sizes[0] / sizes[1]
    print(i, "contribution / total quantiles 10,50,90,max:", np.quantile(c, [0.1, 0.5, 0.9, 1.0]))
