"""The weight fingerprints quoted in public lineage disputes, each with the null distribution it can have.

* **LayerNorm cosine** (the Solar-Open-100B vs GLM-4.5-Air claim): the mean, over layers, of the cosine between the
  two models' norm weights at the same layer. Norm weights start at 1.0, so unrelated models score ~0.99 and the raw
  number says nothing. A permutation of the residual stream is output-preserving, leaves the initialisation
  (all ones) invariant and commutes with training, so PERMTEST over such permutations of model A gives an exact
  p-value: the observed cosine ranked among the cosines of A's norms permuted (`layernorm_permtest`).
* **Intrinsic fingerprint** (Pangu Pro MoE vs Qwen2.5-14B): per layer the standard deviation of W_Q, W_K, W_V and
  W_O; per projection the Pearson correlation of the two models' z-scored sequences over layers (the shorter one
  linearly interpolated to the longer, as its authors do); the value is the mean of the four correlations.
* **GhostSpec** (GhostSpec-corr): per layer the mean singular value of M_qk = W_q W_k^T and of M_vo = W_v W_o; per
  product the Pearson correlation of the two models' sequences over layers; the value is the mean of the two. Ours
  averages the top `GHOSTSPEC_TOP` singular values of each product, not all of them (a full SVD of a 4096 x 4096
  product per layer and model costs minutes on a CPU).
* **Verbatim share** (not from a dispute; scanner.stats.verbatim): the share of sampled MLP weight values that are
  bit-equal, against the pair's own coincidence rate. It names sparse derivations (TIES and DARE merges and their
  bases) and says nothing of dense ones.

attn-std and GhostSpec are unchanged by every transformation PERMTEST could use: permutations and rotations of the
residual stream or of heads move no standard deviation and no singular value, and the scalings that would (W_q by c,
W_k by 1/c) do not leave a model's initialisation invariant, so they would not give a valid null. So these two get a
p-value only against an empirical null: their values on pairs of models known (or tested) to be independent,
p = (1 + #{null >= observed}) / (n + 1), valid when the tested pair is exchangeable with those pairs under
independence; its smallest value is 1 / (n + 1). Exchangeable means alike: independent models trained alike
correlate far more (0.997-0.998 among the zoo's bases) than models of other depths, widths or types, so the null of
a pair is drawn only from pairs of the same kind (`pair_kind`: the two models' type, depth and width), and a null of
fewer than MIN_NULL_PAIRS pairs gives no p-value at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from scanner.stats.logp import log10_permutation_p
from scanner.stats.verbatim import verbatim_share

#: Singular values of each attention product that GhostSpec averages per layer.
GHOSTSPEC_TOP = 32
#: A pair whose phi_MATCH p-value is above this joins the empirical null of the weight fingerprints that need one.
NULL_MATCH_P = 0.05
#: Fewest null pairs of a pair's kind for an empirical p-value: with fewer, no p-value could reach 0.05.
MIN_NULL_PAIRS = 19

Shape = tuple[str, int, int]
"""A model's kind for an empirical null: its model type, depth (blocks) and width (hidden size)."""
PairKind = tuple[Shape, Shape]
"""The kinds of a pair's two models, in sorted order (a pair and its reverse are one kind)."""


def pair_kind(a: Shape, b: Shape) -> PairKind:
    return (a, b) if a <= b else (b, a)


def describe_kind(kind: PairKind) -> str:
    """The kind in words, for notes: 'llama, 4 blocks of width 64' or both models' when they differ."""
    (type_a, depth_a, width_a), (type_b, depth_b, width_b) = kind
    if kind[0] == kind[1]:
        return f"{type_a}, {depth_a} blocks of width {width_a}"
    return f"{type_a} ({depth_a} blocks of width {width_a}) with {type_b} ({depth_b} blocks of width {width_b})"


@dataclass(frozen=True)
class WeightProfile:
    """What the weight fingerprints read from one model, layer by layer (float64).

    ``norms``: (layers, kinds, d) the residual-stream norm weights as the model applies them (attention and MLP
    pre-norms, post-norms where the family has them); ``attn_std``: (layers, 4) the standard deviation of W_Q, W_K,
    W_V, W_O; ``ghostspec``: (layers, 2) the mean of the top singular values of M_qk and M_vo; ``mlp_values``: the
    MLP weight values read at scanner.stats.verbatim.sample_positions, block by block (float32, exact), and
    ``mlp_layout`` a digest of the roles and shapes they were read from (samples of one layout line up; empty: none
    recorded)."""

    norms: np.ndarray
    attn_std: np.ndarray
    ghostspec: np.ndarray
    mlp_values: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    mlp_layout: str = ""


