"""Silent units of enormous size (bench/redteam/loud_silent.py) that move the dead-unit bar's median, on every kind."""

from bench.redteam.harness import evaluate, kinds_from_argv
from bench.redteam.loud_silent import loud_silent_units
from scanner.testing import adversary as adv

ALL = ["gated", "plain-relu", "plain-gelu", "moe-softmax", "moe-dense-first", "moe-interleaved", "hybrid"]

for kind in kinds_from_argv(ALL):
    evaluate("3h silent units of size 1e8 x the median unit", kind, loud_silent_units(3.0, 1e8))
    evaluate("1.2h silent units of size 1e7 x the median unit, then permute+rotate", kind,
             adv.compose(loud_silent_units(1.2, 1e7), adv.permute_units, adv.rotate_residual))
