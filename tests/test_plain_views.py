"""A plain MLP's two views (scanner.reading.activations.plain_views) under the changes a copier can make without
changing a model's outputs: each view of each unit stays what it was (the pre-activation up to the unit's positive
scale).

A pre-norm block in miniature, in float64: the residual stream h entering the layer, the MLP's input
x = LayerNorm(h) * gain + bias, and the MLP's fc (rows, biases) and proj (columns). Every change below is checked to
leave the MLP's output unchanged before its views are compared.
"""

from __future__ import annotations

import math

import pytest
import torch

from scanner.reading import activations
from scanner.reading.activations import plain_views, site_activations
from scanner.reading.architectures.sites import SiteWeights
from scanner.stats.views import oriented_rows

TOKENS, WIDTH, UNITS = 256, 24, 80


def _layer_norm(h: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    centred = h - h.mean(dim=1, keepdim=True)
    return centred / centred.pow(2).mean(dim=1, keepdim=True).sqrt() * gain + bias


class Block:
    """The stream, the norm's gain and bias, and one plain MLP (ReLU, so positive rescales keep the output)."""

    def __init__(self, h, gain, bias, fc, fc_bias, proj) -> None:
        self.h, self.gain, self.bias, self.fc, self.fc_bias, self.proj = h, gain, bias, fc, fc_bias, proj

    def output(self) -> torch.Tensor:
        x = _layer_norm(self.h, self.gain, self.bias)
        return torch.relu(x @ self.fc.T + self.fc_bias) @ self.proj.T

    def views(self, sign_free: bool = False) -> tuple[torch.Tensor, ...]:
        """The first and second views, and with ``sign_free`` the sign-free write view."""
        x = _layer_norm(self.h, self.gain, self.bias)
        v = plain_views(x, self.h, [SiteWeights(up=self.fc, down=self.proj, up_bias=self.fc_bias)],
                        sign_free=sign_free)[0]
        views = (torch.from_numpy(v.gate).double(), torch.from_numpy(v.up).double())
        return (*views, torch.from_numpy(v.write).double()) if sign_free else views


def _directions(rows: torch.Tensor) -> torch.Tensor:
    """Rows at unit length, scaled by their peak first (a unit rescaled by 1e-30 has a norm below any epsilon)."""
    rows = rows / rows.abs().amax(dim=1, keepdim=True)
    return rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True)


def _block(seed: int = 0) -> Block:
    g = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64)  # noqa: E731
    fc = randn(UNITS, WIDTH)
    proj = randn(WIDTH, UNITS) + 0.7 * randn(WIDTH, WIDTH) @ fc.T  # write coupled to read, as training leaves it
    return Block(randn(TOKENS, WIDTH) * 3 + 1, 1 + 0.3 * randn(WIDTH), 0.2 * randn(WIDTH), fc, randn(UNITS), proj)


def _rotation_keeping_ones(generator: torch.Generator) -> torch.Tensor:
    """An orthogonal map that fixes the all-ones direction (so LayerNorm's centring commutes with it)."""
    ones = torch.full((WIDTH, 1), 1 / math.sqrt(WIDTH), dtype=torch.float64)
    frame, _ = torch.linalg.qr(torch.cat([ones, torch.randn(WIDTH, WIDTH - 1, generator=generator,
                                                           dtype=torch.float64)], dim=1))
    frame[:, 0] = ones[:, 0]
    inner = torch.eye(WIDTH, dtype=torch.float64)
    inner[1:, 1:] = torch.linalg.qr(torch.randn(WIDTH - 1, WIDTH - 1, generator=generator, dtype=torch.float64))[0]
    return frame @ inner @ frame.T


#: The basis of `_rotated_with_new_gains`: the copy's output is the original's in it.
BASIS = _rotation_keeping_ones(torch.Generator().manual_seed(1))


