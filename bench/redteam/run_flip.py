"""The odd-part flip (redteam/disguises.py) on every kind, alone and composed with the suite's own disguises."""

from bench.redteam.disguises import gated_flip, plain_flip
from bench.redteam.harness import evaluate, kinds_from_argv

ALL = ["gated", "plain-relu", "plain-gelu", "moe-softmax", "moe-dense-first", "moe-interleaved", "hybrid"]

for kind in kinds_from_argv(ALL):
    flip = plain_flip() if kind.startswith("plain") else gated_flip()
    evaluate("odd-part flip", kind, flip)
