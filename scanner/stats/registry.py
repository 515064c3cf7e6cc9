"""Every statistic hubtrace computes for a pair of models, named once: what it reads, the pure function that
computes it, its null, what its p-value is worth, and what it survives.

Why one table: a statistic's name travels from `hubtrace test --stat`, a scan's config and the pair workers to the
stored `pair_tests.statistic` and the evidence report; each of them reads the set of names, which of them a
fingerprint can give, which need an empirical null, and what a reader should be told, from here. The pair test
(scanner.pairs.compare, scanner.pairs.fingerprint_compare) gathers what an entry ``reads`` and hands it to the
entry's ``compute``; docs/statistics.md's table lists the same entries (tests/test_statistic_registry.py).

Reading the table costs no numpy or scipy (`hubtrace --help` lists the names): ``compute`` names its function,
imported when first called.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from scanner.stats.weight_statistics import PairKind, WeightProfile, WeightStatistic

Reads = Literal["gate and up activations", "hidden activations", "up-projection weights", "block weights",
                "next-token distributions", "weight profile"]
"""What a statistic reads of a model: the first two from a fingerprint (or a checkpoint run on the canonical
inputs), the others from the checkpoint (the weight profile: norm weights, attention spreads and spectra, a sample of
MLP weight values; scanner.reading.weight_profiles)."""
FINGERPRINT_READS: tuple[Reads, ...] = ("gate and up activations", "hidden activations")
"""What a fingerprint holds, so what a scan and `hubtrace test --fingerprint` can test."""

Null = Literal["permutation argument", "PERMTEST", "empirical null", "coincidence rate", "none"]
"""Where a p-value comes from: the matching of independent models is a uniformly random permutation, so Spearman's
null (docs/statistics.md); PERMTEST over output-preserving permutations of model A; the values on independent pairs
of the same kind; the pair's own rate of chance coincidences; or no null at all."""

Validity = Literal["valid p-value", "empirical p-value", "no p-value"]
"""What the p-value is worth: valid under independence (by proof, or for phi_MATCH as the trained nulls measure it);
valid only when the tested pair is exchangeable with the null's pairs; or none, the raw value alone."""


