"""A two-stage (group-sequential) test over blocks: a few blocks first, the rest only when those leave it open.

Most pairs in a hub are plainly independent and most derived pairs are plainly dependent after one or two
blocks, yet comparing all 32 blocks of a 7B pair costs 64 cosine matrices and assignments. The design below
computes the FISHER p-value p_k of k screening blocks and

* stops with p_k when p_k > high (futility: the screen shows nothing; almost every independent pair),
* stops with p_k when p_k <= low (efficacy: already overwhelming; almost every derived pair),
* otherwise compares every block and reports p_all + low.

The reported value P is a valid p-value whenever p_k and p_all are, whatever their joint law. For any level a:
P(P <= a) <= P(p_k <= min(a, low)) + P(high < p_k <= a) + P(low < p_k <= high, p_all <= a - low), which is at
most a for a < low (first term only), min(a, low) + (a - low) = a for low <= a <= high, and
low + (a - high) + (high - low) = a above high. The price is a floor of `low` on pairs that needed every
block, which is why `low` sits far below any decision threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SequentialDesign:
    """How many blocks to screen and the two log10 thresholds that end the test after them."""

    screen_blocks: int = 4
    stop_below_log10_p: float = -30.0
    stop_above_log10_p: float = -2.0

    def __post_init__(self) -> None:
        if self.screen_blocks < 1:
            raise ValueError(f"a sequential design screens at least one block, got {self.screen_blocks}")
        if not self.stop_below_log10_p < self.stop_above_log10_p <= 0:
            raise ValueError(
                "the design needs stop_below_log10_p < stop_above_log10_p <= 0, got "
                f"{self.stop_below_log10_p} and {self.stop_above_log10_p}"
            )

    def screen(self, depth: int) -> list[int]:
        """Block indices to compare first: spread evenly over the depth (a derivative that kept or changed only
        part of the stack is caught wherever that part lies); every block when the model is that shallow."""
        if depth <= self.screen_blocks:
            return list(range(depth))
        if self.screen_blocks == 1:
            return [0]
        return sorted({round(i * (depth - 1) / (self.screen_blocks - 1)) for i in range(self.screen_blocks)})

    def stops(self, screen_log10_p: float) -> bool:
        """Whether the screening p-value already settles the test."""
        return screen_log10_p <= self.stop_below_log10_p or screen_log10_p > self.stop_above_log10_p

    def continued_log10_p(self, all_log10_p: float) -> float:
        """log10(p_all + low): the all-blocks p-value with the design's floor, exact in log space."""
        high, low = max(all_log10_p, self.stop_below_log10_p), min(all_log10_p, self.stop_below_log10_p)
        return high + math.log10(1.0 + 10.0 ** (low - high))
