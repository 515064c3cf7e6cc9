"""Where a decoder layer's feed-forward networks are, read off transformers' own module tree.

A *site* is one MLP of a block, or one tensor of routed experts: its module path under the layer, whether its units
have two views (gated: gate and up) or one input map (plain: fc -> act -> proj), and how its weights are stored
(separate maps, a fused gate-and-up map, GPT-2's transposed Conv1D, 3-D expert tensors, biases). Discovery needs only
the meta-device modules; `site_weights` reads the weights back from the same modules once a block is loaded, so the
file's naming never matters here (transformers' own loader put every tensor where its module expects it).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from scanner.architectures.names import DOWN_NAMES, GATE_NAMES, MIXER_NAMES, UP_NAMES

MLPKind = Literal["gated", "plain"]


@dataclass(frozen=True)
class MLPSite:
    """One feed-forward network of a block (``experts`` > 0: a tensor of that many routed experts).

    ``up`` names the map whose input is the MLP input (the fused gate-and-up map when ``fused``); ``gate`` is None
    for a plain MLP and for a fused one.
    """

    path: str  # module path under the decoder layer ("" for the layer itself, as in OPT)
    kind: MLPKind
    up: str
    down: str
    gate: str | None = None
    fused: Literal["halves", "interleaved"] | None = None
    experts: int = 0
    transposed: bool = False  # 3-D experts stored (E, in, out), as gpt-oss does

    @property
    def input_module(self) -> str:
        """The module whose first argument is this site's input: the experts module, or the up (fused) map."""
        return self.path if self.experts else _join(self.path, self.up)

    @property
    def shared(self) -> bool:
        return "shared" in self.path


@dataclass(frozen=True)
class SiteWeights:
    """One MLP's weights as float32 (out, in) matrices: gated down(act(gate x) * (up x)), or plain
    down(act(up x + up_bias)). For a plain MLP ``gate`` is None."""

    up: torch.Tensor  # (h, d)
    down: torch.Tensor  # (d, h)
    gate: torch.Tensor | None = None  # (h, d)
    gate_bias: torch.Tensor | None = None  # (h,)
    up_bias: torch.Tensor | None = None  # (h,)


def find_sites(layer: nn.Module) -> list[MLPSite]:
    """Every MLP site of one decoder layer, routed experts first, then dense MLPs (shared experts last).

    Empty for a layer without a feed-forward network (a Mamba or linear-attention block of a hybrid stack).
    """
    sites = [*_expert_sites(layer), *_dense_sites(layer)]
    return sorted(sites, key=lambda site: (site.experts == 0, site.shared, site.path))


def site_weights(layer: nn.Module, site: MLPSite) -> list[SiteWeights]:
    """The loaded weights of a site: one entry per routed expert, or one for a dense MLP."""
    if site.experts:
        return _expert_weights(layer.get_submodule(site.path), site)
    weight, bias = _linear(layer.get_submodule(_join(site.path, site.up)))
    down, _ = _linear(layer.get_submodule(_join(site.path, site.down)))
    if site.fused:
        gate, up = _split_fused(weight, site.fused)
        gate_bias, up_bias = _split_fused(bias, site.fused) if bias is not None else (None, None)
        return [SiteWeights(up=up, down=down, gate=gate, gate_bias=gate_bias, up_bias=up_bias)]
    if site.gate is None:
        return [SiteWeights(up=weight, down=down, up_bias=bias)]
    gate, gate_bias = _linear(layer.get_submodule(_join(site.path, site.gate)))
    return [SiteWeights(up=weight, down=down, gate=gate, gate_bias=gate_bias, up_bias=bias)]


def site_units(layer: nn.Module, site: MLPSite) -> int:
    """Hidden units per MLP of the site, from the (meta) down map's shape."""
    if site.experts:
        down = getattr(layer.get_submodule(site.path), site.down)
        return int(down.shape[1] if site.transposed else down.shape[2])
    return _linear_shape(layer.get_submodule(_join(site.path, site.down)))[1]


# -- discovery -----------------------------------------------------------------------------------------------------


