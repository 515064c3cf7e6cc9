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

from scanner.reading.architectures.names import (
    DOWN_NAMES,
    GATE_NAMES,
    MIXER_NAMES,
    NORM_SUFFIX,
    ROUTER_NAMES,
    STACKED_EXPERTS,
    UP_NAMES,
    WRAPPER_NAMES,
)

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
    stacked: bool = False  # DBRX: 2-D maps of E * h rows, gate and up (out, in) per expert, down (in, out)

    @property
    def input_modules(self) -> tuple[str, ...]:
        """Modules whose first argument may be this site's input, in order of preference: for routed experts the block
        that holds them (every token as the router sees it; the experts module itself may get tokens grouped or
        scaled by expert, as JetMoE's and Llama 4's do), then the experts module (where the block projects its input
        first); for a dense MLP the up (or fused) map. The first whose input has the up map's width is taken."""
        if self.experts:
            return (self.path.rsplit(".", 1)[0], self.path) if "." in self.path else (self.path,)
        return (_join(self.path, self.up),)

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


def site_weights(layer: nn.Module, site: MLPSite, trainable: bool = False) -> list[SiteWeights]:
    """The loaded weights of a site: one entry per routed expert, or one for a dense MLP. ``trainable``: views of
    the parameters that carry their gradients (an attack that trains against the views, tests.fixtures.adaptive),
    not float32 copies."""
    if site.experts:
        return _expert_weights(layer.get_submodule(site.path), site, trainable)
    weight, bias = _linear(layer.get_submodule(_join(site.path, site.up)), trainable)
    down, _ = _linear(layer.get_submodule(_join(site.path, site.down)), trainable)
    if site.fused:
        gate, up = _split_fused(weight, site.fused)
        gate_bias, up_bias = _split_fused(bias, site.fused) if bias is not None else (None, None)
        return [SiteWeights(up=up, down=down, gate=gate, gate_bias=gate_bias, up_bias=up_bias)]
    if site.gate is None:
        return [SiteWeights(up=weight, down=down, up_bias=bias)]
    gate, gate_bias = _linear(layer.get_submodule(_join(site.path, site.gate)), trainable)
    return [SiteWeights(up=weight, down=down, gate=gate, gate_bias=gate_bias, up_bias=bias)]


def site_units(layer: nn.Module, site: MLPSite) -> int:
    """Hidden units per MLP of the site, from the (meta) down map's shape."""
    if site.experts:
        down = _tensor(layer.get_submodule(site.path), site.down)
        if site.stacked:
            return int(down.shape[0]) // site.experts
        return int(down.shape[1] if site.transposed else down.shape[2])
    return _linear_shape(layer.get_submodule(_join(site.path, site.down)))[1]


# -- discovery -----------------------------------------------------------------------------------------------------


