"""Disguises that move MLP input rows along a direction the MLP's input never has: a weight-space change that no
activation sees, aimed at the canonical form's grouping of units by the cosine of their stored rows (>= 0.95).

LayerNorm's output y = gamma * xhat + beta has sum(xhat) = 0, so n = 1 / gamma gives n . y = n . beta for every input:
an input row k and bias b may become k + c n and b - c (n . beta) for any c without changing k . y + b. A unit split
into parts that differ only in their output columns (w/P + e_j, sum e_j = 0: the suite's split_unlike "writes") and
whose input rows are then shifted by different c_j computes exactly what the unit did, but its parts' stored rows are
far apart (the canonical form leaves them apart) and their second views differ (the screen leaves them apart too).
"""

from __future__ import annotations

import torch

from scanner.architectures.module_tree import decoder_stack
from scanner.architectures.sites import SiteWeights, find_sites, site_weights
from scanner.testing import adversary as adv

NORM_BEFORE_MLP = {"gpt2": "ln_2", "gpt_neox": "post_attention_layernorm"}


def split_writes_null_shift(parts: int = 2, spread: float = 3.0, shift: float = 2.0,
                            equal_writes: bool = False) -> adv.Disguise:
    """Every plain unit split into ``parts`` with output columns w/P + e_j (|e_j| ~ ``spread`` |w/P|; ``equal_writes``:
    e_j = 0, plain copies) and input rows k + t_j |k| / |n| n, t_j spread evenly over [-shift, shift]."""

    @torch.no_grad()
    def disguise(model, generator):
        norm_name = NORM_BEFORE_MLP.get(model.config.model_type)
        if norm_name is None:
            raise adv.UnsupportedDisguise("needs a LayerNorm whose output only the MLP reads")
        for layer in decoder_stack(model).layers:
            norm = getattr(layer, norm_name)
            n = 1.0 / norm.weight.double()
            offset = float(n @ norm.bias.double())
            (site,) = find_sites(layer)
            (w,) = site_weights(layer, site)
            k, d = w.up.double(), w.down.double()
            b = w.up_bias.double()
            h = k.shape[0]
            source = torch.arange(h).repeat_interleave(parts)
            t = torch.linspace(-shift, shift, parts, dtype=torch.float64).repeat(h)
            c = t * k.norm(dim=1)[source] / n.norm()
            rows = k[source] + c[:, None] * n[None, :]
            bias = b[source] - c * offset
            down = d[:, source] / parts
            if not equal_writes:
                noise = torch.randn(h, parts, d.shape[0], dtype=torch.float64, generator=generator)
                noise = noise - noise.mean(dim=1, keepdim=True)
                noise = noise / noise.norm(dim=2).mean(dim=1)[:, None, None] * spread
                noise = noise * (d.T.norm(dim=1) / parts)[:, None, None]
                down = down + noise.reshape(h * parts, -1).T
            order = torch.randperm(h * parts, generator=generator)
            adv._write_site(layer, site, [SiteWeights(up=rows[order].float(), down=down[:, order].float(),
                                                      up_bias=bias[order].float())])
        return adv._rebuilt(model, {key: (lambda x: x * parts) for key in adv.WIDTH_KEYS})

    return disguise