@dataclass(frozen=True)
class PureFunction:
    """A function of scanner.stats by module and name, imported when first called."""

    module: str
    name: str

    def resolve(self) -> Callable[..., Any]:
        return getattr(import_module(f"scanner.stats.{self.module}"), self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@dataclass(frozen=True)
class Statistic:
    """One statistic: ``name`` as ``--stat``, a scan's config and ``pair_tests.statistic`` spell it; ``symbol`` as
    the docs write it; ``reads`` what it needs of each model; ``computed`` in words and ``compute``, the pure
    function; ``null`` and ``validity`` (module docstring); ``robustness``: what it survives and what defeats it,
    as the tests measure it, printed by the evidence report beside its value; ``caveat``: the note every test with
    it carries, where it has one."""

    name: str
    symbol: str
    reads: Reads
    computed: str
    compute: PureFunction
    null: Null
    validity: Validity
    robustness: str
    caveat: str | None = None

    @property
    def from_fingerprints(self) -> bool:
        return self.reads in FINGERPRINT_READS


# What the weight fingerprints survive and what defeats them, as tests/test_weight_statistics.py measures it on the
# zoo (a fine-tune, depth and width prunes, a retrained MLP, and copies camouflaged by T1-T6: residual permutation
# and rotation, unit permutation, q/k rotation, new norm gains folded into the next maps, up/down scaling). Every
# test of one carries its line, since a raw value of ~0.99 means nothing without it.
_LAYERNORM = ("LayerNorm cosine survives fine-tuning, pruning and MLP retraining, and is defeated by new norm gains "
              "with a residual permutation or rotation (T1, T3, T5: camouflaged copies score about 0); unrelated "
              "models score ~0.99, which is why only its p-value says anything")
_ATTN_STD = ("the intrinsic fingerprint survives fine-tuning, pruning and T1-T6 camouflage, but unrelated models "
             "trained alike can correlate as well as a fine-tune and its base (up to 0.997 among the zoo's 17 "
             "independent bases): only its empirical null says what a value is worth")
_GHOSTSPEC = ("GhostSpec survives fine-tuning, pruning and T1-T6 camouflage, but unrelated models trained alike can "
              "correlate as well as a fine-tune and its base (up to 0.998 among the zoo's 17 independent bases): "
              "only its empirical null says what a value is worth")
_VERBATIM = ("the verbatim share finds sparse derivations (a TIES or DARE merge keeps its base's values where it "
             "trimmed or dropped, a TIES merge its sources' where one alone was kept) and is defeated by any dense "
             "update (fine-tuning, a merged LoRA, linear, SLERP, task-arithmetic and model-stock merges score 0) "
             "and by every camouflage that moves values (T1-T6): a small p says the two share values verbatim, a "
             "large one says nothing about independence")

STATISTICS: tuple[Statistic, ...] = (
    Statistic(
        "match", "φ_MATCH", "gate and up activations",
        "per block, Spearman between the MATCH of the gate activations and the MATCH of the up activations (a MoE "
        "block's experts paired, and its units pooled: Bonferroni); FISHER over blocks",
        PureFunction("independence", "phi_match_many"), "permutation argument", "valid p-value",
        "phi_MATCH survives T1-T6 camouflage (permutations, rotations, scalings), pruning, fine-tuning and MLP "
        "retraining (tests/test_power_and_validity.py); valid p-value under independence"),
    Statistic(
        "up", "φ_U", "up-projection weights",
        "per block, Spearman between the MATCH of the up-projection rows and the identity; FISHER over blocks",
        PureFunction("independence", "phi_u"), "permutation argument", "valid p-value",
        "phi_U is fooled by permuting hidden units or the residual stream",
        caveat="phi_U is fooled by permuting hidden units or the residual stream; use --stat match against "
               "adversaries"),
    Statistic(
        "hidden", "φ_H", "hidden activations",
        "per block, Spearman between the MATCH of the down projection's inputs σ(Gx)⊙Ux and the identity; FISHER "
        "over blocks", PureFunction("independence", "phi_h"), "permutation argument", "valid p-value",
        "phi_H is fooled by permuting hidden units",
        caveat="phi_H is fooled by permuting hidden units; use --stat match against adversaries"),
    Statistic(
        "l2", "φ_ℓ2", "block weights",
        "minus the ℓ2 distance between the two models' blocks, ranked among Appendix B permutations of model A",
        PureFunction("l2", "phi_l2"), "PERMTEST", "valid p-value",
        "phi_l2 is fooled by any rotation of the residual stream; PERMTEST over permutations"),
    Statistic(
        "jsd", "φ_JSD", "next-token distributions",
        "the mean Jensen-Shannon divergence of the two models' next-token distributions on the canonical inputs",
        PureFunction("jsd", "mean_jensen_shannon"), "none", "no p-value",
        "phi_JSD has no null distribution (it is invariant to every output-preserving change): no p-value",
        caveat="phi_JSD has no valid null distribution (it is invariant to every output-preserving change): "
               "raw value only, no p-value"),
    Statistic(
        "layernorm", "LayerNorm cosine", "weight profile",
        "the mean over layers and norm kinds of the cosine between the two models' norm weights",
        PureFunction("weight_statistics", "layernorm_test"), "PERMTEST", "valid p-value",
        _LAYERNORM, caveat=_LAYERNORM),
    Statistic(
        "attn-std", "intrinsic fingerprint", "weight profile",
        "the mean over W_Q, W_K, W_V, W_O of the correlation of their per-layer standard deviations",
        PureFunction("weight_statistics", "attn_std_test"), "empirical null", "empirical p-value",
        _ATTN_STD, caveat=_ATTN_STD),
    Statistic(
        "ghostspec", "GhostSpec", "weight profile",
        "the mean over M_qk and M_vo of the correlation of their per-layer mean top singular values",
        PureFunction("weight_statistics", "ghostspec_test"), "empirical null", "empirical p-value",
        _GHOSTSPEC, caveat=_GHOSTSPEC),
    Statistic(
        "verbatim", "verbatim share", "weight profile",
        "the share of sampled MLP weight values that are bit for bit equal",
        PureFunction("weight_statistics", "verbatim_test"), "coincidence rate", "valid p-value",
        _VERBATIM, caveat=_VERBATIM),
)

STATISTIC_BY_NAME: Mapping[str, Statistic] = {entry.name: entry for entry in STATISTICS}
STATISTIC_NAMES: tuple[str, ...] = tuple(STATISTIC_BY_NAME)
FINGERPRINT_STATISTICS: tuple[str, ...] = tuple(entry.name for entry in STATISTICS if entry.from_fingerprints)
"""The statistics a fingerprint carries activations for (so the ones a scan can test)."""
WEIGHT_STATISTICS: tuple[str, ...] = tuple(entry.name for entry in STATISTICS if entry.reads == "weight profile")
"""The weight fingerprints of public disputes, which a scan can record beside each tested pair (pairs.extra_stats)."""
EMPIRICAL_NULL_STATISTICS: tuple[str, ...] = tuple(entry.name for entry in STATISTICS
                                                   if entry.null == "empirical null")
"""The statistics PERMTEST cannot move, whose p-value stands on the values of independent pairs."""

# The names as types, for a scan's config (its errors then list the names allowed).
FingerprintStatistic = Literal[FINGERPRINT_STATISTICS]  # type: ignore[valid-type]
WeightStatisticName = Literal[WEIGHT_STATISTICS]  # type: ignore[valid-type]


def statistic(name: str, among: Sequence[str] = STATISTIC_NAMES) -> Statistic:
    """The entry named ``name``; ValueError naming the choices when it is not one of ``among``."""
    if name not in among:
        raise ValueError(f"unknown statistic {name!r}; choose one of {', '.join(among)}")
    return STATISTIC_BY_NAME[name]


def robustness(name: str) -> str:
    """What the statistic stored as ``name`` survives and what defeats it ("" for a name this hubtrace lacks)."""
    entry = STATISTIC_BY_NAME.get(name)
    return entry.robustness if entry is not None else ""


def weight_statistic(name: str, a: WeightProfile, b: WeightProfile, *, null: Sequence[float] | None = None,
                     kind: PairKind | None = None, permutations: int = 999, seed: int = 0) -> WeightStatistic:
    """One weight fingerprint of a pair: its value and the p-value its null allows (scanner.stats.weight_statistics);
    ``null``: the values on independent pairs of the pair's ``kind``."""
    from scanner.stats.weight_statistics import WeightTestOptions

    return statistic(name, WEIGHT_STATISTICS).compute(a, b, WeightTestOptions(null, kind, permutations, seed))
