"""The adaptive attack: a copy fine-tuned to keep its original's outputs while pushing each unit's views, as the test
reads them, away from the original's, and what that costs in model quality.

A copier who has read hubtrace's code knows the canonical inputs (their seed is public) and every view the test reads.
Starting from an exact copy, he minimises

    KL(original || copy) on text of the model's own language  +  weight * sum over the views read of
    mean over units of cos^2(the copy's view of unit i, the original's view of unit i)

by Adam, then permutes the units (which costs nothing). ``weight`` sets the price he is willing to pay: the larger
it is, the further the views move and the more the outputs change. `attack_curve` runs the attack at several
weights and reports, for each, the KL he paid (nats per token, on held-out text) beside the copy itself, which the
caller fingerprints and tests: log10 p against KL is what a near copy costs its maker (docs/statistics.md).

The views are computed the way the fingerprint computes them (scanner.activations), differentiably, on the copy's own
forward pass over the canonical tokens: for a gated MLP the gate pre-activation, the up output as stored and less its
projection on the gate (phi_MATCH's view), and what each unit writes read on the residual stream; for a plain MLP
the pre-activation, the write read-back less what the block's pre-activations predict (its second view), and the raw
write read-back.
"""

from __future__ import annotations

import copy as copying
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from scanner.activations import unpredicted, unpredicted_up_to_sign
from scanner.architectures.module_tree import decoder_stack
from scanner.architectures.norms import mean_free, norms_remove_mean
from scanner.architectures.sites import MLPSite, find_sites, site_weights
from scanner.canonical_mlp import odd_linear
from scanner.stats.matching import unit_rows_tensor
from scanner.stats.views import oriented_rows
from scanner.testing import adversary as adv
from scanner.testing.adversary import mlp_activation

#: The views an attacker can push, by name: every view the fingerprint holds or the test derives.
VIEWS = ("gate", "up", "up_decoupled", "write")
#: The views phi_MATCH reads, per MLP kind (scanner.stats.independence): what an attacker who read the code pushes.
READ_VIEWS = {"gated": ("gate", "up_decoupled", "write"), "plain": ("gate", "up", "write")}


def read_views(mlp_kind: str) -> tuple[str, ...]:
    """The views the test reads for units of ``mlp_kind`` ("gated" or "plain")."""
    return READ_VIEWS[mlp_kind]

TextSampler = Callable[[torch.Generator], torch.Tensor]
"""Draws a batch of token ids (batch, length) of the model's own language from a generator."""


@dataclass(frozen=True)
class AttackedCopy:
    """A copy after the attack (units permuted), the KL it cost on held-out text and how far its views moved."""

    model: PreTrainedModel
    weight: float
    kl: float  # nats per token, KL(original || copy), on text the attack never trained on
    agreement: dict[str, float]  # view -> mean cos^2 with the original's, after the attack (1 for an exact copy)


def attack(original: PreTrainedModel, text: TextSampler, canonical: torch.Tensor, *, weight: float,
           views: Sequence[str] = VIEWS, steps: int = 150, lr: float = 1e-3, seed: int = 0) -> AttackedCopy:
    """The adaptive attack at one price ``weight`` (see the module): ``canonical`` the canonical token ids the
    fingerprint reads (n_sequences, seq_len)."""
    unknown = set(views) - set(VIEWS)
    if unknown:
        raise ValueError(f"unknown views {sorted(unknown)}; the attack pushes {', '.join(VIEWS)}")
    original = original.eval()
    with torch.no_grad():
        targets = {k: unit_rows_tensor(v.detach()) for k, v in _views(original, canonical).items()}
    # fine-tuned in eval mode: dropout (GPT-2's 0.1) would make the copy imitate the original's outputs under
    # dropout, and cost KL without the views pushing (GPT-2: 0.012 nats/token at weight 0)
    model = copying.deepcopy(original).eval()
    for parameter in model.parameters():
        parameter.requires_grad_(True)
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        batch = text(generator)
        loss = _kl(original, model, batch)
        if weight > 0:
            loss = loss + weight * _agreement(_views(model, canonical), targets, views).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        held_out = torch.Generator().manual_seed(seed + 1_000_003)
        kl = float(torch.stack([_kl(original, model, text(held_out)) for _ in range(4)]).mean())
        agreement = _agreement(_views(model, canonical), targets, views)
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    permuted = adv.apply(adv.permute_units, model, seed)
    return AttackedCopy(permuted, weight, kl, {v: float(a) for v, a in zip(views, agreement, strict=True)})