@dataclass(frozen=True)
class WeightStatistic:
    """A weight fingerprint's raw value and, where it has one, its log10 p-value and how that was obtained (a
    scanner.stats.result.StatisticResult)."""

    value: float
    log10_p: float | None
    null: str  # what the p-value stands on, or why there is none


def layernorm_cosine(norms_a: np.ndarray, norms_b: np.ndarray) -> float:
    """Mean over the common layers and norm kinds of the cosine between the two models' norm weights."""
    layers = min(norms_a.shape[0], norms_b.shape[0])
    a, b = norms_a[:layers].reshape(-1, norms_a.shape[-1]), norms_b[:layers].reshape(-1, norms_b.shape[-1])
    dot = np.einsum("ij,ij->i", a, b)
    return float(np.mean(dot / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-300)))


def layernorm_permtest(norms_a: np.ndarray, norms_b: np.ndarray, *, permutations: int = 999,
                       seed: int = 0) -> WeightStatistic:
    """LayerNorm cosine with PERMTEST over residual-stream permutations of model A (one permutation moves every
    norm of A alike, as it would move the whole model): exact, p >= 1 / (permutations + 1)."""
    if norms_a.shape[-1] != norms_b.shape[-1] or norms_a.shape[1] != norms_b.shape[1]:
        raise ValueError(f"norm weights of shapes {norms_a.shape} and {norms_b.shape} do not line up")
    rng = np.random.default_rng(seed)
    observed = layernorm_cosine(norms_a, norms_b)
    null = [layernorm_cosine(norms_a[..., rng.permutation(norms_a.shape[-1])], norms_b) for _ in range(permutations)]
    return WeightStatistic(observed, log10_permutation_p(observed, null),
                           f"PERMTEST over {permutations} residual-stream permutations of model A")


def sequence_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two per-layer sequences, the shorter linearly interpolated onto the longer's layers
    (0 when either is constant: no evidence either way)."""
    if a.size < 2 or b.size < 2:
        return 0.0
    short, long = (a, b) if a.size <= b.size else (b, a)
    stretched = np.interp(np.linspace(0.0, 1.0, long.size), np.linspace(0.0, 1.0, short.size), short)
    if np.std(stretched) == 0.0 or np.std(long) == 0.0:
        return 0.0
    return float(np.corrcoef(stretched, long)[0, 1])


def profile_correlation(profile_a: np.ndarray, profile_b: np.ndarray) -> float:
    """Mean over the profile's columns (Q, K, V, O; or M_qk, M_vo) of the per-layer sequence correlation."""
    return float(np.mean([sequence_correlation(profile_a[:, j], profile_b[:, j]) for j in range(profile_a.shape[1])]))


def empirical_test(observed: float, null: Sequence[float] | None, what: str, kind: PairKind | None = None
                   ) -> WeightStatistic:
    """A value against its empirical null (values on independent pairs of the tested pair's ``kind``): exact when
    the tested pair is exchangeable with them; no p-value without a null, or with one of fewer than MIN_NULL_PAIRS
    pairs."""
    if null is None:
        return WeightStatistic(observed, None, f"no p-value: {what} is invariant to every output-preserving "
                                               "transformation PERMTEST could use, and no empirical null was given")
    pairs = f"independent pairs of {describe_kind(kind)}" if kind is not None else "independent pairs"
    if len(null) < MIN_NULL_PAIRS:
        return WeightStatistic(observed, None, f"no p-value: the empirical null holds {len(null)} {pairs}, fewer "
                                               f"than {MIN_NULL_PAIRS} (no p-value could reach 0.05)")
    return WeightStatistic(observed, log10_permutation_p(observed, list(null)),
                           f"empirical null of {len(null)} {pairs} (smallest p 1/{len(null) + 1})")


@dataclass(frozen=True)
class WeightTestOptions:
    """What a weight fingerprint's null may use: ``null``, the values on independent pairs of the tested pair's
    ``kind`` (the empirical null); ``permutations`` and ``seed``, PERMTEST's. Each test reads the ones its null needs
    (scanner.stats.registry: one signature for all, so the registry dispatches on the name alone)."""

    null: Sequence[float] | None = None
    kind: PairKind | None = None
    permutations: int = 999
    seed: int = 0


