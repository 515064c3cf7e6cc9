"""Routed experts that the router chose together and weighed in proportion on every canonical token, read as one.

An MoE block writes sum_e w_e(x) expert_e(x). Two experts that the router chooses on the same tokens with weights in
a constant ratio c are one expert: w_e(x) (expert_e(x) + c expert_f(x)) is an MLP of both experts' units, the second
one's output columns times c. A copier can use that to cut an expert into shards that share its router row (each too
small to test, and paired one to one with only as many of the original's experts as it has), to store a dense MLP as
shards that are always on, or to hide a unit whose write cancels only against a twin expert's
(bench/redteam/canonical53); read as one expert, each of these is the expert it came from, and the canonical form
(scanner.reading.canonical_mlp) sees all its units together, each weighed as the block weighs it.

What decides is the routing the block itself computed on the canonical tokens (which experts it chose for each token,
with which weights: the arguments transformers passes its experts module), not the router's rows or biases: a bias may
only select (DeepSeek-V3's score correction), a group-limited top-k may choose whole groups, and an expert whose
logits equal another's may never be chosen, so that joined with it, its cancelling twin would erase it
(bench/redteam/canonical54). An expert chosen on no canonical token does no work on them and is left out, as a unit
that writes nothing is (the pairing once took such copies of shards for the original's experts: canonical56), unless
none is chosen at all. Each expert joins the group of the first expert, in stored order, chosen on exactly its tokens
with log-weights a constant apart to `SAME_LOG_WEIGHT` (or the weights' own float resolution, if coarser), so no chain
of small steps joins experts further apart than that. Trained routers choose every two experts on different tokens
(`python bench/bench_router_spread.py`), so in an ordinary MoE every expert is its own group; the groups are a
function of one model's weights, which keeps phi_MATCH's null argument. The routing is read where the block hands it
on: the arguments of the experts module or of a module holding it (DBRX calls its experts' MLP once per expert, inside
a module given the routing); else a router's output, where it is each token's weight for every expert (Llama 4's,
which weighs the experts' inputs: shards of one expert are then given one input) or slots sorted by expert (JetMoE's).
Where none is seen, every expert stays alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import TypeVar

import torch
from transformers.activations import ACT2FN

from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights

#: Two experts chosen on the same tokens are weighed in proportion when the log of their weights' ratio varies by at
#: most this over those tokens (0.1% of the weight). Far above float32 rounding, far below what tells trained experts
#: apart, and as tight as the outputs can tell: shards weighed further apart move the block's output by as much.
SAME_LOG_WEIGHT = 1e-3

#: Two experts compute one function when their outputs on the canonical tokens, read through `SKETCH` fixed random
#: directions of the stream, differ by at most this fraction of the larger (float32 rounding leaves about 1e-6).
SAME_OUTPUT = 1e-4
#: Directions of the stream an expert's output is read through to compare it with another's (a fixed seed: a function
#: of the width alone, so every model of one width is read alike).
SKETCH = 64
#: Canonical tokens an expert's output is compared on (the first ones): 16 x 64 values that two different trained
#: experts never share to 1e-4, at a sixteenth of the cost of the block's own views.
SKETCH_TOKENS = 16

Weights = TypeVar("Weights", GLUWeights, SiteWeights)


@dataclass(frozen=True)
class Routing:
    """The weight the block gave each routed expert on each canonical token, (experts, tokens) float64, 0 where it was
    not chosen; and the relative float resolution of the weights as computed."""

    weights: torch.Tensor
    resolution: float


def observed_routing(top_k_index: object, top_k_weights: object, experts: int) -> Routing | None:
    """The routing from an experts module's arguments (tokens, k) (chosen experts, their weights), or None where they
    are not such a pair (the module is called another way). Indices outside [0, experts) choose nothing (transformers
    pads with ``experts``)."""
    if not (isinstance(top_k_index, torch.Tensor) and isinstance(top_k_weights, torch.Tensor)
            and top_k_index.dim() == 2 and top_k_index.shape == top_k_weights.shape
            and not top_k_index.is_floating_point() and top_k_weights.is_floating_point()):
        return None
    index = top_k_index.detach().to("cpu", torch.int64)
    values = top_k_weights.detach().to("cpu", torch.float64)
    chosen = (index >= 0) & (index < experts)
    weights = torch.zeros(experts, index.shape[0], dtype=torch.float64)
    tokens = torch.arange(index.shape[0])[:, None].expand_as(index)
    weights.index_put_((index[chosen], tokens[chosen]), values[chosen], accumulate=True)
    return Routing(weights, float(torch.finfo(top_k_weights.dtype).eps))


def routing_from_scores(output: object, experts: int, top_k: object = None) -> Routing | None:
    """The routing from what a router module returned, where it returns first each token's weight for every expert
    (tokens, experts), 0 for the experts it did not choose, as Llama 4's does (its experts module is given inputs
    already weighed); None where its first output is not such a table. A table marks the choice only where no token
    has more non-zero weights than the router's ``top_k`` (its attribute, where it has one) or, without one, than
    experts less one: a router that returns every expert's probability first and chooses among them afterwards (DBRX)
    gives no such table, and an expert it never chooses must not be read with one it does."""
    scores = output[0] if isinstance(output, tuple) and output else output
    if not (isinstance(scores, torch.Tensor) and scores.is_floating_point() and scores.dim() == 2
            and scores.shape[1] == experts and bool(torch.isfinite(scores).all()) and bool((scores >= 0).all())):
        return None
    most = top_k if isinstance(top_k, int) and 0 < top_k <= experts else experts - 1
    if int((scores != 0).sum(dim=1).max()) > most:
        return None
    return Routing(scores.detach().to("cpu", torch.float64).T.contiguous(), float(torch.finfo(scores.dtype).eps))


def routing_from_slots(output: object, experts: int) -> Routing | None:
    """The routing from a router that returns its choices as slots sorted by expert, as JetMoE's does: (sorted slot
    order, each slot's token, each slot's weight, slots per expert, logits (tokens, experts)); None where the output
    is not that."""
    if not (isinstance(output, tuple) and len(output) >= 5):
        return None
    _, tokens, gates, sizes, logits = output[:5]
    sizes = torch.as_tensor(sizes) if isinstance(sizes, (list, tuple, torch.Tensor)) else None
    if not (isinstance(tokens, torch.Tensor) and isinstance(gates, torch.Tensor) and isinstance(logits, torch.Tensor)
            and sizes is not None and tokens.dim() == 1 and tokens.shape == gates.shape
            and not tokens.is_floating_point() and gates.is_floating_point() and logits.dim() == 2
            and logits.shape[1] == experts and sizes.shape == (experts,) and int(sizes.sum()) == tokens.numel()):
        return None
    slot_experts = torch.repeat_interleave(torch.arange(experts), sizes.to("cpu", torch.int64))
    weights = torch.zeros(experts, logits.shape[0], dtype=torch.float64)
    weights.index_put_((slot_experts, tokens.detach().to("cpu", torch.int64)),
                       gates.detach().to("cpu", torch.float64), accumulate=True)
    return Routing(weights, float(torch.finfo(gates.dtype).eps))


def sketch_directions(width: int) -> torch.Tensor:
    """The fixed (width, SKETCH) random directions experts' outputs are read through, float64."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(width, min(SKETCH, width), generator=generator, dtype=torch.float64)