def _rotated_with_new_gains(b: Block) -> Block:
    """The stream in another orthonormal basis, the norm given new gains of random sign and no bias, and its old gain
    and bias folded into the fc (what a copier folding norms into the next linear does)."""
    g = torch.Generator().manual_seed(1)
    q = BASIS
    new_gain = torch.exp(torch.rand(WIDTH, generator=g, dtype=torch.float64) * 1.4 - 0.7) * torch.where(
        torch.rand(WIDTH, generator=g) < 0.5, -1.0, 1.0).double()
    fc = b.fc @ torch.diag(b.gain) @ q @ torch.diag(1 / new_gain)
    return Block(b.h @ q, new_gain, torch.zeros(WIDTH, dtype=torch.float64), fc, b.fc_bias + b.fc @ b.bias,
                 q.T @ b.proj)


def _rescaled(b: Block) -> Block:
    """Each unit's fc row and bias times c > 0 and its proj column over c, c log-uniform on 1e-30..1e30."""
    c = torch.logspace(-30, 30, UNITS, dtype=torch.float64)[torch.randperm(UNITS, generator=torch.Generator()
                                                                           .manual_seed(2))]
    return Block(b.h, b.gain, b.bias, b.fc * c[:, None], b.fc_bias * c, b.proj / c)


def _permuted(b: Block) -> tuple[Block, torch.Tensor]:
    order = torch.randperm(UNITS, generator=torch.Generator().manual_seed(3))
    return Block(b.h, b.gain, b.bias, b.fc[order], b.fc_bias[order], b.proj[:, order]), order


def test_the_views_move_with_a_permutation_of_the_units() -> None:
    block = _block()
    copy, order = _permuted(block)
    assert torch.allclose(copy.output(), block.output(), atol=1e-9)
    for before, after in zip(block.views(), copy.views(), strict=True):
        assert torch.allclose(after, before[order], atol=1e-5)


@pytest.mark.parametrize("change, basis", [(_rescaled, None), (_rotated_with_new_gains, BASIS)])
def test_the_views_survive_rescaled_units_and_a_rotated_stream_with_new_norm_gains(change, basis) -> None:
    block = _block()
    copy = change(block)
    expected = block.output() if basis is None else block.output() @ basis
    assert torch.allclose(copy.output(), expected, rtol=1e-9, atol=1e-9)
    (first, second), (first_copy, second_copy) = block.views(), copy.views()
    assert torch.allclose(_directions(first_copy), _directions(first), atol=1e-6)  # the pre-activation: up to scale
    assert torch.allclose(second_copy, second, atol=1e-5)


def test_a_unit_split_in_copies_and_units_that_never_write_change_no_view() -> None:
    """Every unit split in two (output column shared 0.3 / 0.7) gives two copies of its views; units appended with
    random rows and zero output columns get an all-zero second view (the degenerate-unit screen sets them aside) and
    change no other unit's views."""
    block = _block()
    g = torch.Generator().manual_seed(4)
    dead = torch.randn(7, WIDTH, generator=g, dtype=torch.float64)
    split = Block(block.h, block.gain, block.bias, torch.cat([block.fc, block.fc, dead]),
                  torch.cat([block.fc_bias, block.fc_bias, torch.ones(7, dtype=torch.float64)]),
                  torch.cat([0.3 * block.proj, 0.7 * block.proj, torch.zeros(WIDTH, 7, dtype=torch.float64)], dim=1))
    assert torch.allclose(split.output(), block.output(), atol=1e-9)
    (first, second), (first_split, second_split) = block.views(), split.views()
    for half in (slice(0, UNITS), slice(UNITS, 2 * UNITS)):
        assert torch.allclose(first_split[half], first, atol=1e-5)
        assert torch.allclose(second_split[half], second, atol=1e-5)
    assert bool((second_split[2 * UNITS:] == 0).all())


