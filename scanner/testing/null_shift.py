"""Disguises that move MLP input rows along directions the MLP's input never takes: a change of the stored weights that
no activation sees, aimed at grouping units by the cosine of their stored rows (scanner.canonical_mlp groups them by
what they compute on the inputs too). Found by an independent check of issue 43's claim (bench/redteam).

* LayerNorm: its output y = gamma * xhat + beta has sum(xhat) = 0, so n = 1 / gamma gives n . y = n . beta for every
  input; an input row k and bias b may become k + c n and b - c (n . beta) for any c (`split_writes_null_shift`).
* RMSNorm: the residual stream widened by coordinates that are always zero (`widened`): RMSNorm over d + z
  coordinates of which z are zero divides by sqrt(d / (d + z) * mean + eps'), so with eps' = eps d / (d + z) and
  gains times sqrt(d / (d + z)) every norm's output is what it was (plus zeros), and every map that reads the stream
  gets z input columns nothing feeds (`widened_unlike_split`).

Each is used on a unit split into parts (the suite's unlike splits): each part's row is shifted by its own multiple,
so the parts' stored rows are far apart while every activation is as before.
"""

from __future__ import annotations

import math

import torch
from transformers import LlamaConfig, LlamaForCausalLM

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