def output_sketch(site_input: torch.Tensor, expert: SiteWeights | GLUWeights, activation: str,
                  directions: torch.Tensor) -> torch.Tensor:
    """An expert's output on the first `SKETCH_TOKENS` rows of ``site_input`` (tokens, d), unweighed, read through
    ``directions`` (d_out, k), as one float64 vector on the CPU. Computed where the expert's maps are, in their dtype
    and at least float32 (no copy of them: an expert of Mixtral-8x7B's would take 1.4 GB in float64); a copy's
    rounding differs from its original's by about 1e-6, far below `SAME_OUTPUT`."""
    dtype, device = torch.promote_types(expert.up.dtype, torch.float32), expert.up.device
    x = site_input.reshape(-1, site_input.shape[-1])[:SKETCH_TOKENS].detach().to(device, dtype)
    act = ACT2FN[activation] if activation in ACT2FN else ACT2FN["silu"]
    up = x @ expert.up.detach().to(dtype).T
    up = up if getattr(expert, "up_bias", None) is None else up + expert.up_bias.detach().to(dtype)
    if expert.gate is None:
        hidden = act(up)
    else:
        gate = x @ expert.gate.detach().to(dtype).T
        gate = gate if getattr(expert, "gate_bias", None) is None else gate + expert.gate_bias.detach().to(dtype)
        hidden = act(gate) * up
    read = expert.down.detach().to(dtype).T @ directions.to(device, dtype)  # (h, k)
    return (hidden @ read).double().cpu().reshape(-1)


def same_functions(sketches: Sequence[torch.Tensor]) -> list[list[int]]:
    """Experts that compute one function (their `output_sketch` es agree to `SAME_OUTPUT`), in stored order, each
    joining the first it agrees with."""
    groups: list[list[int]] = []
    for expert, sketch in enumerate(sketches):
        size = float(sketch.norm())
        lead = next((g for g in groups if float((sketches[g[0]] - sketch).norm())
                     <= SAME_OUTPUT * max(size, float(sketches[g[0]].norm()))), None)
        if lead is None:
            groups.append([expert])
        else:
            lead.append(expert)
    return groups


