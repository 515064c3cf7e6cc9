"""Routed experts read one expert at a time, for MoE blocks too large to hold whole (DeepSeek-V3: 256 experts,
22.5 GB of bf16 per block).

A block's forward needs its routed output (each token's top-k experts, weighted), and the fingerprint needs both views
of every unit of every expert on the block's MLP input. Held as transformers holds them, a DeepSeek-V3 block's experts
are two 3-D float32 tensors of 45 GB. Instead the experts module's forward is replaced, for that call only, by a loop
that reads one expert's stored tensors (a slice of a fused 3-D tensor, or the per-expert tensors Hub files hold),
computes its two views on every token and its output for the tokens routed to it, and frees it: one expert's weights
are alive at a time. The fingerprint's weight summaries read each expert again when they need it (`LazyExpert`), so
nothing holds the block's experts either.

Only the experts layout every transformers 5 MoE family shares is streamed this way: gate and up fused in halves,
(E, out, in), no biases, `act_fn(gate) * up` then down, outputs weighted by the router's top-k weights. Smaller blocks
(below `STREAM_BYTES`) and other layouts are loaded whole as before.
"""

from __future__ import annotations

import ctypes
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from scanner.errors import CheckpointError
from scanner.reading.activations import MLPActivations, site_activations, weighed
from scanner.reading.alike_experts import (
    Group,
    alike_groups,
    as_one,
    observed_routing,
    output_sketch,
    same_functions,
    sketch_directions,
)
from scanner.reading.architectures.module_tree import ModuleTree
from scanner.reading.architectures.names import DOWN_NAMES, GATE_NAMES, UP_NAMES
from scanner.reading.architectures.sites import MLPSite, SiteWeights

#: A site whose stored expert tensors hold more bytes than this is streamed expert by expert (its float32 copy would
#: be twice that, and transformers' fused copy as much again).
STREAM_BYTES = 1 << 30

#: glibc's malloc_trim, or None where the C library has none (macOS, musl).
_MALLOC_TRIM = getattr(ctypes.CDLL(None), "malloc_trim", None)


@dataclass(frozen=True)
class _Stored:
    """Where expert e's weights are stored: fused 3-D tensors sliced at e, or one tensor per expert and map."""

    gate_up: str | None = None        # (E, 2h, d)
    down: str | None = None           # (E, d, h)
    per_expert: dict[int, dict[str, str]] | None = None  # e -> {"gate"|"up"|"down": stored name}


