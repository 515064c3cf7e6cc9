"""The outcome of one pairwise test, and its JSON and human-readable renderings."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

ALPHA = 0.01


@dataclass(frozen=True)
class LayerResult:
    """One pair of blocks: which block of each model, its log10 p, the Spearman rho behind it, and (phi_MATCH)
    the closeness of the two blocks (mean cosine of matched activations; no p-value)."""

    layer_a: int
    layer_b: int
    log10_p: float
    rho: float | None = None
    n_units: int | None = None
    closeness: float | None = None
    cannot_test: str | None = None  # why the block could not be tested (its log10_p then counts for nothing)

    @property
    def value(self) -> float | None:
        """The block's raw statistic, its rho (scanner.stats.result.StatisticResult)."""
        return self.rho


@dataclass(frozen=True)
class PairTestResult:
    """A whole-model test (a scanner.stats.result.StatisticResult). log10_p is None for a statistic without a valid
    null (then value holds it) and for a pair that could not be tested (then cannot_test says why: too few units the
    test can read, never evidence of independence)."""

    model_a: str
    model_b: str
    statistic: str
    log10_p: float | None
    layers: list[LayerResult]
    n_layers: int
    inputs: str | None
    notes: list[str] = field(default_factory=list)
    value: float | None = None
    closeness: float | None = None
    """phi_MATCH: mean of the blocks' closeness (1 = a copy). Descriptive, no p-value: it orders relatives already
    called dependent by nearness (family trees); it never decides dependence."""
    cannot_test: str | None = None

    def __post_init__(self) -> None:
        for x in [self.log10_p, *(layer.log10_p for layer in self.layers)]:
            if x is not None and not math.isfinite(x):
                raise ValueError(f"a p-value of a finite statistic must be finite in log space, got {x}")

    def verdict(self, alpha: float = ALPHA) -> str:
        if self.cannot_test is not None:
            return f"CANNOT TEST: {self.cannot_test}; this says nothing about dependence either way"
        if self.log10_p is None:
            return "no p-value: this statistic has no calibrated null; read the raw value with care"
        if self.log10_p <= math.log10(alpha):
            return f"DEPENDENT: independence rejected at alpha={alpha} (p = {format_p(self.log10_p)})"
        return f"no evidence of dependence at alpha={alpha} (p = {format_p(self.log10_p)})"

    def to_json_dict(self) -> dict:
        data = asdict(self)
        data["verdict"] = self.verdict()
        return data


def format_p(log10_p: float) -> str:
    """A p-value as people read it, even when it is 1e-5000: mantissa and exponent from log10 p."""
    if log10_p > -4:
        return f"{10 ** log10_p:.4f}"
    exponent = math.floor(log10_p)
    return f"{10 ** (log10_p - exponent):.2f}e{exponent}"


def render_table(result: PairTestResult) -> str:
    """Per-block values and the one-line verdict, for a terminal."""
    lines = [
        f"model A   : {result.model_a}",
        f"model B   : {result.model_b}",
        f"statistic : {result.statistic}" + (f"   inputs: {result.inputs}" if result.inputs else ""),
    ]
    if result.layers:
        lines += ["", f"{'block A':>8} {'block B':>8} {'rho':>8} {'units':>6} {'log10 p':>12} {'p':>12}"]
        for layer in result.layers:
            rho = f"{layer.rho:8.4f}" if layer.rho is not None else f"{'-':>8}"
            units = f"{layer.n_units:6d}" if layer.n_units is not None else f"{'-':>6}"
            p_columns = f"{'cannot test':>25}" if layer.cannot_test else \
                f"{layer.log10_p:12.2f} {format_p(layer.log10_p):>12}"
            lines.append(f"{layer.layer_a:8d} {layer.layer_b:8d} {rho} {units} {p_columns}")
    lines.append("")
    if result.value is not None:
        lines.append(f"raw value = {result.value:.6g}")
    if result.log10_p is not None:
        lines.append(f"{'aggregate ' if result.layers else ''}log10 p = {result.log10_p:.2f}")
    if result.closeness is not None:
        lines.append(f"closeness = {result.closeness:.4f} (mean cosine of matched activations; no p-value)")
    lines += [f"note: {note}" for note in result.notes]
    lines.append(f"verdict: {result.verdict()}")
    return "\n".join(lines)