def attack_curve(original: PreTrainedModel, text: TextSampler, canonical: torch.Tensor, weights: Sequence[float],
                 **options) -> list[AttackedCopy]:
    """`attack` at each price in ``weights`` (one copy each, from the same start)."""
    return [attack(original, text, canonical, weight=w, **options) for w in weights]


def _kl(original: PreTrainedModel, model: PreTrainedModel, batch: torch.Tensor) -> torch.Tensor:
    """Mean KL(original || model) per token on a batch, in nats."""
    with torch.no_grad():
        reference = torch.log_softmax(original(input_ids=batch, use_cache=False).logits.float(), dim=-1)
    logits = torch.log_softmax(model(input_ids=batch, use_cache=False).logits.float(), dim=-1)
    return (reference.exp() * (reference - logits)).sum(dim=-1).mean()


def _agreement(views: dict[tuple[str, int, int], torch.Tensor], targets: dict[tuple[str, int, int], torch.Tensor],
               names: Sequence[str]) -> torch.Tensor:
    """Per view name: the mean over every MLP's units of cos^2 between the copy's view and the original's."""
    out = []
    for name in names:
        keys = [k for k in targets if k[0] == name]
        cosines = torch.cat([(unit_rows_tensor(views[k]) * targets[k]).sum(dim=1) for k in keys])
        out.append(cosines.square().mean())
    return torch.stack(out)


def _views(model: PreTrainedModel, canonical: torch.Tensor) -> dict[tuple[str, int, int], torch.Tensor]:
    """(view, block, MLP) -> (units, tokens): every view in `VIEWS` of every MLP, from the model's forward pass on
    the canonical ids, carrying gradients to its weights."""
    stack = decoder_stack(model)
    captured: dict[tuple[int, str], torch.Tensor] = {}
    hooks = []
    sites: list[tuple[int, nn.Module, MLPSite]] = []
    for index, layer in enumerate(stack.layers):
        found = find_sites(layer)
        if not found:
            continue
        hooks.append(layer.register_forward_pre_hook(_keep(captured, (index, "stream")), with_kwargs=True))
        for site in found:
            sites.append((index, layer, site))
            module = layer.get_submodule(site.input_modules[0]) if site.input_modules[0] else layer
            hooks.append(module.register_forward_pre_hook(_keep(captured, (index, site.path)), with_kwargs=True))
    try:
        model(input_ids=canonical, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    out: dict[tuple[str, int, int], torch.Tensor] = {}
    for block, (index, layer, site) in enumerate(sites):
        x = captured[(index, site.path)].reshape(-1, captured[(index, site.path)].shape[-1]).float()
        stream = captured[(index, "stream")]
        stream = stream.reshape(-1, stream.shape[-1]).float()
        if norms_remove_mean(layer, stream.shape[-1]):  # as the fingerprint reads it (scanner.streaming)
            stream = mean_free(stream)
        stream = stream / torch.linalg.vector_norm(stream, dim=1, keepdim=True).clamp_min(1e-30)
        for expert, w in enumerate(site_weights(layer, site, trainable=True)):
            first = x @ (w.gate if w.gate is not None else w.up).T
            bias = w.gate_bias if w.gate is not None else w.up_bias
            first = (first if bias is None else first + bias).T
            write = (stream @ w.down).T
            if w.gate is not None:
                up = x @ w.up.T
                up = (up if w.up_bias is None else up + w.up_bias).T
                g, u = unit_rows_tensor(first), unit_rows_tensor(up)
                decoupled = u - (u * g).sum(dim=1, keepdim=True) * g
            else:
                up = decoupled = unpredicted(unit_rows_tensor(write.double()), unit_rows_tensor(first.double()))
                write = _plain_write_view(model, first, write)
            for name, view in (("gate", first), ("up", up), ("up_decoupled", decoupled), ("write", write)):
                out[(name, block, expert)] = view.float()
    return out


def _plain_write_view(model: PreTrainedModel, first: torch.Tensor, write: torch.Tensor) -> torch.Tensor:
    """A plain MLP's write view as scanner.activations.plain_views keeps it: where the activation makes the gate's
    sign free, the read-back less its prediction by the first views up to each unit's sign (which phi_MATCH reads);
    elsewhere the read-back (which it does not)."""
    if odd_linear(mlp_activation(model)):
        return unpredicted_up_to_sign(unit_rows_tensor(write.double()), oriented_rows(unit_rows_tensor(first.double())))
    return write


def _keep(sink: dict, key: tuple) -> Callable[..., None]:
    """A forward pre-hook that keeps a module's first input (its hidden states) under ``key``."""

    def hook(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        if key not in sink:
            sink[key] = args[0] if args else next(v for v in kwargs.values() if isinstance(v, torch.Tensor))

    return hook
