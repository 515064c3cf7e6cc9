"""A model's weight profile (scanner.stats.weight_statistics): its norm weights, attention standard deviations,
attention spectra and a sample of its MLP weight values, layer by layer, read one block at a time through the
family's adapter."""

from __future__ import annotations

import numpy as np
import torch

from scanner.errors import UnsupportedArchitectureError
from scanner.reading.architectures.families import ArchitectureAdapter
from scanner.reading.value_sample import block_sample
from scanner.stats.verbatim import sample_layout
from scanner.stats.weight_statistics import GHOSTSPEC_TOP, WeightProfile

#: Residual-stream norms in a fixed order (a family stores the ones it has).
NORM_ROLES = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm")
#: The MLP matrices whose values are sampled for the verbatim share, in a fixed order (a plain MLP has no gate).
MLP_ROLES = ("gate", "up", "down")


def weight_profile(adapter: object) -> WeightProfile:
    """The profile of every block; refused (UnsupportedArchitectureError) for families whose attention and norm roles
    hubtrace does not know (a model read as a module tree, a block without separate q/k/v/o)."""
    if not isinstance(adapter, ArchitectureAdapter):
        raise UnsupportedArchitectureError(
            f"{adapter.checkpoint.path}: the weight fingerprints read attention and norm weights by role, which "
            "hubtrace knows for the families of its Llama-row table only (docs/architectures.md); this model is read "
            "as a module tree")
    shape = adapter.shape
    heads, kv_heads = adapter.attention_heads
    norms, stds, spectra, values, layout = [], [], [], [], []
    for layer in range(shape.n_layers):
        w = adapter.block_weights(layer)
        if missing := [role for role in ("q", "k", "v", "o") if role not in w]:
            raise UnsupportedArchitectureError(f"{adapter.checkpoint.path}: block {layer} has no separate "
                                               f"{'/'.join(missing)} projection for the weight fingerprints to read")
        norms.append([w[role].double().numpy() for role in NORM_ROLES if role in w])
        stds.append([float(w[role].double().std()) for role in ("q", "k", "v", "o")])
        spectra.append([_top_singular_mean(_qk(w, heads, kv_heads)), _top_singular_mean(_vo(w, heads, kv_heads))])
        sampled, parts = block_sample([(role, w[role]) for role in MLP_ROLES if role in w], shape.n_layers)
        values += sampled
        layout += parts
        del w
    width = max((len(layer) for layer in norms), default=0)
    stacked = np.zeros((shape.n_layers, width, shape.hidden_size))  # a family without norm weights: none to compare
    for i, layer in enumerate(norms):
        if layer:
            stacked[i] = np.stack(layer)
    return WeightProfile(norms=stacked, attn_std=np.asarray(stds), ghostspec=np.asarray(spectra),
                         mlp_values=np.concatenate(values).astype(np.float32) if values else np.zeros(0, np.float32),
                         mlp_layout=sample_layout(layout))


def _grouped(weight: torch.Tensor, heads: int, kv_heads: int) -> torch.Tensor:
    """Key or value rows repeated per query head of their group (grouped-query attention), as attention uses them."""
    if kv_heads == heads:
        return weight
    rows = weight.shape[0] // kv_heads
    return weight.reshape(kv_heads, rows, -1).repeat_interleave(heads // kv_heads, dim=0).reshape(heads * rows, -1)


def _qk(w: dict[str, torch.Tensor], heads: int, kv_heads: int) -> torch.Tensor:
    """M_qk = W_q W_k^T in the authors' (in, out) convention: (d, d)."""
    return w["q"].double().T @ _grouped(w["k"].double(), heads, kv_heads)


def _vo(w: dict[str, torch.Tensor], heads: int, kv_heads: int) -> torch.Tensor:
    """M_vo = W_v W_o in the authors' (in, out) convention: (d, d)."""
    return _grouped(w["v"].double(), heads, kv_heads).T @ w["o"].double().T


def _top_singular_mean(matrix: torch.Tensor) -> float:
    """The mean of the top GHOSTSPEC_TOP singular values: exact for a small product, a seeded randomized SVD (four
    power iterations) for a large one, so the same weights always give the same value."""
    if min(matrix.shape) <= 4 * GHOSTSPEC_TOP:
        return float(torch.linalg.svdvals(matrix)[:GHOSTSPEC_TOP].mean())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        _, values, _ = torch.svd_lowrank(matrix, q=GHOSTSPEC_TOP + 8, niter=4)
    return float(values[:GHOSTSPEC_TOP].mean())
