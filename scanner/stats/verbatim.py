"""Weight values read at fixed positions (the sample every fingerprint keeps), and three exact relations between
samples, each against a null read from the same samples shifted by one position: bit-equal values
(verbatim_share), a change that is another model's change exactly scaled (scaled_change_share), and a sample that
is exactly a combination of others, matrix by matrix (exact_combination).

Training moves every weight (a dense gradient step, Adam's per-weight updates, a merged LoRA's low-rank update), so a
fine-tune keeps none of its base's float32 values exactly. A sparse edit does: TIES and DARE merges add their sources'
task vectors to the base only where they were kept, and keep the base's own values everywhere else (8-27% of the MLP
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

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

VALUE_SAMPLE = 4096
"""MLP weight values a model's sample holds, spread evenly over its blocks and the matrices of each (at least
MIN_PER_MATRIX from each): 16 KiB of float32 whatever the model's size. A merge's 9% share of them is about 370 equal
values against a null of about none (log10 p below -600); a 1% share still reaches about -60."""
MIN_PER_MATRIX = 16


def matrix_sample_count(n_blocks: int, matrices_per_block: int) -> int:
    """Values read from each MLP matrix of a model of ``n_blocks`` blocks: the same for models of one layout."""
    return max(MIN_PER_MATRIX, math.ceil(VALUE_SAMPLE / (max(n_blocks, 1) * max(matrices_per_block, 1))))


def sample_layout(parts: Sequence[str]) -> str:
    """A short digest of the matrices a sample was read from (two samples line up when their layouts are equal),
    then "/" and the values read per matrix when every matrix gave as many (parts end in ":count"), else "/0"."""
    if not parts:
        return ""
    counts = {part.rsplit(":", 1)[-1] for part in parts}
    per_matrix = counts.pop() if len(counts) == 1 else "0"
    return f"{hashlib.sha256(';'.join(parts).encode()).hexdigest()[:16]}/{per_matrix}"


def values_per_matrix(layout: str) -> int:
    """The values read per matrix that sample_layout recorded (0: unknown or uneven)."""
    _, _, count = layout.partition("/")
    return int(count) if count.isdigit() else 0


def coarse_format(values: np.ndarray) -> bool:
    """Whether every sampled value is representable in bfloat16 or float16: such a checkpoint drops updates below its
    resolution, so a fine-tune keeps many of its base's values exactly and an equal value marks no sparse edit."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    finite = values[np.isfinite(values)]
    bfloat16 = not np.any(finite.view(np.uint32) & 0xFFFF)
    with np.errstate(over="ignore"):
        float16 = bool(np.all(finite.astype(np.float16).astype(np.float32) == finite))
    return bfloat16 or float16


def sample_positions(shape: tuple[int, ...], count: int) -> np.ndarray:
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
    def value(self) -> float:
        """The share, as every statistic's result names its raw value (scanner.stats.result.StatisticResult)."""
        return self.share

    @property
    def coincidence_rate(self) -> float:
        return (self.coincident + 1) / (self.null_compared + 1)


def against_shifted(equal: int, compared: int, coincident: int, null_compared: int) -> VerbatimShare:
    """A count of exact matches with its log10 p: the Chernoff bound at the coincidence rate that the same comparison
    with one side shifted by one position gave."""
    rate = (coincident + 1) / (null_compared + 1)
    return VerbatimShare(equal, compared, coincident, null_compared, log10_binomial_tail_bound(equal, compared, rate))


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
    return against_shifted(int(np.count_nonzero((bits_a == bits_b) & live)), int(np.count_nonzero(live)),
                           int(np.count_nonzero((bits_a == shifted) & live_shifted)),
                           int(np.count_nonzero(live_shifted)))


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


SCALE_BINS = 1000.0
"""Resolution (per unit of log |ratio|) at which the most common ratio (m - b) / (x - b) of a matrix is looked for."""
ROUNDING_ULPS = 4.0
"""A value is exactly what a scaled change gives when it differs from it by at most this many float32 spacings of the
values involved (times one plus the scale)."""
MAX_WEIGHT_SUM = 4.0
"""Most total absolute weight a matrix's exact combination may have: mergekit's merges weigh their models by at most
3 in all (a task-arithmetic merge of two task vectors at weight 1 weighs its base -1), a linear or SLERP merge by about
1. Larger weights that cancel can fit anything to a tolerance that grows with them; a fit beyond this reproduces no
position."""
MAX_CONDITION = 1e4
"""Largest condition number of a matrix's sources (their sampled values, columns scaled to unit length) a combination
may be fitted on. Near-collinear sources (three models one of which is an average of the other two: a merge and its
parents) leave the weights undetermined to float32 rounding, and lstsq then picks huge cancelling ones; float32
values carry about 7 digits, so beyond 1e4 the weights are not known to 0.1%. A fit on such sources reproduces no
position: the search tries the sets without the redundant model."""
COMBINATION_ULPS = ROUNDING_ULPS * (1.0 + MAX_WEIGHT_SUM)
"""A value is exactly what a combination gives when it differs from it by at most this many float32 spacings of the
values involved: the rounding of a combination of total weight up to MAX_WEIGHT_SUM, fixed whatever the weights fitted
(a tolerance that grew with them would accept any fit of large enough cancelling weights)."""


