"""Routed experts that the router always weighs alike, read as one expert.

An MoE block writes sum_e w_e(x) expert_e(x), and every router hubtrace reads computes expert e's weight from its
own logit (its router row on the block's input, plus its biases) and the set of all logits: softmax or sigmoid,
top-k, renormalised or not. Experts with one logit at every token therefore get one weight at every token and are
chosen together, and together they are one expert: w(x) (expert_e(x) + expert_f(x)) is an MLP whose units are both
experts' units. A copier can use that to cut an expert into shards that share its router row (each too small to
test, and paired one to one with only as many of the original's experts as it has), to store a dense MLP as shards
that are always on, or to hide a unit whose write cancels only against a twin expert's; read as one expert, each of
these is the expert it came from, and the canonical form (scanner.reading.canonical_mlp) sees all its units at once
(bench/redteam/canonical53).

Alike is judged on what the router computes on the canonical tokens, not on its stored rows (what a row holds along
directions the input never takes is the copier's to set, as for the gates), and in the logit's own units: a softmax
router's logit difference is the log of the two weights' ratio, a sigmoid's moves the weight by at most a quarter of
it. Experts whose logits, and each bias the router adds or selects by, agree to `SAME_LOGIT` at every token join
the group of the first expert (in stored order) they agree with, so no chain of small steps joins experts further
apart than that. Trained routers keep their experts far apart (a router whose rows agree on every token could not
route), so for an ordinary MoE every expert stays its own; the groups are a function of one model's weights, which
keeps phi_MATCH's null argument.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import TypeVar

import torch

from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import Router, SiteWeights

#: Two experts are weighed alike when their logits differ by at most this at every canonical token (nats for a
#: softmax router: the weights' ratio is within 0.1% of one). Far above float rounding of a logit (1e-6 of its
#: size), far below what separates a trained router's experts, and as tight as the outputs can tell: a copier who
#: moves shards' logits further apart moves their weights, and the block's output, by as much.
SAME_LOGIT = 1e-3

Weights = TypeVar("Weights", GLUWeights, SiteWeights)


def alike_groups(router: Router | None, site_input: torch.Tensor, experts: int) -> list[list[int]]:
    """The block's routed experts grouped by the logits the router gives them on ``site_input`` (tokens, d): lists of
    expert indices in stored order, each group led by its first. Without a router of the experts' count and the
    input's width, every expert is its own group."""
    alone = [[e] for e in range(experts)]
    if router is None or experts < 2 or tuple(router.weight.shape) != (experts, site_input.shape[-1]):
        return alone
    if any(tuple(b.shape) != (experts,) for b in router.biases):
        return alone
    x = site_input.reshape(-1, site_input.shape[-1]).detach().to(device="cpu", dtype=torch.float64)
    logits = router.weight.detach().to(device="cpu", dtype=torch.float64) @ x.T  # (experts, tokens)
    columns = torch.cat([logits, *(b.detach().to(device="cpu", dtype=torch.float64)[:, None] for b in router.biases)],
                        dim=1)
    leads: list[int] = []
    groups: list[list[int]] = []
    for expert in range(experts):
        if leads:
            gaps = (columns[leads] - columns[expert]).abs().amax(dim=1)
            nearest = int(torch.argmin(gaps))
            if float(gaps[nearest]) <= SAME_LOGIT:
                groups[nearest].append(expert)
                continue
        leads.append(expert)
        groups.append([expert])
    return groups


def joined_routed(experts: Sequence[Weights], routed: int, router: Router | None,
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