def _modules(layer: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) under the layer, the layer itself included, never entering an attention or mixer subtree."""
    stack = [("", layer)]
    while stack:
        path, module = stack.pop()
        yield path, module
        for name, child in reversed(list(module.named_children())):
            if name not in MIXER_NAMES:
                stack.append((_join(path, name), child))


def _expert_sites(layer: nn.Module) -> Iterator[MLPSite]:
    """Routed experts held as 3-D tensors (transformers 5): gate_up_proj (or up_proj) and down_proj, with the
    experts module's own layout flags (`use_experts_implementation`)."""
    for path, module in _modules(layer):
        down = getattr(module, "down_proj", None)
        up_name = "gate_up_proj" if isinstance(getattr(module, "gate_up_proj", None), nn.Parameter) else "up_proj"
        up = getattr(module, up_name, None)
        if not (isinstance(down, nn.Parameter) and isinstance(up, nn.Parameter) and down.ndim == 3 and up.ndim == 3):
            continue
        gated = bool(getattr(module, "has_gate", up_name == "gate_up_proj"))
        yield MLPSite(
            path=path, kind="gated" if gated else "plain", up=up_name, down="down_proj",
            fused=("halves" if getattr(module, "is_concatenated", True) else "interleaved") if gated else None,
            experts=int(up.shape[0]), transposed=bool(getattr(module, "is_transposed", False)),
        )


def _dense_sites(layer: nn.Module) -> Iterator[MLPSite]:
    """Modules with a down map and an up map among their direct children (a gate map too when gated)."""
    for path, module in _modules(layer):
        children = {name: child for name, child in module.named_children() if _is_linear(child)}
        down = next((n for n in children if n in DOWN_NAMES), None)
        up = next((n for n in children if n in UP_NAMES), None)
        if down is None or up is None:
            continue
        units = _linear_shape(children[down])[1]
        up_out = _linear_shape(children[up])[0]
        gate = next((n for n in children if n in GATE_NAMES and n != up), None)
        if up_out == 2 * units and gate is None:
            yield MLPSite(path=path, kind="gated", up=up, down=down, fused="halves")
        elif up_out == units:
            yield MLPSite(path=path, kind="gated" if gate else "plain", up=up, down=down, gate=gate)


def _is_linear(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, (nn.Linear, Conv1D)) or (isinstance(weight, nn.Parameter) and weight.ndim == 2
                                                       and not isinstance(module, (nn.Embedding, nn.LayerNorm)))


def _linear_shape(module: nn.Module) -> tuple[int, int]:
    """(out, in) of a linear map; GPT-2's Conv1D stores its weight as (in, out)."""
    rows, cols = module.weight.shape
    return (int(cols), int(rows)) if isinstance(module, Conv1D) else (int(rows), int(cols))


# -- weights ---------------------------------------------------------------------------------------------------------


def _linear(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = module.weight.detach().float()
    bias = getattr(module, "bias", None)
    return (weight.T if isinstance(module, Conv1D) else weight), (None if bias is None else bias.detach().float())


def _expert_weights(module: nn.Module, site: MLPSite) -> list[SiteWeights]:
    up_all = getattr(module, site.up).detach().float()
    down_all = getattr(module, site.down).detach().float()
    bias_all = getattr(module, f"{site.up}_bias", None)
    out = []
    for e in range(site.experts):
        up, down = (up_all[e].T, down_all[e].T) if site.transposed else (up_all[e], down_all[e])
        bias = None if bias_all is None else bias_all[e].detach().float()
        if site.fused is None:
            out.append(SiteWeights(up=up, down=down, up_bias=bias))
            continue
        gate, up = _split_fused(up, site.fused)
        gate_bias, up_bias = _split_fused(bias, site.fused) if bias is not None else (None, None)
        out.append(SiteWeights(up=up, down=down, gate=gate, gate_bias=gate_bias, up_bias=up_bias))
    return out


def _split_fused(fused: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) rows of a fused map: two halves (gate first), or alternating rows (gate, up, gate, up, ...)."""
    if layout == "interleaved":
        return fused[0::2], fused[1::2]
    gate, up = fused.chunk(2, dim=0)
    return gate, up


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
