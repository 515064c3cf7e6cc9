"""Expert pairing read off the gate view's signed cosine (scanner.stats.experts) against the odd-part flip, which
negates every gate: the flip composed with an expert permutation (each alone keeps a copy dependent)."""

from bench.redteam.disguises import gated_flip, gated_flip_some
from bench.redteam.harness import evaluate, kinds_from_argv
from tests.fixtures import adversary as adv

for kind in kinds_from_argv(["moe-softmax", "moe-dense-first", "moe-interleaved", "hybrid"]):
    evaluate("control: permute experts alone", kind, adv.permute_experts)
    evaluate("odd-part flip then permute experts", kind, adv.compose(gated_flip(), adv.permute_experts))
    evaluate("odd-part flip on 50% of units then permute experts", kind,
             adv.compose(gated_flip_some(0.5), adv.permute_experts))