def _modules(layer: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    """(path, module) under the layer, the layer itself included, never entering an attention or mixer subtree, a
    router, nor a norm (AXK2's gated RMSNorm holds a small MLP that gates the norm, not the block's feed-forward
    network)."""
    stack = [("", layer)]
    while stack:
        path, module = stack.pop()
        yield path, module
        for name, child in reversed(list(module.named_children())):
            if name not in MIXER_NAMES and name not in ROUTER_NAMES and not name.endswith(NORM_SUFFIX):
                stack.append((_join(path, name), child))


def _expert_sites(layer: nn.Module) -> Iterator[MLPSite]:
    """Routed experts held as 3-D tensors: transformers 5's gate_up_proj (or up_proj, or separate gate_proj and
    up_proj) and down_proj with the experts module's own layout flags (`use_experts_implementation`), or JetMoE's
    parallel-experts modules (input_linear, output_linear) whose 3-D weight is (E, out, in)."""
    for path, module in _modules(layer):
        stacked = _stacked_site(path, module)
        if stacked is not None:
            yield stacked
            continue
        names = {name for name in (*UP_NAMES, *DOWN_NAMES, *GATE_NAMES)
                 if getattr(_tensor(module, name), "ndim", 0) == 3}
        down = next((n for n in names if n in DOWN_NAMES), None)
        up = "gate_up_proj" if "gate_up_proj" in names else next((n for n in names if n in UP_NAMES), None)
        if down is None or up is None:
            continue
        gate = next((n for n in names if n in GATE_NAMES and n != up), None)
        transposed = bool(getattr(module, "is_transposed", _transposed(_tensor(module, up), _tensor(module, down))))
        # LongCat-Flash stores rows for its "zero" experts (which return their input) in gate_up_proj only: the
        # experts that are MLPs are those every map has
        experts = min(int(_tensor(module, n).shape[0]) for n in (up, down, *([gate] if gate else [])))
        units = int(_tensor(module, down).shape[1 if transposed else 2])
        up_out = int(_tensor(module, up).shape[2 if transposed else 1])
        fused = gate is None and bool(getattr(module, "has_gate", up == "gate_up_proj" or up_out == 2 * units))
        if fused:
            layout = "halves" if getattr(module, "is_concatenated", True) else "interleaved"
            yield MLPSite(path=path, kind="gated", up=up, down=down, fused=layout, experts=experts,
                          transposed=transposed)
        elif up_out == units:
            yield MLPSite(path=path, kind="gated" if gate else "plain", up=up, down=down, gate=gate, experts=experts,
                          transposed=transposed)


def _stacked_site(path: str, module: nn.Module) -> MLPSite | None:
    """DBRX's experts: gate, up and down maps of `STACKED_EXPERTS` names, each a 2-D (E * h, d) tensor, with the
    expert count E in the module's attribute of that name."""
    for attribute, (gate, up, down) in STACKED_EXPERTS.items():
        count = getattr(module, attribute, None)
        tensors = [getattr(module, name, None) for name in (gate, up, down)]
        if isinstance(count, int) and count > 0 and all(isinstance(t, nn.Parameter) and t.ndim == 2 for t in tensors) \
                and len({tuple(t.shape) for t in tensors}) == 1 and tensors[0].shape[0] % count == 0:
            return MLPSite(path=path, kind="gated", up=up, down=down, gate=gate, experts=count, stacked=True)
    return None


def _dense_sites(layer: nn.Module) -> Iterator[MLPSite]:
    """Modules with a down map and an up map among their direct children (a gate map too when gated); or a
    Sequential of a (d -> h) map, an activation and an (h -> d) map (CTRL's ffn), whose children are named 0 and 2."""
    for path, module in _modules(layer):
        children = _linear_children(module)
        if isinstance(module, nn.Sequential) and len(children) == 2:
            up, down = children
            d, h = _linear_shape(children[up])[1], _linear_shape(children[up])[0]
            if _linear_shape(children[down]) == (d, h):
                yield MLPSite(path=path, kind="plain", up=up, down=down)
            continue
        down = next((n for n in children if _named(n, DOWN_NAMES)), None)
        up = next((n for n in children if _named(n, UP_NAMES)), None)
        if down is None or up is None:
            continue
        units = _linear_shape(children[down])[1]
        up_out = _linear_shape(children[up])[0]
        gate = next((n for n in children if _named(n, GATE_NAMES) and n != up), None)
        if up_out == 2 * units and gate is None:
            yield MLPSite(path=path, kind="gated", up=up, down=down, fused="halves")
        elif up_out == units:
            yield MLPSite(path=path, kind="gated" if gate else "plain", up=up, down=down, gate=gate)


def _linear_children(module: nn.Module) -> dict[str, nn.Module]:
    """The linear maps among a module's children, and one level down inside a wrapper child (`WRAPPER_NAMES`),
    named by their path under the module."""
    found = {}
    for name, child in module.named_children():
        if _is_linear(child):
            found[name] = child
        elif name in WRAPPER_NAMES:
            found |= {f"{name}.{leaf}": grandchild for leaf, grandchild in child.named_children()
                      if _is_linear(grandchild)}
    return found


def _named(path: str, names: frozenset[str]) -> bool:
    """A child path plays the part `names` lists: by its whole path (output.dense) or its leaf (w_in.w_1)."""
    return path in names or path.rsplit(".", 1)[-1] in names


def _is_linear(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return isinstance(module, (nn.Linear, Conv1D)) or (isinstance(weight, nn.Parameter) and weight.ndim == 2
                                                       and not isinstance(module, (nn.Embedding, nn.LayerNorm)))


def _linear_shape(module: nn.Module) -> tuple[int, int]:
    """(out, in) of a linear map; GPT-2's Conv1D stores its weight as (in, out)."""
    rows, cols = module.weight.shape
    return (int(cols), int(rows)) if isinstance(module, Conv1D) else (int(rows), int(cols))


# -- weights ---------------------------------------------------------------------------------------------------------


def _linear(module: nn.Module, trainable: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    weight = _as_read(module.weight, trainable)
    bias = getattr(module, "bias", None)
    return (weight.T if isinstance(module, Conv1D) else weight), (None if bias is None else _as_read(bias, trainable))


def _as_read(tensor: torch.Tensor, trainable: bool) -> torch.Tensor:
    """A parameter as float32: a copy, or (``trainable``) a view that carries its gradient."""
    return tensor.float() if trainable else tensor.detach().float()


def _expert_weights(module: nn.Module, site: MLPSite, trainable: bool = False) -> list[SiteWeights]:
    up_all = _as_read(_tensor(module, site.up), trainable)
    down_all = _as_read(_tensor(module, site.down), trainable)
    gate_all = None if site.gate is None else _as_read(_tensor(module, site.gate), trainable)
    if site.stacked:  # (E * h, d) each; down is stored (in, out) per expert
        up_all, gate_all = (t.reshape(site.experts, -1, t.shape[-1]) for t in (up_all, gate_all))
        down_all = down_all.reshape(site.experts, -1, down_all.shape[-1]).transpose(1, 2)
    bias_all = getattr(module, f"{site.up}_bias", None)
    out = []
    for e in range(site.experts):
        up, down = (up_all[e].T, down_all[e].T) if site.transposed else (up_all[e], down_all[e])
        bias = None if bias_all is None else _as_read(bias_all[e], trainable)
        if site.fused is None:
            gate = None if gate_all is None else (gate_all[e].T if site.transposed else gate_all[e])
            out.append(SiteWeights(up=up, down=down, gate=gate, up_bias=bias))
            continue
        gate, up = _split_fused(up, site.fused)
        gate_bias, up_bias = _split_fused(bias, site.fused) if bias is not None else (None, None)
        out.append(SiteWeights(up=up, down=down, gate=gate, gate_bias=gate_bias, up_bias=up_bias))
    return out


def _transposed(up: torch.Tensor, down: torch.Tensor) -> bool:
    """Experts stored (E, in, out) rather than PyTorch's (E, out, in), as Llama 4's are, where the module does not say
    (`is_transposed`): the up map's input width is then its second dim, matching the down map's output (its third)."""
    return up.shape[2] != down.shape[1] and up.shape[1] == down.shape[2]


def _tensor(module: nn.Module, name: str) -> torch.Tensor | None:
    """A module's parameter `name`, or the weight of its child `name` (JetMoE's parallel experts)."""
    value = getattr(module, name, None)
    if isinstance(value, nn.Parameter):
        return value
    return getattr(value, "weight", None) if isinstance(value, nn.Module) else None


def _split_fused(fused: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) rows of a fused map: two halves (gate first), or alternating rows (gate, up, gate, up, ...)."""
    if layout == "interleaved":
        return fused[0::2], fused[1::2]
    gate, up = fused.chunk(2, dim=0)
    return gate, up


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