class StreamedExperts:
    """One layer's routed-experts site, read and run expert by expert (see the module docstring)."""

    def __init__(self, tree: ModuleTree, site: MLPSite, stored: _Stored) -> None:
        self.tree, self.site, self._stored = tree, site, stored
        self.activations: list[MLPActivations] = []
        self.groups: list[Group] | None = None  # the experts read as one (alike_experts), once the forward ran
        self.routing_seen: bool | None = None  # whether the forward handed the routing on (else experts read alone)

    @classmethod
    def find(cls, tree: ModuleTree, layer: int, site: MLPSite) -> StreamedExperts | None:
        """The streamed form of this site, or None when its stored experts hold at most `STREAM_BYTES`, are of
        another layout, or are stored in a way this module does not slice (it is then loaded whole)."""
        if not (site.experts and site.kind == "gated" and site.fused == "halves" and not site.transposed
                and not site.stacked):
            return None
        module = tree.stack.layers[layer].get_submodule(site.path)
        if not hasattr(module, "act_fn") or any(name.endswith("_bias") for name, _ in module.named_parameters()):
            return None
        prefix = f"{tree.stack.layers_path}.{layer}.{site.path}."
        names = [n for n in tree.stored_by_layer.get(layer, []) if tree.model_keys[n].startswith(prefix)]
        checkpoint = tree.checkpoint
        stored_bytes = sum(math.prod(checkpoint.shape(n)) * getattr(torch, checkpoint.dtype(n)).itemsize for n in names)
        if stored_bytes <= STREAM_BYTES:
            return None
        stored = _fused(tree, names, prefix, site) or _per_expert(names, site)
        return None if stored is None else cls(tree, site, stored)

    @property
    def stored_names(self) -> list[str]:
        """The stored tensors this site reads itself (the layer's loader leaves them alone)."""
        if self._stored.per_expert is not None:
            return [n for parts in self._stored.per_expert.values() for n in parts.values()]
        return [self._stored.gate_up, self._stored.down]

    def weights(self, expert: int) -> SiteWeights:
        """Expert ``expert``'s maps, float32 on the CPU: gate and up (h, d), down (d, h)."""
        checkpoint = self.tree.checkpoint
        if self._stored.per_expert is not None:
            parts = self._stored.per_expert[expert]
            gate, up, down = (checkpoint.get(parts[p]).float() for p in ("gate", "up", "down"))
        else:
            gate, up = checkpoint.get_rows(self._stored.gate_up, [expert])[0].float().chunk(2, dim=0)
            down = checkpoint.get_rows(self._stored.down, [expert])[0].float()
        checkpoint.close()  # unmap: the pages one expert read must not add up over 256 experts in this process
        return SiteWeights(up=up, down=down, gate=gate)

    def forward(self, module: nn.Module, site_input: Callable[[], torch.Tensor],
                stream: Callable[[], torch.Tensor | None], activation: str, device: str, dtype: torch.dtype
                ) -> Callable[..., torch.Tensor]:
        """A replacement for the experts module's forward(hidden_states, top_k_index, top_k_weights): the routed
        output as the module computes it, and the views of every expert's canonical units on the site's input (every
        token, whatever the router chose) and on the residual ``stream`` collected in `activations`, one entry per
        group of experts the block chose together and weighed in proportion (scanner.reading.alike_experts; a
        group's weights are alive together)."""
        act = module.act_fn

        def run(hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
            out = torch.zeros_like(hidden_states)
            x = site_input()
            rows = stream()
            rows = rows if rows is not None and rows.shape[0] == x.shape[0] else None
            seen = observed_routing(top_k_index, top_k_weights, self.site.experts)
            self.routing_seen = seen is not None or self.site.experts < 2
            directions = sketch_directions(hidden_states.shape[-1])
            alone, sketches = [], []
            for expert in range(self.site.experts):  # one read per expert: its views, its sketch, its routed output
                w = self.weights(expert)
                alone += site_activations(x, [w], activation=activation, stream=rows)
                if seen is not None:
                    sketches.append(output_sketch(x, w, activation, directions))
                tokens, slot = torch.where(top_k_index == expert)
                if tokens.numel():
                    gate, up, down = (t.to(device=device, dtype=dtype) for t in (w.gate, w.up, w.down))
                    chosen = hidden_states[tokens]
                    routed = (act(chosen @ gate.T) * (chosen @ up.T)) @ down.T
                    out.index_add_(0, tokens, (routed * top_k_weights[tokens, slot, None]).to(out.dtype))
                del w
                _return_freed_heap()
            self.groups = alike_groups(seen, self.site.experts, same_functions(sketches) if seen is not None else None)
            for group in self.groups:  # experts read as one are read again together (only in a disguised block)
                if len(group.experts) == 1:
                    self.activations += weighed([alone[group.experts[0]]], [group.weight])
                    continue
                members = [self.weights(expert) for expert in group.experts]
                self.activations += weighed(site_activations(x, [as_one(members, group.ratios)],
                                                             activation=activation, stream=rows), [group.weight])
                del members
                _return_freed_heap()
            return out

        return run

    def lazy(self) -> list[LazyExpert]:
        """Each group's weights as the fingerprint's summaries ask for them, read again on demand."""
        return [LazyExpert(self, group) for group in self.groups or []]


class LazyExpert:
    """A group of experts' `SiteWeights` (scanner.reading.alike_experts.as_one) read from the checkpoint each time a
    map is asked for (a summary reads one map of one group at a time, so no block's experts are ever held
    together)."""

    gate_bias = up_bias = None

    def __init__(self, experts: StreamedExperts, group: Group) -> None:
        self._experts, self._group = experts, group

    def _map(self, part: str) -> torch.Tensor:
        members = [self._experts.weights(expert) for expert in self._group.experts]
        return getattr(as_one(members, self._group.ratios), part)

    @property
    def gate(self) -> torch.Tensor:
        return self._map("gate")

    @property
    def up(self) -> torch.Tensor:
        return self._map("up")

    @property
    def down(self) -> torch.Tensor:
        return self._map("down")


def _return_freed_heap() -> None:
    """Hand the heap pages that one expert's freed buffers leave back to the system. glibc keeps freed blocks under
    its dynamic mmap threshold (up to 32 MB) in the heap, below the activations allocated after them: without this a
    DeepSeek-V3-shaped block kept 18 MB per expert beyond its 4 MB of activations, 4.6 GB over 256 experts
    (BENCHMARKS.md)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _fused(tree: ModuleTree, names: list[str], prefix: str, site: MLPSite) -> _Stored | None:
    """The site's tensors stored as the module holds them (E, 2h, d) and (E, d, h), e.g. a synthetic or
    transformers-5-saved checkpoint."""
    by_key = {tree.model_keys[n]: n for n in names if tree.model_keys[n] == n}
    gate_up, down = by_key.get(prefix + site.up), by_key.get(prefix + site.down)
    if gate_up is None or down is None or len(names) != 2:
        return None
    return _Stored(gate_up=gate_up, down=down)


def _per_expert(names: list[str], site: MLPSite) -> _Stored | None:
    """The site's tensors stored one per expert and map, as Hub files hold them (`...experts.7.gate_proj.weight`)."""
    pattern = re.compile(r"(?:^|\.)(\d+)\.([A-Za-z0-9_]+)\.weight$")
    per_expert: dict[int, dict[str, str]] = {}
    for name in names:
        m = pattern.search(name)
        role = None if m is None else ("gate" if m.group(2) in GATE_NAMES else "up" if m.group(2) in UP_NAMES
                                       else "down" if m.group(2) in DOWN_NAMES else None)
        if role is None:
            return None
        per_expert.setdefault(int(m.group(1)), {})[role] = name
    complete = set(per_expert) == set(range(site.experts)) and all(len(p) == 3 for p in per_expert.values())
    if not complete:
        raise CheckpointError(f"{site.path}: the checkpoint stores {len(per_expert)} experts' maps in part, not the "
                              f"{site.experts} gate, up and down maps its config gives")
    return _Stored(per_expert=per_expert)
