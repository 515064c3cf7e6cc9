"""Writes along the all-ones direction LayerNorm removes (tests/fixtures/stream_offset.py) on the plain kinds, alone
and with the odd-part flip and the suite's own disguises."""

from bench.redteam.disguises import plain_flip
from bench.redteam.harness import evaluate, kinds_from_argv
from tests.fixtures import adversary as adv
from tests.fixtures.stream_offset import stream_offset

for kind in kinds_from_argv(["plain-relu", "plain-gelu"]):
    for offset in (1.0, 10.0, 30.0):
        evaluate(f"stream offset C={offset:g} along 1", kind, stream_offset(offset=offset))
    for per_unit in (10.0, 100.0):
        evaluate(f"unit output columns + c_i 1, |c_i 1| = {per_unit:g} |w_i|", kind, stream_offset(per_unit=per_unit))
    evaluate("offset C=10, columns +100 |w_i| along 1, attention biases +10", kind,
             stream_offset(offset=10.0, per_unit=100.0, attention_bias=10.0))
    evaluate("odd-part flip then offset C=10 and columns +100 |w_i| along 1", kind,
             adv.compose(plain_flip(), stream_offset(offset=10.0, per_unit=100.0)))