@dataclass(frozen=True)
class Group:
    """Experts read as one: their indices in stored order, each one's weight relative to the first's, and the weight
    the block gave the group's output (read as one) on each canonical token, (tokens,) float64, where the routing was
    seen (the contributions that choose a block's pooled units read it: scanner.reading.activations)."""

    experts: list[int]
    ratios: list[float]
    weight: torch.Tensor | None = None


def alike_groups(routing: Routing | None, experts: int, functions: list[list[int]] | None = None) -> list[Group]:
    """The block's routed experts grouped (see the module), in stored order of their first experts: those that compute
    one function (``functions``, from `same_functions`; each such set one expert weighed by their summed weights, its
    members' outputs shared equally), then those the ``routing`` chose on the same tokens with weights in a constant
    ratio; those chosen on no token left out. Every expert alone where the routing was not seen, is not of this many
    experts or chooses none of them (a block whose routed experts do no work is read as it is stored, and its units
    then write nothing)."""
    if routing is None or routing.weights.shape[0] != experts:
        return [Group([e], [1.0]) for e in range(experts)]
    alone = [Group([e], [1.0], routing.weights[e]) for e in range(experts)]
    if experts < 2:
        return alone
    functions = functions if functions is not None and sorted(e for f in functions for e in f) == list(range(experts)) \
        else [[e] for e in range(experts)]
    weights = torch.stack([routing.weights[f].sum(dim=0) for f in functions])
    chosen = weights != 0
    if not bool(chosen.any()):
        return alone
    logs = torch.where(chosen, weights.abs().clamp_min(torch.finfo(torch.float64).tiny).log(), 0.0)
    bar = max(SAME_LOG_WEIGHT, 8 * routing.resolution)
    joined: list[Group] = []
    for one in (f for f in range(len(functions)) if bool(chosen[f].any())):
        lead = next((g for g in joined if _one_expert(chosen, logs, weights, g.experts[0], one, bar)), None)
        if lead is None:
            joined.append(Group([one], [1.0], weights[one]))
            continue
        first = lead.experts[0]
        on = chosen[first]
        lead.experts.append(one)
        lead.ratios.append(float((weights[one, on] / weights[first, on]).mean()))
    return [Group([e for f in g.experts for e in functions[f]],
                  [r / len(functions[f]) for f, r in zip(g.experts, g.ratios, strict=True) for _ in functions[f]],
                  g.weight)
            for g in joined]


def _one_expert(chosen: torch.Tensor, logs: torch.Tensor, weights: torch.Tensor, first: int, expert: int,
                bar: float) -> bool:
    """Whether ``expert`` is chosen on exactly ``first``'s tokens (some), with the same signs and log-weights a constant
    apart to ``bar``."""
    on = chosen[first]
    if not bool(on.any()) or not torch.equal(on, chosen[expert]):
        return False
    if not torch.equal(weights[first, on] > 0, weights[expert, on] > 0):
        return False
    gaps = logs[expert, on] - logs[first, on]
    return float(gaps.max() - gaps.min()) <= bar


def joined_routed(experts: Sequence[Weights], routed: int, routing: Routing | None, site_input: torch.Tensor,
                  activation: str) -> tuple[list[Weights], list[torch.Tensor | None]]:
    """A block's MLPs with its first ``routed`` (the routed experts) joined by `alike_groups` (those never chosen left
    out; the experts' functions compared on ``site_input``) and the rest (shared experts, a dense MLP) as they are;
    and the weight the block gives each joined routed expert on each token (None where the routing was not seen; as
    many as the routed experts left)."""
    functions = None
    if routing is not None and routed > 1:
        directions = sketch_directions(experts[0].down.shape[0])
        functions = same_functions([output_sketch(site_input, w, activation, directions) for w in experts[:routed]])
    groups = alike_groups(routing, routed, functions)
    return [*(as_one([experts[e] for e in g.experts], g.ratios) for g in groups), *experts[routed:]], \
        [g.weight for g in groups]


def as_one(members: Sequence[Weights], ratios: Sequence[float] | None = None) -> Weights:
    """One expert of the members' units side by side (rows of the input maps, columns of the output map, each member's
    times its weight ``ratios`` to the first's, biases where any member has them, zeros for the members without); a
    single member as it is."""
    if len(members) == 1:
        return members[0]
    ratios = list(ratios) if ratios is not None else [1.0] * len(members)
    units = [m.down.shape[1] for m in members]
    parts = {}
    for part in fields(members[0]):
        values = [getattr(m, part.name) for m in members]
        if all(v is None for v in values):
            parts[part.name] = None
        elif part.name == "down":
            parts[part.name] = torch.cat([v if r == 1.0 else v * r for v, r in zip(values, ratios, strict=True)], dim=1)
        else:
            like = next(v for v in values if v is not None)
            parts[part.name] = torch.cat([v if v is not None else like.new_zeros((h, *like.shape[1:]))
                                          for v, h in zip(values, units, strict=True)])
    return replace(members[0], **parts)
