"""Verbatim weight values: how many of two models' MLP weights are bit for bit equal, against how many coincide.

Training moves every weight (a dense gradient step, Adam's per-weight updates, a merged LoRA's low-rank update), so a
fine-tune keeps none of its base's float32 values exactly. A sparse edit does: TIES and DARE merges add their sources'
task vectors to the base only where they were kept, and keep the base's own values everywhere else (9-25% of the MLP
weights of the merge zoos' TIES, DARE-TIES and DARE-linear merges, against 0.000 for every fine-tune, LoRA, linear,
SLERP, task-arithmetic and model-stock merge: docs/disputes.md). A TIES merge of disjointly kept values also keeps
each source's values where it alone was kept. So a significant share names a direct sparse derivation, and its absence
says nothing: most derivatives are dense.

The null: two independently trained models share a value only by coincidence, as often as a value of one equals an
unrelated value of the other. That rate is read from the same pair, by comparing each sampled value of model A with
the sample of model B shifted by one position (values of the same tensor, at positions that no copy aligns), so a
coarse format (bfloat16, a quantized checkpoint's few levels) that makes coincidences common raises the null with it.
The p-value is the Chernoff bound on the binomial tail at that rate, exp(-n KL(share || rate)): never below the exact
tail, so it stays valid, and computed in log space, so it is exact far below the 1e-308 where floats underflow. The
rate is estimated as (coincidences + 1) / comparisons, above its plug-in value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SAMPLE_PER_MATRIX = 256
"""Values read from each MLP weight matrix of each block, at positions fixed by the matrix's shape: 768 per block of
a gated MLP, 3 KiB of float32. A merge's 9% share of one 4-block model's 3072 values is 276 equal values against a
null of about none (log10 p below -300)."""


def sample_positions(shape: tuple[int, ...], count: int = SAMPLE_PER_MATRIX) -> np.ndarray:
    """Flat positions read from a matrix of this shape: the same for every model whose matrix has it (seeded by the
    shape), sorted, without repeats, all of them for a matrix of at most ``count`` values."""
    size = math.prod(shape)
    if size <= count:
        return np.arange(size)
    rng = np.random.default_rng([*shape, count])
    return np.sort(rng.choice(size, size=count, replace=False))


@dataclass(frozen=True)
class VerbatimShare:
    """Equal values of two samples: ``equal`` of ``compared`` positions (those where either value is non-zero), and
    ``coincident`` of ``null_compared`` shifted comparisons; ``log10_p`` bounds the chance of so many equal values
    at the coincidence rate."""

    equal: int
    compared: int
    coincident: int
    null_compared: int
    log10_p: float

    @property
    def share(self) -> float:
        return self.equal / self.compared if self.compared else 0.0

    @property
    def coincidence_rate(self) -> float:
        return (self.coincident + 1) / (self.null_compared + 1)


def verbatim_share(a: np.ndarray, b: np.ndarray) -> VerbatimShare:
    """Bit-equal values of two samples read at the same positions (sample_positions of equal shapes). Exact zeros
    on both sides are left out: pruning and padding make them, and they say nothing about which model was copied."""
    a, b = np.ascontiguousarray(a, dtype=np.float32).ravel(), np.ascontiguousarray(b, dtype=np.float32).ravel()
    if a.shape != b.shape:
        raise ValueError(f"value samples of {a.size} and {b.size} values do not line up")
    bits_a, bits_b = a.view(np.uint32), b.view(np.uint32)
    live = (a != 0) | (b != 0)
    shifted = np.roll(bits_b, 1)
    live_shifted = (a != 0) | (np.roll(b, 1) != 0)
    equal = int(np.count_nonzero((bits_a == bits_b) & live))
    compared = int(np.count_nonzero(live))
    coincident = int(np.count_nonzero((bits_a == shifted) & live_shifted))
    null_compared = int(np.count_nonzero(live_shifted))
    rate = (coincident + 1) / (null_compared + 1)
    return VerbatimShare(equal, compared, coincident, null_compared, log10_binomial_tail_bound(equal, compared, rate))


def log10_binomial_tail_bound(k: int, n: int, rate: float) -> float:
    """log10 of the Chernoff bound on P(Binomial(n, rate) >= k): -n KL(k/n || rate) / ln 10 above the mean, 0 at or
    below it (no evidence)."""
    if n == 0 or k <= n * rate:
        return 0.0
    share = k / n
    divergence = share * math.log(share / rate)
    if share < 1.0:  # rate < share <= 1 here, so both logs are finite
        divergence += (1.0 - share) * math.log((1.0 - share) / (1.0 - rate))
    return -n * divergence / math.log(10)
