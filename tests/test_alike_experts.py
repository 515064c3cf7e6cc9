"""Routed experts weighed in proportion at every token are read as one (scanner.reading.alike_experts): which experts
group, that no chain of small steps joins far ones, and that a group's weights are its members' units side by side."""

from __future__ import annotations

import torch

from scanner.reading.alike_experts import SAME_LOGIT, alike_groups, as_one, joined_routed
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights

#: A coordinate the inputs never take (a widened stream's never-written one).
UNSEEN = 5


def _inputs(tokens: int = 256, width: int = 16, seed: int = 0) -> torch.Tensor:
    """Random block inputs whose last coordinate is 1 on every token (a norm's bias makes such a direction) and whose
    coordinate `UNSEEN` is always 0."""
    x = torch.randn(tokens, width, generator=torch.Generator().manual_seed(seed))
    x[:, -1] = 1.0
    x[:, UNSEEN] = 0.0
    return x


def test_experts_with_one_logit_on_the_inputs_group_however_their_rows_are_stored() -> None:
    x = _inputs()
    rows = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    rows[:, -1] = 0.0
    unseen = torch.zeros(16)
    unseen[UNSEEN] = 1.0
    router = torch.cat([rows, rows[1:2] + 5.0 * unseen, rows[3:4]])
    assert alike_groups(router, x, 6) == [[0], [1, 4], [2], [3, 5]]


def test_a_constant_offset_between_two_experts_logits_groups_them_and_a_varying_one_does_not() -> None:
    x = _inputs()
    rows = torch.randn(3, 16, generator=torch.Generator().manual_seed(2))
    offset = rows[0].clone()
    offset[-1] += 3.0  # logits 3 nats apart at every token: weights in a constant ratio under a softmax
    moved = rows[0].clone()
    moved[0] += 4.0 * SAME_LOGIT / float(x[:, 0].max() - x[:, 0].min())  # the difference varies by 4 bars
    assert alike_groups(torch.stack([rows[0], offset, moved, *rows[1:]]), x, 5) == [[0, 1], [2], [3], [4]]


def test_no_chain_of_small_steps_joins_experts_further_apart_than_the_bar() -> None:
    x = _inputs()
    step = torch.zeros(16)
    step[0] = 0.6 * SAME_LOGIT / float(x[:, 0].max() - x[:, 0].min())
    base = torch.randn(16, generator=torch.Generator().manual_seed(3))
    router = torch.stack([base + k * step for k in range(4)])  # each 0.6 bars from the next
    assert alike_groups(router, x, 4) == [[0, 1], [2, 3]]


def test_without_router_rows_of_the_right_shape_every_expert_is_its_own() -> None:
    x = _inputs()
    assert alike_groups(None, x, 3) == [[0], [1], [2]]
    assert alike_groups(torch.zeros(3, 8), x, 3) == [[0], [1], [2]]
    assert alike_groups(torch.zeros(2, 16), x, 3) == [[0], [1], [2]]


def test_a_group_is_its_members_units_side_by_side_and_the_rest_of_the_block_stays() -> None:
    g = torch.Generator().manual_seed(4)
    experts = [SiteWeights(up=torch.randn(h, 16, generator=g), down=torch.randn(16, h, generator=g),
                           gate=torch.randn(h, 16, generator=g),
                           up_bias=torch.randn(h, generator=g) if h == 3 else None) for h in (3, 5, 2)]
    shared = SiteWeights(up=torch.randn(7, 16, generator=g), down=torch.randn(16, 7, generator=g))
    router = torch.zeros(3, 16)
    router[2, 0] = 1.0
    weights, routed = joined_routed([*experts, shared], 3, router, _inputs())
    assert routed == 2 and weights[1] is experts[2] and weights[2] is shared
    one = weights[0]
    assert one.up.shape == (8, 16) and one.down.shape == (16, 8) and one.gate_bias is None
    assert torch.equal(one.up, torch.cat([experts[0].up, experts[1].up]))
    assert torch.equal(one.down, torch.cat([experts[0].down, experts[1].down], dim=1))
    assert torch.equal(one.up_bias, torch.cat([experts[0].up_bias, torch.zeros(5)]))
    x = _inputs()
    summed = sum(w.down @ (torch.nn.functional.silu(x @ w.gate.T) * (x @ w.up.T + (0 if w.up_bias is None else
                                                                                  w.up_bias))).T
                 for w in experts[:2])
    together = one.down @ (torch.nn.functional.silu(x @ one.gate.T) * (x @ one.up.T + one.up_bias)).T
    torch.testing.assert_close(together, summed, rtol=1e-4, atol=1e-4)  # float32 sums in two orders


def test_glu_experts_join_as_glu_weights() -> None:
    g = torch.Generator().manual_seed(5)
    experts = [GLUWeights(*(torch.randn(*shape, generator=g) for shape in ((4, 8), (4, 8), (8, 4)))) for _ in range(2)]
    one = as_one(experts)
    assert isinstance(one, GLUWeights) and one.gate.shape == (8, 8) and one.down.shape == (8, 8)
    assert as_one(experts[:1]) is experts[0]
