"""Disguises that write along the one direction every LayerNorm removes: the all-ones vector of the residual stream.

In GPT-2 and GPT-NeoX the residual stream is read only by LayerNorms (ln_1, ln_2, ln_f; input_layernorm,
post_attention_layernorm, final_layer_norm), and LayerNorm(x + c 1) = LayerNorm(x) for every c. So any writer of the
stream (the embeddings, every attention and MLP output map and bias) may add any multiple of 1 to what it writes,
and nothing downstream sees it (up to float32 rounding of the mean subtraction, which `max_logit_change` measures).

What a fingerprint read that did see it (found by an independent check of issue 43's claim): a plain MLP's second
view and its write view read each unit's output column on the residual stream as it enters the block, each token's
row at unit length; they now read it less each row's mean where the block's norms remove it
(scanner.architectures.norms), which undoes both levers exactly:

* ``offset``: a constant C 1 added to every token's stream (position embeddings for GPT-2, the input embedding's
  rows for GPT-NeoX): every token's stream row turns toward 1, so every unit's read-back becomes nearly the same
  number on every token (its column's mean) and the token-varying part shrinks by about |x| / (C sqrt(d)).
* ``per_unit``: each unit's output column w_i gets c_i 1 added, |c_i 1| = per_unit |w_i|, a random sign: its
  read-back gains c_i (row . 1), one token profile shared by all units with a unit-specific weight.
"""

from __future__ import annotations

import torch

from scanner.architectures.module_tree import decoder_stack
from scanner.architectures.sites import SiteWeights, find_sites, site_weights
from scanner.testing import adversary as adv


def stream_offset(offset: float = 0.0, per_unit: float = 0.0, attention_bias: float = 0.0) -> adv.Disguise:
    """Add ``offset`` * 1 to every token's embedding, ``per_unit`` (see the module) to every MLP unit's output column,
    and ``attention_bias`` * 1 to every attention output bias."""

    @torch.no_grad()
    def disguise(model, generator):
        kind = model.config.model_type
        if kind not in ("gpt2", "gpt_neox"):
            raise adv.UnsupportedDisguise("needs a residual stream read only by LayerNorms")
        if offset:
            if kind == "gpt2":
                model.transformer.wpe.weight += offset
            else:
                model.gpt_neox.embed_in.weight += offset
        for layer in decoder_stack(model).layers:
            if attention_bias:
                proj = layer.attn.c_proj if kind == "gpt2" else layer.attention.dense
                proj.bias += attention_bias
            if per_unit:
                (site,) = find_sites(layer)
                (w,) = site_weights(layer, site)
                down = w.down.double()
                d = down.shape[0]
                signs = torch.where(torch.rand(down.shape[1], generator=generator) < 0.5, -1.0, 1.0).double()
                c = signs * per_unit * down.norm(dim=0) / d ** 0.5
                down = down + c[None, :]
                adv._write_site(layer, site, [SiteWeights(up=w.up, down=down.float(), up_bias=w.up_bias,
                                                          gate=w.gate, gate_bias=w.gate_bias)])
        return model

    return disguise
