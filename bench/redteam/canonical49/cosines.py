"""Stored gate-row cosines (with bias) vs pre-activation cosines on the MLP's inputs, block 0, original vs a copy."""

import sys

import torch
from transformers import AutoModelForCausalLM

from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import find_sites, site_weights


def stats(folder):
    m = AutoModelForCausalLM.from_pretrained(folder).eval()
    layer = decoder_stack(m).layers[0]
    (w,) = site_weights(layer, find_sites(layer)[0])[:1]
    key = (w.gate if w.gate is not None else w.up).double()
    bias = w.gate_bias if w.gate is not None else w.up_bias
    if bias is not None:
        key = torch.cat([key, bias.double()[:, None]], 1)
    captured = []
    mod = m.get_submodule(
        [n for n, _ in m.named_modules() if n.endswith(("layers.0.mlp", "h.0.mlp", "layers.0.feed_forward"))][0]
    )
    h = mod.register_forward_pre_hook(lambda mod, a: captured.append(a[0].reshape(-1, a[0].shape[-1]).double()))
    with torch.no_grad():
        m(input_ids=torch.randint(0, m.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0)))
    h.remove()
    x = captured[0]
    x1 = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], 1) if bias is not None else x
    pre = x1 @ key.T

    def offdiag(a):
        a = a / a.norm(dim=1, keepdim=True)
        c = a @ a.T
        return c[~torch.eye(c.shape[0], dtype=bool)]

    s, f = offdiag(key), offdiag(pre.T)
    ln = key.norm(dim=1)
    print(
        f"{folder}: stored |cos| median {s.abs().median():.4f} min {s.abs().min():.4f}; "
        f"pre-activation |cos| median {f.abs().median():.4f} max {f.abs().max():.4f}; "
        f"row length max/min {float(ln.max() / ln.min()):.3f}"
    )


for folder in sys.argv[1:]:
    stats(folder)
