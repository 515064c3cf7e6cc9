"""Variants of the odd-part flip: on a fraction of the units, the remainder written with squares, composed with the
suite's own disguises, plain remainder units at extreme scales."""

from bench.redteam.disguises import gated_flip, gated_flip_some, gated_flip_squares, plain_flip
from bench.redteam.harness import evaluate, kinds_from_argv
from tests.fixtures import adversary as adv

GATED = ["gated", "moe-softmax", "moe-dense-first", "moe-interleaved", "hybrid"]
PLAIN = ["plain-relu", "plain-gelu"]

for kind in kinds_from_argv(GATED + PLAIN):
    if kind in GATED:
        for fraction in (0.25, 0.5, 0.75):
            evaluate(f"odd-part flip on {fraction:.0%} of units", kind, gated_flip_some(fraction))
        evaluate("odd-part flip, remainder as squares of k+r, k-r", kind, gated_flip_squares())
        evaluate("odd-part flip then permute+rescale+rotate", kind,
                 adv.compose(gated_flip(), adv.permute_units, adv.rescale_units(1e-30, 1e30), adv.rotate_residual))
    else:
        evaluate("odd-part flip, remainder units at scale 1e3", kind, plain_flip(scale=1e3))
        evaluate("odd-part flip, remainder units at scale 1e-3", kind, plain_flip(scale=1e-3))
        rest = [adv.permute_units, adv.rotate_residual] + ([adv.rescale_units(1e-30, 1e30)] if kind == "plain-relu"
                                                           else [])
        evaluate("odd-part flip then permute+rotate(+rescale)", kind, adv.compose(plain_flip(), *rest))
