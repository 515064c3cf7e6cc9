"""Routed experts chosen together and weighed in proportion on every canonical token are read as one
(scanner.reading.alike_experts): which experts group, with which weight ratios, that an expert never chosen stays
alone, that no chain of small steps joins far ones, and that a group computes what its members did."""

from __future__ import annotations

import pytest
import torch

from scanner.reading.alike_experts import (
    SAME_LOG_WEIGHT,
    Routing,
    alike_groups,
    as_one,
    joined_routed,
    observed_routing,
    routing_from_scores,
    routing_from_slots,
)
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights

TOKENS = 64


def _routing(weights: list[list[float]] | torch.Tensor) -> Routing:
    """A routing of float32 weights (experts, tokens), 0 where an expert was not chosen."""
    return Routing(torch.as_tensor(weights, dtype=torch.float64), float(torch.finfo(torch.float32).eps))


def _chosen(seed: int, share: float = 0.5) -> torch.Tensor:
    """Random positive weights on a random half of the tokens."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(TOKENS, generator=g) + 0.1) * (torch.rand(TOKENS, generator=g) < share)


def _members(groups) -> list[list[int]]:
    return [g.experts for g in groups]


def test_the_routing_is_read_from_the_experts_modules_arguments() -> None:
    index = torch.tensor([[0, 2], [1, 3], [2, 4]])  # 4 pads a choice (transformers' extra class)
    weights = torch.tensor([[0.7, 0.3], [0.6, 0.4], [1.0, 0.0]])
    routing = observed_routing(index, weights, 4)
    expected = torch.tensor([[0.7, 0, 0], [0, 0.6, 0], [0.3, 0, 1.0], [0, 0.4, 0]], dtype=torch.float64)
    torch.testing.assert_close(routing.weights, expected, rtol=1e-6, atol=0)
    assert routing.resolution == torch.finfo(torch.float32).eps
    assert observed_routing(None, None, 4) is None
    assert observed_routing(weights, weights, 4) is None  # not a (chosen experts, weights) pair
    assert observed_routing(torch.zeros(3, 2, 5, dtype=torch.long), torch.zeros(3, 2, 5), 4) is None


def test_the_routing_is_read_from_a_routers_table_of_weights_where_the_experts_are_not_given_it() -> None:
    scores = torch.tensor([[0.0, 0.8, 0.0], [0.3, 0.0, 0.0]])  # Llama 4: sigmoid of the chosen logits, 0 elsewhere
    routing = routing_from_scores((scores, torch.randn(2, 3)), 3)
    torch.testing.assert_close(routing.weights, scores.double().T)
    assert routing_from_scores(torch.randn(2, 3) - 5, 3) is None  # logits, not weights
    assert routing_from_scores((scores,), 4) is None
    assert routing_from_scores(None, 3) is None
    every = torch.softmax(torch.randn(2, 3), dim=1)  # every expert's probability, chosen among afterwards (DBRX)
    assert routing_from_scores(every, 3) is None and routing_from_scores(every, 3, top_k=2) is None
    assert routing_from_scores(every, 3, top_k=3) is not None  # every expert chosen for every token


def test_the_routing_is_read_from_slots_sorted_by_expert() -> None:
    """JetMoE's gating: (sorted slot order, each slot's token, its weight, slots per expert, logits)."""
    tokens, gates = torch.tensor([1, 0, 2, 0]), torch.tensor([0.9, 0.4, 0.5, 0.6])
    output = (torch.arange(4), tokens, gates, [1, 0, 3], torch.randn(3, 3))  # expert 0: token 1; expert 2: 0, 2, 0
    routing = routing_from_slots(output, 3)
    expected = torch.tensor([[0, 0.9, 0], [0, 0, 0], [1.0, 0, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(routing.weights, expected, rtol=1e-6, atol=0)
    assert routing_from_slots(output, 4) is None
    assert routing_from_slots(output[:4], 3) is None
    assert routing_from_slots((output[0], tokens, gates, [1, 0, 2], output[4]), 3) is None  # slots do not add up


def test_shards_chosen_together_group_with_their_weight_ratios() -> None:
    a, b = _chosen(1), _chosen(2)
    routing = _routing(torch.stack([a, b, a / 4, a * 3.0, b, _chosen(3)]))
    groups = alike_groups(routing, 6)
    assert _members(groups) == [[0, 2, 3], [1, 4], [5]]
    assert groups[0].ratios == pytest.approx([1.0, 0.25, 3.0], rel=1e-7) and groups[1].ratios == [1.0, 1.0]


def test_an_expert_never_chosen_is_left_out_whatever_it_would_cancel() -> None:
    """The anti-twin of bench/redteam/canonical54 (a twin with its expert's logits and negated writes, never chosen)
    and canonical56's never-chosen copies of shards: neither is read with anything, nor read at all."""
    a = _chosen(4)
    routing = _routing(torch.stack([a, torch.zeros(TOKENS), torch.zeros(TOKENS), _chosen(5)]))
    assert _members(alike_groups(routing, 4)) == [[0], [3]]
    assert _members(alike_groups(None, 4)) == [[0], [1], [2], [3]]  # without the routing nothing is known idle
    assert _members(alike_groups(_routing(torch.zeros(3, TOKENS)), 3)) == [[0], [1], [2]]  # none chosen: as stored


def test_experts_chosen_on_other_tokens_or_weighed_unlike_stay_apart() -> None:
    a = _chosen(6)
    other_tokens = a.clone()
    other_tokens[int(torch.nonzero(a)[0])] = 0.0  # one token fewer
    wobble = a * torch.exp(4 * SAME_LOG_WEIGHT * torch.linspace(-0.5, 0.5, TOKENS))  # ratio moves by 4 bars
    assert _members(alike_groups(_routing(torch.stack([a, other_tokens, wobble])), 3)) == [[0], [1], [2]]


def test_no_chain_of_small_steps_joins_experts_further_apart_than_the_bar() -> None:
    a = _chosen(7)
    step = torch.exp(0.6 * SAME_LOG_WEIGHT * torch.linspace(-0.5, 0.5, TOKENS))
    routing = _routing(torch.stack([a * step**k for k in range(4)]))  # each 0.6 bars from the next
    assert _members(alike_groups(routing, 4)) == [[0, 1], [2, 3]]


def test_without_a_routing_of_the_right_size_every_expert_is_its_own() -> None:
    assert _members(alike_groups(None, 3)) == [[0], [1], [2]]
    assert _members(alike_groups(_routing(torch.ones(2, TOKENS)), 3)) == [[0], [1], [2]]


def test_a_group_computes_what_its_members_did_and_the_rest_of_the_block_stays() -> None:
    g = torch.Generator().manual_seed(8)
    experts = [SiteWeights(up=torch.randn(h, 16, generator=g), down=torch.randn(16, h, generator=g),
                           gate=torch.randn(h, 16, generator=g),
                           up_bias=torch.randn(h, generator=g) if h == 3 else None) for h in (3, 5, 2)]
    shared = SiteWeights(up=torch.randn(7, 16, generator=g), down=torch.randn(16, 7, generator=g))
    a = _chosen(9)
    routing = _routing(torch.stack([a, a * 0.5, _chosen(10)]))
    weights, routed = joined_routed([*experts, shared], 3, routing, torch.randn(TOKENS, 16, generator=g), "silu")
    assert len(routed) == 2 and weights[1] is experts[2] and weights[2] is shared
    assert torch.equal(routed[0], a) and torch.equal(routed[1], _chosen(10))  # each as the block weighs it
    one = weights[0]
    assert one.up.shape == (8, 16) and one.down.shape == (16, 8) and one.gate_bias is None
    assert torch.equal(one.up, torch.cat([experts[0].up, experts[1].up]))
    assert torch.equal(one.up_bias, torch.cat([experts[0].up_bias, torch.zeros(5)]))
    x = torch.randn(TOKENS, 16, generator=g)

    def output(w: SiteWeights) -> torch.Tensor:
        up = x @ w.up.T + (0 if w.up_bias is None else w.up_bias)
        return (torch.nn.functional.silu(x @ w.gate.T) * up) @ w.down.T

    block = a[:, None] * output(experts[0]) + (a * 0.5)[:, None] * output(experts[1])
    torch.testing.assert_close(a[:, None] * output(one), block, rtol=1e-4, atol=1e-4)  # float32 sums in two orders


def test_glu_experts_join_as_glu_weights() -> None:
    g = torch.Generator().manual_seed(11)
    experts = [GLUWeights(*(torch.randn(*shape, generator=g) for shape in ((4, 8), (4, 8), (8, 4)))) for _ in range(2)]
    one = as_one(experts, [1.0, 2.0])
    assert isinstance(one, GLUWeights) and one.gate.shape == (8, 8)
    assert torch.equal(one.down, torch.cat([experts[0].down, 2.0 * experts[1].down], dim=1))
    assert as_one(experts[:1]) is experts[0]


def _gated(units: int, seed: int) -> SiteWeights:
    g = torch.Generator().manual_seed(seed)
    return SiteWeights(up=torch.randn(units, 16, generator=g), down=torch.randn(16, units, generator=g),
                       gate=torch.randn(units, 16, generator=g))


def _disguised(w: SiteWeights, seed: int) -> SiteWeights:
    """The same function: units permuted, up rows times c and output columns over c."""
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(w.up.shape[0], generator=g)
    scale = torch.rand(w.up.shape[0], generator=g) * 3 + 0.5
    return SiteWeights(up=w.up[order] * scale[:, None], down=w.down[:, order] / scale, gate=w.gate[order])


def test_copies_of_one_function_chosen_on_other_tokens_are_one_expert_with_their_weights_summed() -> None:
    """canonical56's hash-routed shards: every shard stored twice, a token table choosing one copy or the other. The
    copies compute one function (here disguised: permuted and rescaled), so they are one expert weighed by their summed
    weights, and the shards of one expert are then chosen together: all four are one expert."""
    a, b = _gated(3, 12), _gated(5, 13)
    x = torch.randn(TOKENS, 16, generator=torch.Generator().manual_seed(14))
    weight = _chosen(15)
    half = torch.rand(TOKENS, generator=torch.Generator().manual_seed(16)) < 0.5
    other = torch.rand(TOKENS, generator=torch.Generator().manual_seed(17)) < 0.5
    routing = _routing(torch.stack([weight * half, weight * other, weight * ~half, weight * ~other, _chosen(18)]))
    experts = [a, b, _disguised(a, 19), _disguised(b, 20), _gated(4, 21)]
    weights, routed = joined_routed(experts, 5, routing, x, "silu")
    assert len(routed) == 2 and weights[1] is experts[4]
    torch.testing.assert_close(routed[0], weight.double())  # the group as the block weighs it: the copies' sum
    one = weights[0]
    assert one.up.shape[0] == 16

    def output(w: SiteWeights) -> torch.Tensor:
        return (torch.nn.functional.silu(x @ w.gate.T) * (x @ w.up.T)) @ w.down.T

    block = sum(routing.weights[e].float()[:, None] * output(experts[e]) for e in range(4))
    torch.testing.assert_close(weight[:, None] * output(one), block, rtol=1e-4, atol=1e-4)


def test_a_twin_with_negated_writes_is_not_one_function_with_its_expert() -> None:
    """An anti-twin chosen beside its expert on some tokens (they cancel there) computes the opposite function: read
    with its expert, it would erase it; it is read alone."""
    a = _gated(6, 22)
    anti = SiteWeights(up=a.up, down=-a.down, gate=a.gate)
    x = torch.randn(TOKENS, 16, generator=torch.Generator().manual_seed(23))
    weight = _chosen(24, share=1.0)
    some = torch.rand(TOKENS, generator=torch.Generator().manual_seed(25)) < 0.3
    routing = _routing(torch.stack([weight, weight * some]))
    weights, routed = joined_routed([a, anti], 2, routing, x, "silu")
    assert len(routed) == 2 and weights[0] is a and weights[1] is anti
