"""Routed experts that the router weighs in proportion at every token, read as one expert.

An MoE block writes sum_e w_e(x) expert_e(x), and the routers hubtrace reads compute expert e's weight from its own
logit, its router row times the block's input, together with the others': softmax or sigmoid, top-k, renormalised
or not, with biases added to the logits or used only to select. Two experts whose logits are equal at every token
get equal weights whatever the router does, and are chosen together; under a softmax (or with rows that are zero,
under any router) logits that differ by a constant give weights in a constant ratio. Either way the two are one
expert: w_e(x) (expert_e(x) + c expert_f(x)) is an MLP whose units are both experts' units. A copier can use that to
cut an expert into shards that share its router row (each too small to test, and paired one to one with only as
many of the original's experts as it has), to store a dense MLP as shards that are always on, or to hide a unit whose
write cancels only against a twin expert's (bench/redteam/canonical53); read as one expert, each of these is the
expert it came from, and the canonical form (scanner.reading.canonical_mlp) sees all its units together.

Experts are compared by what the router computes on the canonical tokens, not by their stored rows (what a row holds
along directions the input never takes is the copier's to set, as for the gates), in the logit's own units (nats,
for a softmax): two experts are weighed in proportion when their logits' difference varies by at most `SAME_LOGIT`
over the tokens. Biases are not read: a constant offset is allowed whatever made it. Each expert joins the group of
the first expert, in stored order, it is so close to, so no chain of small steps joins experts further apart than
that. A group's experts are joined as stored, their outputs not scaled by the constant ratio of their weights (which
only a softmax router fixes, and which the canonical form needs only where a unit is split across experts weighed
unequally; shards of one row and always-on shards are weighed equally). A trained router keeps its experts far
apart (rows that agree on every token could not route between them), so in an ordinary MoE every expert is its own
group; the groups are a function of one model's weights, which keeps phi_MATCH's null argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import TypeVar

import torch

from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights

#: Two experts are weighed in proportion when their logits' difference varies by at most this over the canonical
#: tokens (nats for a softmax router: the weights' ratio stays within 0.1%). Far above a logit's float rounding (1e-6
#: of its size), far below what separates a trained router's experts, and tighter than a copier's freedom: shards
#: whose logits move apart by more have weights, and give a block output, that move by as much.
SAME_LOGIT = 1e-3

Weights = TypeVar("Weights", GLUWeights, SiteWeights)


def alike_groups(router: torch.Tensor | None, site_input: torch.Tensor, experts: int) -> list[list[int]]:
    """The block's routed experts grouped by the logits the ``router`` rows (experts, d) give them on ``site_input``
    (tokens, d): lists of expert indices in stored order, each led by its first. Without router rows of the experts'
    count and the input's width, every expert is its own group."""
    if router is None or experts < 2 or tuple(router.shape) != (experts, site_input.shape[-1]):
        return [[e] for e in range(experts)]
    x = site_input.reshape(-1, site_input.shape[-1]).detach().to(device="cpu", dtype=torch.float64)
    logits = router.detach().to(device="cpu", dtype=torch.float64) @ x.T  # (experts, tokens)
    leads: list[int] = []
    groups: list[list[int]] = []
    for expert in range(experts):
        if leads:
            differences = logits[leads] - logits[expert]
            spreads = differences.amax(dim=1) - differences.amin(dim=1)
            nearest = int(torch.argmin(spreads))
            if float(spreads[nearest]) <= SAME_LOGIT:
                groups[nearest].append(expert)
                continue
        leads.append(expert)
        groups.append([expert])
    return groups


def joined_routed(experts: Sequence[Weights], routed: int, router: torch.Tensor | None,
                  site_input: torch.Tensor) -> tuple[list[Weights], int]:
    """A block's MLPs with its first ``routed`` (the routed experts) joined by `alike_groups` and the rest (shared
    experts, a dense MLP) as they are; and how many routed experts that leaves."""
    groups = alike_groups(router, site_input, routed)
    return [*(as_one([experts[e] for e in group]) for group in groups), *experts[routed:]], len(groups)


def as_one(members: Sequence[Weights]) -> Weights:
    """One expert of the members' units side by side (rows of the input maps, columns of the output map, biases where
    any member has them, zeros for the members without); a single member as it is."""
    if len(members) == 1:
        return members[0]
    units = [m.down.shape[1] for m in members]
    parts = {}
    for part in fields(members[0]):
        values = [getattr(m, part.name) for m in members]
        if all(v is None for v in values):
            parts[part.name] = None
        elif part.name == "down":
            parts[part.name] = torch.cat(values, dim=1)
        else:
            like = next(v for v in values if v is not None)
            parts[part.name] = torch.cat([v if v is not None else like.new_zeros((h, *like.shape[1:]))
                                          for v, h in zip(values, units, strict=True)])
    return replace(members[0], **parts)
