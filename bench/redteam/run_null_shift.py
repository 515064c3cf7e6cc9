"""LayerNorm-null shifts of split units' input rows (tests/fixtures/null_shift.py) on the plain kinds."""

from bench.redteam.harness import evaluate, kinds_from_argv
from tests.fixtures import adversary as adv
from tests.fixtures.null_shift import split_writes_null_shift

for kind in kinds_from_argv(["plain-relu", "plain-gelu"]):
    evaluate("control: suite split_unlike writes P=3 (no shift)", kind, adv.split_unlike(3, 3.0, "writes"))
    evaluate("null-shifted equal copies P=3", kind, split_writes_null_shift(3, equal_writes=True))
    for parts in (2, 3, 4, 8):
        evaluate(f"null-shifted unlike-writes split P={parts}", kind, split_writes_null_shift(parts))
