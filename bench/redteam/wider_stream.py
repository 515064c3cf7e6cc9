"""A null direction made for RMSNorm models: the residual stream widened by coordinates that are always zero.

RMSNorm over d + z coordinates of which z are zero divides by sqrt(d / (d + z) * mean + eps'): with eps' = eps d / (d+z)
and gains times sqrt(d / (d + z)) every norm's output is what it was (plus zeros), so every map that reads the stream
gets z new input columns that nothing ever feeds: a gate (or up) row may be shifted along them freely. Used with the
suite's split into unlike parts (up rows r/P + v_j sharing one gate): each part's gate row is shifted by its own
multiple of a new coordinate, so the parts' stored gate rows are far apart and the canonical form leaves them apart,
while every activation is as before. Llama layout only (the zoo's gated base).
"""

from __future__ import annotations

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from scanner.architectures.sites import SiteWeights
from scanner.testing import adversary as adv


@torch.no_grad()
def widened(model: LlamaForCausalLM, extra: int = 4) -> LlamaForCausalLM:
    """The same function with a residual stream of hidden + ``extra`` coordinates, the new ones always zero."""
    config = LlamaConfig(**model.config.to_dict())
    d = config.hidden_size
    config.head_dim = getattr(model.config, "head_dim", d // config.num_attention_heads)
    config.hidden_size = d + extra
    config.rms_norm_eps = model.config.rms_norm_eps * d / (d + extra)
    gain = math.sqrt(d / (d + extra))
    out = LlamaForCausalLM(config)
    state = {}
    for name, t in model.state_dict().items():
        t = t.double()
        if name.endswith("norm.weight"):
            t = torch.cat([t * gain, torch.ones(extra, dtype=t.dtype)])
        elif name.endswith(("o_proj.weight", "down_proj.weight")):  # write into the stream: zero new rows
            t = torch.cat([t, torch.zeros(extra, t.shape[1], dtype=t.dtype)])
        elif t.ndim == 2 and t.shape[1] == d:  # read the stream (or embed into it): zero new columns
            t = torch.cat([t, torch.zeros(t.shape[0], extra, dtype=t.dtype)], dim=1)
        state[name] = t.float()
    out.load_state_dict(state, strict=True)
    return out.eval()


def widened_unlike_split(parts: int = 2, spread: float = 1.0, shift: float = 2.0, extra: int = 4,
                         shift_up: bool = False) -> adv.Disguise:
    """Widen the stream, then split every unit into ``parts`` with one gate (in activations) and up rows r/P + v_j,
    each part's gate row shifted by t_j |k| along the new coordinates (t_j evenly over [-shift, shift]); ``spread``
    0: the parts are plain copies with shares 1/P of the output column."""

    def disguise(model, generator):
        wide = widened(model, extra)

        def change(w: SiteWeights, _degree) -> SiteWeights:
            k, r, dn = w.gate.double(), w.up.double(), w.down.double()
            h, width = k.shape
            source = torch.arange(h).repeat_interleave(parts)
            t = torch.linspace(-shift, shift, parts, dtype=torch.float64).repeat(h)
            direction = torch.zeros(width, dtype=torch.float64)
            direction[width - extra:] = 1.0 / math.sqrt(extra)
            gates = k[source] + (t * k.norm(dim=1)[source])[:, None] * direction
            ups = r[source] / parts
            if spread:
                noise = torch.randn(h, parts, width, dtype=torch.float64, generator=generator)
                noise = noise - noise.mean(dim=1, keepdim=True)
                noise = noise / noise.norm(dim=2).mean(dim=1)[:, None, None] * spread
                ups = ups + (noise * (r.norm(dim=1) / parts)[:, None, None]).reshape(h * parts, width)
                ups[:, width - extra:] = 0.0
            if shift_up:  # the up rows moved along the new coordinates too (their stored cosines broken as well)
                ups = ups + (-t * ups.norm(dim=1))[:, None] * direction
            downs = dn[:, source]
            if not spread:
                ups = r[source]
                downs = dn[:, source] / parts
            order = torch.randperm(h * parts, generator=generator)
            return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), gate=gates[order].float())

        return adv._transform_sites(wide, change, width=lambda h: h * parts)

    return disguise
