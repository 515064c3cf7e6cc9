"""canonical51 diagnostic (see README.md); argv: model folder (contrib.py: and the activation name)."""

import sys

from transformers import AutoModelForCausalLM

from bench.redteam.canonical50.cases import _mlp_inputs
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import find_sites, site_weights

m = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
inp = _mlp_inputs(m, None)
for i, layer in enumerate(decoder_stack(m).layers):
    for site in find_sites(layer):
        for w in site_weights(layer, site):
            x = inp[(i, site.path)]
            key = (w.gate if w.gate is not None else w.up).double()
            b = w.gate_bias if w.gate is not None else w.up_bias
            pre = x @ key.T + (b.double() if b is not None else 0)
            cos = pre.mean(0).abs() / pre.pow(2).mean(0).sqrt()
            print(i, site.path, x.shape, pre.shape[1], "cos>=0.95:", int((cos >= 0.95).sum()), "max", float(cos.max()))
