"""canonical51 diagnostic: the dead-unit bar on each expert of a Mixtral copy's block 0, read directly."""

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
for site in find_sites(layer):
    ws = site_weights(layer, site)
    print(site.path, len(ws))
    for w in ws[:3]:
        x = inp[(0, site.path)].float()
        pre = cm._pre_activation(x, w.gate, w.gate_bias)
        sizes = cm._written_on_inputs(w, "silu", x, pre, None)
        c = cm.row_lengths(w.down.T) * sizes[0]
        print("total", sizes[1], "top", np.sort(c)[-3:], "x shape", x.shape, w.down.shape)
        r = cm.canonical_mlp(w, "silu", x)
        print(r.stored, r.dead, r.combined)
