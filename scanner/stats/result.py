"""What every statistic's result says, whatever else it holds: its raw value and its log10 p-value.

Why: results come in several shapes, each holding what its stage needs (a block's Spearman rho and units, a
PERMTEST's resampled values, a weight fingerprint's null, a pair's blocks and notes), but a reader that reports a
statistic, or a rule that says every score comes with a calibrated p-value or says it has none, needs only these
two; each result type exposes them under these names (tests/test_statistic_registry.py holds them to it).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class StatisticResult(Protocol):
    """``value``: the statistic's raw value (None where the result has none, e.g. a pair tested block by block);
    ``log10_p``: its log10 p-value under independence, None where it has none (no null, or nothing to test)."""

    @property
    def value(self) -> float | None: ...

    @property
    def log10_p(self) -> float | None: ...
