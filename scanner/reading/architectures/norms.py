"""Whether a decoder layer reads its residual stream only through norms that remove each row's mean (LayerNorm), so
that the stream's all-ones direction is invisible to the block.

Why: where it is, a copier may add any multiple of the all-ones vector to the embeddings, the biases and every unit's
output column without changing an output (LayerNorm(x + c 1) = LayerNorm(x)), and a write view read on the raw
stream would then read mostly that constant (an independent check drowned every plain MLP's write views this way:
tests/fixtures/stream_offset.py). The write views read the stream with each row's mean removed there
(scanner.reading.activations.stream_rows), which undoes any such offset exactly. Where a norm keeps the mean (RMSNorm),
the all-ones direction carries information and a rotation of the stream moves it, so the stream is read as it is.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

#: Relative change of a norm's output, under a constant added to its input, below which the norm removes the mean
#: (float32 LayerNorm: about 1e-6; RMSNorm: of order 1).
MEAN_FREE_TOLERANCE = 1e-3


def norms_remove_mean(layer: nn.Module, width: int) -> bool:
    """True when the layer has norms over rows of ``width`` and each one's output is unchanged by a constant added
    to its input (checked on a few fixed random rows, on the norm's own device and dtype); False otherwise,
    including for a norm that cannot be called on plain rows."""
    norms = [module for module in layer.modules() if "norm" in type(module).__name__.lower()
             and isinstance(getattr(module, "weight", None), torch.Tensor) and tuple(module.weight.shape) == (width,)]
    if not norms:
        return False
    rows = torch.randn(1, 4, width, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    for norm in norms:
        probe = copy.deepcopy(norm)  # some norms keep running statistics (I-BERT's): the model's own is not touched
        x = rows.to(device=norm.weight.device, dtype=norm.weight.dtype)
        try:
            with torch.no_grad():
                before, after = probe(x), probe(x + 3.0)
        except Exception:  # a norm that cannot be called on plain rows (extra inputs, quantised forms): not known
            return False
        if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor) or before.shape != x.shape:
            return False
        before, after = before.float(), after.float()
        scale = float(before.abs().max())
        if not scale or float((after - before).abs().max()) > MEAN_FREE_TOLERANCE * scale:
            return False
    return True


def mean_free(stream: torch.Tensor) -> torch.Tensor:
    """The stream's rows less their mean over the last dimension (what a LayerNorm reads of them), computed in
    float64 so that a large offset along the all-ones direction leaves no rounding behind."""
    wide = stream.double()
    return (wide - wide.mean(dim=-1, keepdim=True)).to(stream.dtype)