def layernorm_test(a: WeightProfile, b: WeightProfile, options: WeightTestOptions = WeightTestOptions()
                   ) -> WeightStatistic:
    """The LayerNorm cosine with PERMTEST, or no value and why where the norms do not line up."""
    if a.norms.size == 0 or b.norms.size == 0:
        return WeightStatistic(float("nan"), None, "no p-value: a model without norm weights has no LayerNorm "
                                                   "cosine")
    if a.norms.shape[1:] != b.norms.shape[1:]:
        return WeightStatistic(float("nan"), None, f"no p-value: norm weights of shapes {a.norms.shape[1:]} and "
                               f"{b.norms.shape[1:]} (kinds, width) do not line up, so there is no cosine to take")
    return layernorm_permtest(a.norms, b.norms, permutations=options.permutations, seed=options.seed)


def attn_std_test(a: WeightProfile, b: WeightProfile, options: WeightTestOptions = WeightTestOptions()
                  ) -> WeightStatistic:
    """The intrinsic fingerprint against its empirical null."""
    return empirical_test(profile_correlation(a.attn_std, b.attn_std), options.null, "the intrinsic fingerprint",
                          options.kind)


def ghostspec_test(a: WeightProfile, b: WeightProfile, options: WeightTestOptions = WeightTestOptions()
                   ) -> WeightStatistic:
    """GhostSpec against its empirical null."""
    return empirical_test(profile_correlation(a.ghostspec, b.ghostspec), options.null, "GhostSpec", options.kind)


def verbatim_test(a: WeightProfile, b: WeightProfile, options: WeightTestOptions = WeightTestOptions()
                  ) -> WeightStatistic:
    """The share of sampled MLP weight values that are bit-equal, against the pair's own coincidence rate
    (scanner.stats.verbatim); no value when either profile has no sample or the two were read from other shapes.
    ``options`` go unread: the pair's own values are the null."""
    if not a.mlp_values.size or not b.mlp_values.size:
        return WeightStatistic(float("nan"), None, "no p-value: a profile without an MLP value sample (recorded "
                                                   "before samples were kept, or a family whose MLP is read as "
                                                   "fused experts)")
    if a.mlp_layout != b.mlp_layout:
        return WeightStatistic(float("nan"), None, "no p-value: the MLP matrices differ in shape, so no value "
                                                   "positions line up")
    shared = verbatim_share(a.mlp_values, b.mlp_values)
    return WeightStatistic(shared.share, shared.log10_p,
                           f"{shared.equal} of {shared.compared} sampled MLP weight values bit-equal, against "
                           f"{shared.coincident} of {shared.null_compared} values equal to a shifted one (the "
                           "coincidence rate); a Chernoff bound on the binomial tail")


NullPair = tuple[str, str, float, PairKind]
"""(model, model, value, kind) of one pair: a tested pair, or one of the empirical null."""


def leave_out_log10_p(observed: Sequence[NullPair], null: Sequence[NullPair]) -> list[tuple[float | None, int]]:
    """For each observed (model, model, value, kind): its log10 p against the null pairs of the same kind that share
    no model with it (so a pair is never part of its own null, nor a pair of one of its models), and the size of that
    null (the p cannot go below 1 / (size + 1)). None where fewer than MIN_NULL_PAIRS such pairs are left. Sorted
    counts and per-model exclusions per kind: O((n + m) log m), not a scan of the null per pair."""
    by_kind: dict[PairKind, list[NullPair]] = {}
    for row in null:
        by_kind.setdefault(row[3], []).append(row)
    tables = {kind: _NullTable(rows) for kind, rows in by_kind.items()}
    empty = _NullTable([])
    return [tables.get(kind, empty).log10_p(a, b, value) for a, b, value, kind in observed]


class _NullTable:
    """One kind's null values, sorted, with each model's pairs, for leave-out p-values."""

    def __init__(self, rows: Sequence[NullPair]) -> None:
        self.rows = rows
        self.values = np.sort(np.asarray([v for _, _, v, _ in rows], dtype=np.float64))
        self.by_model: dict[str, list[int]] = {}
        for k, (a, b, _, _) in enumerate(rows):
            self.by_model.setdefault(a, []).append(k)
            self.by_model.setdefault(b, []).append(k)

    def log10_p(self, a: str, b: str, value: float) -> tuple[float | None, int]:
        excluded = set(self.by_model.get(a, ())) | set(self.by_model.get(b, ()))
        size = len(self.rows) - len(excluded)
        if size < MIN_NULL_PAIRS or not np.isfinite(value):
            return None, size
        exceed = int(self.values.size - np.searchsorted(self.values, value, side="left"))
        exceed -= sum(1 for k in excluded if self.rows[k][2] >= value)
        return float(np.log10((1 + exceed) / (size + 1))), size
