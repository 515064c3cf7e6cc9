"""The up view phi_MATCH reads (scanner.stats.views.decoupled_up): what it removes, what it keeps, and that no
output-preserving change of a unit moves it. Deterministic (fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from scanner.stats.independence import phi_match, phi_match_many, phi_match_similarity
from scanner.stats.matching import cosine_similarity_matrix
from scanner.stats.views import decoupled_up

UNITS, TOKENS = 128, 256


def _views(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((UNITS, TOKENS)), rng.standard_normal((UNITS, TOKENS))


def _direction(rows: np.ndarray) -> np.ndarray:
    """Rows at unit length with their largest entry positive: a row's direction up to sign."""
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return unit * np.sign(unit[np.arange(len(unit)), np.abs(unit).argmax(axis=1)])[:, None]


def test_what_a_unit_shares_between_its_views_is_removed_from_its_up_view() -> None:
    gate, up = _views(np.random.default_rng(0))
    residual = decoupled_up(gate, up).astype(np.float64)
    cosine = np.einsum("ij,ij->i", residual, gate) / np.linalg.norm(residual, axis=1) / np.linalg.norm(gate, axis=1)
    assert np.abs(cosine).max() < 1e-5
    shared = decoupled_up(gate, 3.0 * gate)  # an up view that is its gate view: nothing of its own is left
    assert np.abs(shared).max() < 1e-5


@pytest.mark.parametrize("scale", [1e-30, 1e-3, 7.0, 1e30])
def test_no_rescale_sign_flip_or_reorder_of_units_moves_the_direction(scale: float) -> None:
    rng = np.random.default_rng(1)
    gate, up = _views(rng)
    signs = rng.choice([-1.0, 1.0], size=(UNITS, 1))
    order = rng.permutation(UNITS)
    moved = decoupled_up(gate[order] * scale, up[order] * signs[order] / scale)
    assert np.allclose(_direction(moved.astype(np.float64)), _direction(decoupled_up(gate, up)[order]), atol=1e-4)
    with pytest.raises(AssertionError):  # and it is no constant: other up rows give other directions
        assert np.allclose(_direction(decoupled_up(gate, rng.standard_normal(up.shape))),
                           _direction(decoupled_up(gate, up)), atol=1e-2)


def test_features_two_independent_models_share_in_both_views_are_no_evidence_and_a_copy_still_is() -> None:
    """A planted convergent feature: half the units of B carry, in both views, the feature one unit of A carries in both
    (the way two models trained on one language both learn a token's detector), with independent noise. Read as
    stored, the two matchings agree on those units; decoupled, only what each up row adds is matched."""
    rng = np.random.default_rng(2)
    features = rng.standard_normal((UNITS, TOKENS))
    gate_a = features + 0.3 * rng.standard_normal((UNITS, TOKENS))
    up_a = 0.8 * features + rng.standard_normal((UNITS, TOKENS))
    gate_b, up_b = _views(rng)
    shared = rng.choice(UNITS, size=UNITS // 2, replace=False)
    gate_b[shared] = features[shared] + 0.3 * rng.standard_normal((UNITS // 2, TOKENS))
    up_b[shared] = -0.6 * features[shared] + rng.standard_normal((UNITS // 2, TOKENS))
    order = rng.permutation(UNITS)
    gate_b, up_b = gate_b[order], up_b[order]

    as_stored = phi_match_similarity(cosine_similarity_matrix(gate_a, gate_b),
                                     cosine_similarity_matrix(up_a, up_b, sign_free=True), (up_a, up_b), True)
    assert as_stored.log10_p < -5  # the feature alone makes independent models look related: measured -9.7
    assert phi_match(gate_a, up_a, gate_b, up_b, up_sign_free=True).log10_p > -3  # measured -1.6
    copy = phi_match(gate_a, up_a, gate_a[order], -2.0 * up_a[order], up_sign_free=True)
    assert copy.log10_p < -100 and copy.closeness > 0.999


def test_tensors_resident_on_a_device_give_what_arrays_give() -> None:
    """A pair worker on a GPU hands the views over as torch tensors; on the CPU the same branch runs here."""
    import torch

    from scanner.stats.independence import paired_cosine
    from scanner.stats.matching import match_similarity

    rng = np.random.default_rng(3)
    gate, up = _views(rng)
    gate16, up16 = gate.astype(np.float16), up.astype(np.float16)
    as_tensor = decoupled_up(torch.from_numpy(gate16), torch.from_numpy(up16)).numpy()
    assert np.allclose(as_tensor, decoupled_up(gate16, up16), atol=1e-5)
    other = rng.standard_normal((UNITS, TOKENS)).astype(np.float32)
    matching = match_similarity(cosine_similarity_matrix(up.astype(np.float32), other))
    on_cpu = paired_cosine(up.astype(np.float32), other, matching, True)
    assert abs(paired_cosine(torch.from_numpy(up.astype(np.float32)), torch.from_numpy(other), matching, True)
               - on_cpu) < 1e-6


def test_a_plain_copy_with_negated_units_is_read_through_its_turned_and_sign_free_views() -> None:
    """A plain MLP whose gate sign is free (phi_match_many ``gate_sign_free``): a copy with a random half of its units'
    first views negated (the stored second view changed too, as a negated unit changes its regression) but the
    sign-free write view as it was (scanner.reading.activations.plain_views) tests dependent through the pair (first
    view turned to a positive mean, write view), not through the stored pair; an independent B does not, either way; and
    a copy as stored keeps the stored pair's p-value but for the factor two of the second pair."""
    rng = np.random.default_rng(3)
    first, second, write = (rng.standard_normal((UNITS, TOKENS)) + 0.2 for _ in range(3))
    order = rng.permutation(UNITS)
    sign = rng.choice([-1.0, 1.0], size=(UNITS, 1))
    negated = (first * sign)[order], rng.standard_normal((UNITS, TOKENS)), write[order]
    stored = phi_match_many([(first, second, negated[0], negated[1])])[0]
    free = phi_match_many([(first, second, negated[0], negated[1])], writes=[(write, negated[2])],
                          gate_sign_free=True)[0]
    assert stored.log10_p > -3 and free.log10_p < -100
    b = [rng.standard_normal((UNITS, TOKENS)) for _ in range(3)]
    assert phi_match_many([(first, second, b[0], b[1])], writes=[(write, b[2])], gate_sign_free=True)[0].log10_p > -3
    same = (first[order], second[order], write[order])
    two_pairs = phi_match_many([(first, second, same[0], same[1])], writes=[(write, same[2])], gate_sign_free=True)
    one_pair = phi_match_many([(first, second, same[0], same[1])])
    assert one_pair[0].log10_p < -100
    assert two_pairs[0].log10_p <= one_pair[0].log10_p + np.log10(2.0) + 1e-9