@pytest.mark.parametrize("share", [0.5, 1.0])
def test_negated_units_keep_the_sign_free_views(share: float) -> None:
    """Where act(z) - act(-z) = z, (k, b; w) is (-k, -b; w) plus a linear map (which the canonical form cancels:
    tests/test_adversary flip_gates). With ``sign_free`` the write view is the read-back less its prediction up to
    each unit's sign, and it is what it was whether the copier turned every unit or a random share of them (which
    changes the stored regression's predictors unit by unit); the first view turned to a positive mean is too."""
    block = _block()
    turned = torch.rand(UNITS, generator=torch.Generator().manual_seed(5), dtype=torch.float64) < share
    sign = torch.where(turned, -1.0, 1.0).double()
    copy = Block(block.h, block.gain, block.bias, block.fc * sign[:, None], block.fc_bias * sign, block.proj)
    original, negated = block.views(sign_free=True), copy.views(sign_free=True)
    assert bool(turned.any())
    assert torch.allclose(oriented_rows(negated[0]), oriented_rows(original[0]), atol=1e-6)
    assert torch.allclose(negated[2], original[2], atol=1e-5)
    if share < 1:  # the stored views do change: the first's sign, the second's regression
        assert not torch.allclose(negated[1], original[1], atol=1e-3)


def test_the_sign_free_write_view_of_an_untouched_block_is_its_second_view() -> None:
    """On a block whose writes are coupled to its reads (as training leaves them, with units of either sign), letting
    each unit's coupling carry its own sign removes the same coupling as the shared regression: the sign-free write
    view is the stored second view, and the stored views are as without ``sign_free``."""
    block = _block()
    stored, free = block.views(), block.views(sign_free=True)
    assert bool((stored[0].mean(dim=1) < 0).any()) and bool((stored[0].mean(dim=1) > 0).any())
    assert torch.allclose(free[0], stored[0]) and torch.allclose(free[1], stored[1])
    assert torch.allclose(free[2], stored[1], atol=1e-5)


def test_a_site_reads_its_pre_activations_once_and_its_views_are_the_weights_own(monkeypatch) -> None:
    """site_activations takes a plain MLP's first view from the canonical form, which has read the pre-activations on
    the block's inputs already (a 7B block's second product cost 0.3 s on 2 cores), and its views are the ones
    plain_views reads from the weights alone; where the canonical form changed the units (every unit split in two,
    output column shared 0.3 / 0.7), the first view is read on the canonical units."""
    block = _block()
    x, h = _layer_norm(block.h, block.gain, block.bias).float(), block.h.float()
    weights = SiteWeights(up=block.fc.float(), down=block.proj.float(), up_bias=block.fc_bias.float())
    products = []
    product = activations._plain_pre_activation
    monkeypatch.setattr(activations, "_plain_pre_activation", lambda *a: products.append(a) or product(*a))
    (site,) = site_activations(x, [weights], activation="gelu", stream=h)
    assert not products
    (alone,) = plain_views(x, h, [weights], sign_free=True)
    assert len(products) == 1
    for part in ("gate", "up", "write"):
        want, got = getattr(alone, part), getattr(site, part)
        assert float(abs(got - want).max()) <= 1e-6 * float(abs(want).max())
    split = SiteWeights(up=torch.cat([weights.up, weights.up]), up_bias=torch.cat([weights.up_bias, weights.up_bias]),
                        down=torch.cat([0.3 * weights.down, 0.7 * weights.down], dim=1))
    (combined,) = site_activations(x, [split], activation="gelu", stream=h)
    assert len(products) == 2 and combined.combined == UNITS
    assert torch.allclose(torch.from_numpy(combined.gate), torch.from_numpy(site.gate), rtol=1e-4, atol=1e-4)


def test_the_sign_free_residual_turns_with_negated_units_where_the_signs_never_settle() -> None:
    """`unpredicted_up_to_sign` on predictors and targets with no shared map (random, as an untrained block's): the
    leading eigenvector its signs start from is far from settled after its fixed iterations, so an iteration that
    started from all ones gave another residual once a copier negated half the units' predictors (a start that
    does not turn with them). The start turns with the units, and the residual is bit for bit what it was."""
    generator = torch.Generator().manual_seed(31)
    predictors = torch.randn(4096, 64, generator=generator, dtype=torch.float64)
    targets = torch.randn(4096, 64, generator=generator, dtype=torch.float64)
    sign = torch.where(torch.rand(4096, generator=generator) < 0.5, -1.0, 1.0).double()
    before = activations.unpredicted_up_to_sign(targets, predictors)
    after = activations.unpredicted_up_to_sign(targets, predictors * sign[:, None])
    assert torch.equal(before, after)