def scaled_change_share(m: np.ndarray, b: np.ndarray, x: np.ndarray, per_matrix: int) -> VerbatimShare:
    """How many of m's changes from b are x's change from b times one factor per matrix (to float32 rounding), among
    the positions where both changed, against the same count with x shifted by one position. A DARE or TIES merge on
    base b rescales each tensor's kept entries by one factor, so where source x alone was kept, m - b = c (x - b).
    ``per_matrix``: values per matrix in the samples (0: one factor for all)."""
    m, b, x = (np.ascontiguousarray(v, dtype=np.float32).ravel() for v in (m, b, x))
    step = per_matrix or len(m)
    found = [_scaled_hits(m[i:i + step], b[i:i + step], x[i:i + step]) for i in range(0, len(m), step)]
    shifted = np.roll(x, 1)
    null = [_scaled_hits(m[i:i + step], b[i:i + step], shifted[i:i + step]) for i in range(0, len(m), step)]
    return against_shifted(sum(h for h, _ in found), sum(n for _, n in found), sum(h for h, _ in null),
                           sum(n for _, n in null))


def _scaled_hits(m: np.ndarray, b: np.ndarray, x: np.ndarray) -> tuple[int, int]:
    """Positions of one matrix where m - b = c (x - b) to rounding, c the most common ratio; positions compared: those
    where both m and x moved from b by more than rounding (a change of an ulp or two is the arithmetic's, not a
    source's, and any small c would match it)."""
    spacing = np.spacing(np.maximum.reduce([np.abs(m), np.abs(b), np.abs(x)])).astype(np.float64)
    moved = (np.abs(m.astype(np.float64) - b) > ROUNDING_ULPS * spacing) & (
        np.abs(x.astype(np.float64) - b) > ROUNDING_ULPS * spacing)
    compared = int(moved.sum())
    if compared == 0:
        return 0, 0
    change, other = m[moved].astype(np.float64) - b[moved], x[moved].astype(np.float64) - b[moved]
    ratio = change / other
    bins = np.sign(ratio) * np.round(np.log(np.abs(ratio)) * SCALE_BINS)
    values, counts = np.unique(bins, return_counts=True)
    c = float(np.median(ratio[bins == values[counts.argmax()]]))
    hits = np.abs(change - c * other) <= ROUNDING_ULPS * (1.0 + abs(c)) * spacing[moved]
    return int(hits.sum()), compared


@dataclass(frozen=True)
class Combination:
    """A least-squares fit of m's sampled values as a combination of other models' values, one set of weights per
    matrix: ``weights`` (matrices, sources); ``counts``: the positions it reproduces to float32 rounding, against
    those it reproduces with the sources shifted by one position."""

    weights: np.ndarray
    counts: VerbatimShare

    @property
    def share(self) -> float:
        return self.counts.share

    @property
    def log10_p(self) -> float:
        return self.counts.log10_p

    def convex_share(self, slack: float = 0.02, most: float = 1.2) -> float:
        """The share of matrices whose weights are each within [-slack, 1 + slack] and sum to between 1 - slack and
        ``most``: an average (linear, model stock, task arithmetic whose weights sum to at most 1) sums to 1, SLERP
        to 1 / cos(half the angle between its models), above 1 for models far apart."""
        w = self.weights
        inside = np.all((w >= -slack) & (w <= 1.0 + slack), axis=1) & (w.sum(axis=1) >= 1.0 - slack) & (
            w.sum(axis=1) <= most)
        return float(inside.mean()) if len(w) else 0.0


def exact_combination(m: np.ndarray, sources: Sequence[np.ndarray], per_matrix: int) -> Combination:
    """m's values as a combination of the sources' values, fitted matrix by matrix (mergekit's linear, SLERP, task
    arithmetic and model-stock merges are, per tensor, fixed combinations of their models), and how many positions it
    reproduces to float32 rounding. ``per_matrix``: values per matrix in the samples (0: one fit for all)."""
    m = np.ascontiguousarray(m, dtype=np.float32).ravel()
    stacked = np.stack([np.ascontiguousarray(s, dtype=np.float32).ravel() for s in sources], axis=1)
    step = per_matrix or len(m)
    fits = [_fit(m[i:i + step], stacked[i:i + step]) for i in range(0, len(m), step)]
    shifted = np.roll(stacked, 1, axis=0)
    null = [_fit(m[i:i + step], shifted[i:i + step]) for i in range(0, len(m), step)]
    return Combination(np.array([f[0] for f in fits]),
                       against_shifted(sum(f[1] for f in fits), sum(f[2] for f in fits), sum(f[1] for f in null),
                                       sum(f[2] for f in null)))


def _fit(m: np.ndarray, sources: np.ndarray) -> tuple[np.ndarray, int, int]:
    """One matrix: the least-squares weights, the positions they reproduce to rounding (none when the sources are
    ill-conditioned or the weights too large: MAX_CONDITION, MAX_WEIGHT_SUM), the positions compared."""
    live = (m != 0) | np.any(sources != 0, axis=1)
    target, design = m.astype(np.float64), sources.astype(np.float64)
    weights = np.linalg.lstsq(design, target, rcond=None)[0]
    if not _well_conditioned(design[live]) or not np.abs(weights).sum() <= MAX_WEIGHT_SUM:
        return weights, 0, int(live.sum())
    spacing = np.spacing(np.maximum(np.abs(m), np.abs(sources).max(axis=1))).astype(np.float64)
    exact = np.abs(target - design @ weights) <= COMBINATION_ULPS * spacing
    return weights, int((exact & live).sum()), int(live.sum())


def _well_conditioned(design: np.ndarray) -> bool:
    """Whether the sources' columns, each scaled to unit length, have a condition number of at most MAX_CONDITION."""
    norms = np.linalg.norm(design, axis=0)
    if len(design) < design.shape[1] or not np.all(norms > 0):
        return False
    singular = np.linalg.svd(design / norms, compute_uv=False)
    return bool(singular[-1] > 0 and singular[0] / singular[-1] <= MAX_CONDITION)
