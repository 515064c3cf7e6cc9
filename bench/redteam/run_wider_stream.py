"""Widened residual stream (tests/fixtures/null_shift.py) on the gated Llama."""

from bench.redteam.harness import evaluate
from tests.fixtures import adversary as adv
from tests.fixtures.null_shift import widened, widened_unlike_split

evaluate("stream widened by 4 zero coordinates (alone)", "gated", lambda m, g: widened(m))
evaluate("stream widened by 4, then suite split_unlike reads P=4 spread 1 (no shift)", "gated",
         adv.compose(lambda m, g: widened(m), adv.split_unlike(4, 1.0, "reads")))
evaluate("stream widened, equal copies P=3, gate rows null-shifted", "gated", widened_unlike_split(3, spread=0.0))
for parts in (2, 4, 8):
    evaluate(f"stream widened, unlike-reads split P={parts}, gate rows null-shifted", "gated",
             widened_unlike_split(parts))
evaluate("stream widened, unlike-reads split P=4, gate+up null-shifted, residual rotated", "gated",
         adv.compose(widened_unlike_split(4, shift_up=True), adv.rotate_residual))
for parts in (4, 16):
    evaluate(f"stream widened, unlike-reads split P={parts} spread 3, gate rows null-shifted", "gated",
             widened_unlike_split(parts, spread=3.0))
