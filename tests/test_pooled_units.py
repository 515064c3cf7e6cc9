"""A MoE block's units tested pooled (scanner.stats.pooled_units): which units a large block pools, why they are
labelled in a pseudo-random order, and how the block's p-value joins the experts'.

The synthetic blocks here have what trained experts have and random weights lack: each expert's units share a
direction in both views (an expert's specialty), and both models learn one map between the views (a feature that
independently trained models share). Two matchings of B's units then tend to fall in the same expert of A without
choosing the same unit: a relation between the experts' layouts, not between the models.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import kstest

from scanner.reading.activations import MLPActivations, block_contributions, net_written, pooled_activations
from scanner.stats.canonical import output_sizes
from scanner.stats.experts import pair_experts
from scanner.stats.independence import phi_match_many
from scanner.stats.logp import log10_bonferroni
from scanner.stats.pooled_units import POOLED_UNITS, pooled_block_log10_p, pooled_rows
from tests.null_support import binomial_bound

TOKENS = 128
#: The one map between the views that both models learn: a fixed reordering of the tokens.
SHARED_MAP = np.random.default_rng(99).permutation(TOKENS)
KS_ALPHA = 1e-3
#: The token whose units the first version pooled first (the first of its fixed token order), where the independent
#: check made every filler unit's gate peak.
FLOODED_TOKEN = int(np.random.default_rng(0).permutation(TOKENS)[0])


def expert_block(rng: np.random.Generator, experts: int, units: int, noise: float = 0.6) -> list[MLPActivations]:
    """A block of ``experts`` experts of ``units`` units: each expert's gate rows about one direction of its own, its
    up rows about that direction seen through SHARED_MAP; each unit's output column of a random length."""
    block = []
    for _ in range(experts):
        specialty = rng.standard_normal(TOKENS)
        gate = specialty + noise * rng.standard_normal((units, TOKENS))
        up = specialty[SHARED_MAP] + noise * rng.standard_normal((units, TOKENS))
        block.append(MLPActivations(gate.astype(np.float32), up.astype(np.float32),
                                    written=rng.uniform(0.5, 2.0, units).astype(np.float32)))
    return block


def kept_rows(block: list[MLPActivations]) -> np.ndarray:
    return pooled_rows(block_contributions(block, "silu").sizes)


def pooled_log10_p(a: list[MLPActivations], b: list[MLPActivations], labelled: bool = True) -> float:
    """phi_MATCH of two blocks' units pooled, labelled as the product labels them (or in stored order)."""
    rows = [kept_rows(side) if labelled else np.arange(sum(m.gate.shape[0] for m in side)) for side in (a, b)]
    x, y = pooled_activations(a, rows[0]), pooled_activations(b, rows[1])
    (test,) = phi_match_many([(x.gate, x.up, y.gate, y.up)], up_sign_free=True)
    assert not test.cannot_test
    return test.log10_p


@pytest.mark.slow  # a calibration study (KS), though a quick one
def test_pooled_p_values_of_independent_blocks_are_valid_only_with_the_units_labelled_apart() -> None:
    """30 independent pairs of 8-expert blocks (fixed seed). Labelled in stored order, the experts' layout alone makes
    the matchings agree (one-sided KS p 5e-6 when this was written); labelled in the product's pseudo-random order
    the p-values are valid (0.06). False failures for exactly valid p-values: 0.1% (KS) plus the count's 0.1%."""
    rng = np.random.default_rng(0)
    pairs = [(expert_block(rng, 8, 32), expert_block(rng, 8, 32)) for _ in range(30)]
    stored = [10.0 ** pooled_log10_p(a, b, labelled=False) for a, b in pairs]
    labelled = [10.0 ** pooled_log10_p(a, b) for a, b in pairs]
    assert kstest(stored, "uniform", alternative="greater").pvalue < KS_ALPHA
    assert kstest(labelled, "uniform", alternative="greater").pvalue >= KS_ALPHA
    assert sum(p <= 0.01 for p in labelled) <= binomial_bound(len(labelled))


def _copied(block: list[MLPActivations], rng: np.random.Generator, filler: int = 0) -> list[MLPActivations]:
    """The block's experts in another order, each one's units permuted and rescaled (up rows by s, output columns by
    1/s, signs of both flipped; a gate's scale is no free choice where the activation is not homogeneous), views
    rounded to float16 as a fingerprint stores them; ``filler`` random units beside them in every expert, each writing
    1e-5 of the longest column."""
    out = []
    for k in rng.permutation(len(block)):
        order = rng.permutation(block[k].gate.shape[0])
        scale = rng.uniform(0.01, 100.0, size=order.size)
        gate, up = block[k].gate[order], block[k].up[order] * -scale[:, None]
        written = block[k].written[order] / scale
        extra = rng.standard_normal((2, filler, TOKENS))
        extra[0, :, FLOODED_TOKEN] = 10.0  # every filler's gate peaks at one token
        out.append(MLPActivations(np.concatenate([gate, extra[0]]).astype(np.float16),
                                  np.concatenate([up, extra[1]]).astype(np.float16),
                                  written=np.concatenate([written, np.full(filler, 1e-5 * written.max())])))
    return out


def test_a_large_block_pools_the_same_units_of_a_copy_whatever_their_order_and_scale() -> None:
    """A block of 48 x 128 units, more than POOLED_UNITS: the units kept are chosen by what they contribute, so a copy
    (experts and units reordered, units rescaled, float16) keeps the same units, and the pooled test finds it; an
    independent block does not (log10 p >= -3: a false failure about 1e-3 for a valid p-value)."""
    rng = np.random.default_rng(1)
    original = expert_block(rng, 48, 128, noise=2.0)
    copy = _copied(original, rng)
    kept = [kept_rows(side) for side in (original, copy)]
    assert all(k.size == POOLED_UNITS for k in kept)

    def kept_gates(block: list[MLPActivations], rows: np.ndarray) -> np.ndarray:
        gates = np.concatenate([m.gate for m in block]).astype(np.float64)[rows]
        return gates / np.linalg.norm(gates, axis=1, keepdims=True)

    nearest = (kept_gates(copy, kept[1]) @ kept_gates(original, kept[0]).T).max(axis=1)
    assert (nearest > 0.999).mean() >= 0.95  # each unit the copy keeps is one the original keeps
    assert pooled_log10_p(original, copy) <= -100.0
    assert pooled_log10_p(original, expert_block(rng, 48, 128, noise=2.0)) >= -3.0


def test_two_sides_of_other_sizes_keep_nested_units() -> None:
    """The kept units are the largest contributors on both sides: a copy with more units (experts added) keeps, of the
    original's units, only units the original keeps."""
    rng = np.random.default_rng(2)
    original = expert_block(rng, 40, 128, noise=2.0)
    larger = original + expert_block(rng, 8, 128, noise=2.0)
    small, large = kept_rows(original), kept_rows(larger)
    n = sum(m.gate.shape[0] for m in original)
    from_original = set(large[large < n].tolist())
    assert from_original <= set(small.tolist()) and len(from_original) >= POOLED_UNITS // 2


def test_units_that_write_next_to_nothing_do_not_take_a_copy_s_place() -> None:
    """Found by an independent check (bench/redteam/canonical58), against a selection by each unit's own values: a copy
    given more units than the block pools, each writing 1e-5 of what the real ones write, pooled them and not its
    real units. Kept by what they contribute, the real units are pooled first and the copy is found."""
    rng = np.random.default_rng(3)
    original = expert_block(rng, 8, 32)
    copy = _copied(original, rng, filler=POOLED_UNITS // 4)
    rows = kept_rows(copy)
    n_copy = sum(m.gate.shape[0] for m in copy)
    assert n_copy > POOLED_UNITS and rows.size == POOLED_UNITS
    real = np.concatenate([np.arange(32) + k * (32 + POOLED_UNITS // 4) for k in range(8)])
    assert set(real.tolist()) <= set(rows.tolist())
    assert pooled_log10_p(original, copy) <= -100.0


def _ghosts(rng: np.random.Generator, count: int, gates: np.ndarray) -> MLPActivations:
    """``count`` units whose gates copy rows of ``gates`` at 2^-20 of their size, with up rows and output columns 30
    times a real unit's: |up| |write| 900 times a real unit's, what they add 1e-3 of it (bench/redteam/canonical59)."""
    rows = gates[rng.integers(0, gates.shape[0], count)] * 2.0**-20
    return MLPActivations(rows.astype(np.float32), (30 * rng.standard_normal((count, TOKENS))).astype(np.float32),
                          written=np.full(count, 30.0, np.float32))


def test_units_large_as_stored_but_gated_to_nothing_neither_fill_the_pool_nor_lead_the_pairing() -> None:
    """Found by an independent check (bench/redteam/canonical59): units with a gate 2^-20 of a real one's and up rows
    and output columns large enough to outrank every real unit by |up| |write| filled the pool, and, their gates
    copies of the next expert's, led the expert pairing to pair every expert with its neighbour. What a unit adds is
    its hidden row (the gate's activation included) times its write: such units come last."""
    rng = np.random.default_rng(4)
    original = expert_block(rng, 4, 64)
    copy = [MLPActivations(np.concatenate([m.gate, g.gate]), np.concatenate([m.up, g.up]),
                           written=np.concatenate([m.written, g.written]))
            for k, m in enumerate(original) for g in [_ghosts(rng, POOLED_UNITS, original[(k + 1) % 4].gate)]]
    rows = kept_rows(copy)
    real = np.concatenate([np.arange(64) + k * (64 + POOLED_UNITS) for k in range(4)])
    assert set(real.tolist()) <= set(rows.tolist())
    weights = block_contributions(copy, "silu").sizes
    paired = pair_experts([(m.gate, m.up) for m in original], [(m.gate, m.up) for m in copy], weights_b=weights)
    assert paired.pairs == [(k, k) for k in range(4)]
    unweighed = pair_experts([(m.gate, m.up) for m in original], [(m.gate, m.up) for m in copy])
    assert unweighed.pairs != paired.pairs  # what the weights answer


def _loud_pairs(rng: np.random.Generator, count: int, gates: np.ndarray, loud: float) -> tuple[MLPActivations,
                                                                                               np.ndarray]:
    """``count`` pairs (gate 2^-20 g, up u, write +c) and (gate 2^-20 u, up g, write -c), g copies of rows of
    ``gates``: silu(e g.x)(u.x) - silu(e u.x)(g.x) is second order in e, so each pair puts out next to nothing while
    each unit alone puts out ``loud`` times as much as a real one (bench/redteam/canonical60). Returned as their read
    views and their writes (one row per unit)."""
    g = gates[rng.integers(0, gates.shape[0], count)]
    u = rng.standard_normal((count, TOKENS))
    c = rng.standard_normal((count, TOKENS))
    gate = np.concatenate([2.0**-20 * g, 2.0**-20 * u])
    up = np.concatenate([loud * 2.0**21 * u, loud * 2.0**21 * g])
    return MLPActivations(gate.astype(np.float32), up.astype(np.float32)), np.concatenate([c, -c])


def _with_writes(views: MLPActivations, writes: np.ndarray, read_on: str) -> MLPActivations:
    """The views with what each unit writes: as a write view read on the stream, or, where a layout gives no stream
    to read it on (DeepSeek-V4), as the fingerprint keeps it then, each unit's net write size made from its output
    column (``writes`` taken for the columns)."""
    if read_on == "stream":
        return replace(views, write=writes)
    return replace(views, written=net_written(views, torch.from_numpy(writes.T.copy()), "silu"))


@pytest.mark.parametrize("read_on", ["stream", "columns"])
def test_loud_pairs_whose_outputs_cancel_neither_fill_the_pool_nor_lead_the_pairing(read_on: str) -> None:
    """Found by an independent check (bench/redteam/canonical60), against contributions measured unit by unit: pairs
    of units that each put out 30 times a real unit's output and cancel each other filled the pool and led the expert
    pairing to each expert's neighbour (where the writes are output columns' lengths alone, beside canonical57's
    pieces in a DeepSeek-V4: -0.15 / -1.55). Units that put out one function count together, for their sum:
    nothing."""
    rng = np.random.default_rng(5)
    experts = expert_block(rng, 4, 64)
    real_writes = [rng.standard_normal((64, TOKENS)) for _ in experts]
    original = [_with_writes(m, w, read_on) for m, w in zip(experts, real_writes, strict=True)]
    copy, copy_writes = [], []
    for k, (m, w) in enumerate(zip(experts, real_writes, strict=True)):
        ghosts, ghost_writes = _loud_pairs(rng, POOLED_UNITS // 2, experts[(k + 1) % 4].gate, loud=30.0)
        copy_writes.append(np.concatenate([w, ghost_writes]))
        copy.append(_with_writes(MLPActivations(np.concatenate([m.gate, ghosts.gate]),
                                                np.concatenate([m.up, ghosts.up])), copy_writes[-1], read_on))
    weights = block_contributions(copy, "silu").sizes
    real = np.concatenate([np.arange(64) + k * (64 + POOLED_UNITS) for k in range(4)])
    assert set(real.tolist()) <= set(pooled_rows(weights).tolist())
    alone = np.concatenate([np.linalg.norm(m.hidden("silu"), axis=1) * np.linalg.norm(w, axis=1)
                            for m, w in zip(copy, copy_writes, strict=True)])
    assert np.median(alone[np.setdiff1d(np.arange(alone.size), real)]) > 10 * alone[real].max()  # loud alone
    paired = pair_experts([(m.gate, m.up) for m in original], [(m.gate, m.up) for m in copy], weights_b=weights)
    assert paired.pairs == [(k, k) for k in range(4)]


def test_units_are_labelled_out_of_their_stored_order() -> None:
    rows = pooled_rows([np.ones(64)] * 4)
    assert sorted(rows.tolist()) == list(range(256))
    assert abs(np.corrcoef(rows, np.arange(rows.size))[0, 1]) < 0.2


@pytest.mark.parametrize(("experts", "pooled", "expected"), [
    (-10.0, -50.0, log10_bonferroni([-10.0, -50.0])),
    (-50.0, -10.0, log10_bonferroni([-50.0, -10.0])),
    (None, -50.0, -50.0),
    (-10.0, None, -10.0),
    (None, None, None),
    (-0.1, -0.2, 0.0),
])
def test_a_block_takes_the_smaller_of_its_tests_times_their_number(experts, pooled, expected) -> None:
    assert pooled_block_log10_p(experts, pooled) == expected


def test_net_write_sizes_are_unchanged_by_output_preserving_rescales() -> None:
    """A unit's up row times s and its output column over s (s from 2^-40 to 2^40) compute the same function: what
    each unit contributes, read off its net write size where no write view is read, stays within float32 rounding,
    and units that do not cancel keep their columns' lengths."""
    rng = np.random.default_rng(6)
    gate, up = rng.standard_normal((2, 32, TOKENS)).astype(np.float32)
    columns = rng.standard_normal((32, 48)).astype(np.float32)
    scale = (2.0 ** rng.integers(-40, 41, 32)).astype(np.float32)
    before = _with_writes(MLPActivations(gate, up), columns, "columns")
    after = _with_writes(MLPActivations(gate, up * scale[:, None]), columns / scale[:, None], "columns")
    np.testing.assert_allclose(*(block_contributions([m], "silu").sizes[0] for m in (after, before)), rtol=1e-5)
    np.testing.assert_allclose(before.written, np.linalg.norm(columns, axis=1), rtol=1e-5)


#: One unit's (gate, up, write) views.
UnitViews = tuple[np.ndarray, np.ndarray, np.ndarray]


def _ghost_units(rng: np.random.Generator, ghosts: int, construction: str, s: float
                 ) -> tuple[list[UnitViews], list[UnitViews]]:
    """Loud units that the block's weighing cancels, as (gate, up, write) views for every routed expert and for the
    shared expert, where the chosen experts' weights always sum to ``s``. "same" (bench/redteam/canonical61): one unit
    writing -G in every routed expert and +s G in the shared one. "odd" (bench/redteam/canonical62): silu(z) -
    silu(-z) = z, so (k, r, s w), (r, k, -s w) in the shared expert and (-k, r, -w), (-r, k, w) in every routed
    one sum to s w ((k.x)(r.x) - (r.x)(k.x)) = 0, though no two of their hidden rows are alike."""
    k, r = rng.standard_normal((2, ghosts, TOKENS))
    w = 30.0 * rng.standard_normal((ghosts, TOKENS))
    if construction == "same":
        return [(k, r, -w)], [(k, r, s * w)]
    return [(-k, r, -w), (-r, k, w)], [(k, r, s * w), (r, k, -s * w)]


@pytest.mark.parametrize("construction", ["same", "odd"])
def test_loud_units_that_cancel_across_routed_and_shared_experts_do_not_fill_the_pool(construction: str) -> None:
    """Found by independent checks (bench/redteam/canonical61, canonical62): where the chosen experts' weights always
    sum to s (DeepSeek-V3's normalised top-k), loud units in every routed expert and in the shared expert that the
    block's weighing cancels (`_ghost_units`), each alone 30 times a real unit, filled a block's pool ("no evidence",
    -0.00 and -0.01). What a unit adds is read on the whole block, each routed expert's hidden rows weighed as the
    block weighs them, units that write along one direction summed: the ghosts count for their sum, nothing."""
    rng = np.random.default_rng(7)
    experts, real, s = 4, 64, 2.5
    chosen = np.argsort(rng.random((TOKENS, experts)), axis=1)[:, :2]  # two experts a token
    raw = np.zeros((experts, TOKENS))
    np.put_along_axis(raw.T, chosen, rng.uniform(0.2, 1.0, (TOKENS, 2)), axis=1)
    routing = s * raw / raw.sum(axis=0, keepdims=True)
    routed_ghosts, shared_ghosts = _ghost_units(rng, POOLED_UNITS // 4 if construction == "same" else POOLED_UNITS // 8,
                                                construction, s)

    def mlp(ghosts: list[UnitViews], weight: np.ndarray | None) -> MLPActivations:
        gate, up = rng.standard_normal((2, real, TOKENS))
        views = [np.concatenate([part, *(g[i] for g in ghosts)])
                 for i, part in enumerate((gate, up, rng.standard_normal((real, TOKENS))))]
        return MLPActivations(views[0].astype(np.float32), views[1].astype(np.float32), write=views[2],
                              weight=None if weight is None else weight.astype(np.float32))

    block = [mlp(routed_ghosts, routing[e]) for e in range(experts)] + [mlp(shared_ghosts, None)]
    sizes = [m.gate.shape[0] for m in block]
    real_rows = np.concatenate([np.arange(real) + sum(sizes[:k]) for k in range(experts + 1)])
    assert sum(sizes) > POOLED_UNITS + real * (experts + 1)
    assert set(real_rows.tolist()) <= set(pooled_rows(block_contributions(block, "silu").sizes).tolist())
    each_alone = [block_contributions([m], "silu").sizes[0] for m in block]
    assert not set(real_rows.tolist()) <= set(pooled_rows(each_alone).tolist())  # what reading the block answers


def test_parts_within_the_bar_of_each_other_count_for_what_they_put_out_together() -> None:
    """Two units that read alike and write m + n and -m + (w - n), m a thousand times w: their writes agree up to sign
    within the bar, so they count together, and together they put out h w^T, a real unit's output, whatever the
    leader's direction says: each counts for |h| |w|, not for the difference of their sizes."""
    rng = np.random.default_rng(8)
    h = rng.standard_normal(TOKENS)
    m, n, w = 1000.0 * rng.standard_normal(TOKENS), rng.standard_normal(TOKENS), rng.standard_normal(TOKENS)
    sizes = output_sizes(np.stack([h, h]), np.stack([m + n, -m + (w - n)]))
    np.testing.assert_allclose(sizes, np.linalg.norm(h) * np.linalg.norm(w), rtol=1e-6)


def test_units_repeated_in_every_expert_do_not_lead_the_pairing() -> None:
    """Independent checks (bench/redteam/canonical61, canonical62) put the same loud units in every routed expert of a
    copy whose experts they had rolled by one: every expert's largest units were then alike, the experts' similarities
    tied exactly, and the pairing fell to stored order, pairing every expert with the wrong one. Units counted with
    another MLP's tell no expert from another, so the pairing weighs them as nothing."""
    rng = np.random.default_rng(9)
    original = [MLPActivations(m.gate, m.up, write=rng.standard_normal((64, TOKENS)))
                for m in expert_block(rng, 4, 64)]
    gate, up = rng.standard_normal((2, 600, TOKENS))
    write = 30.0 * rng.standard_normal((600, TOKENS))
    rolled = original[1:] + original[:1]
    copy = [MLPActivations(np.concatenate([m.gate, gate]).astype(np.float32),
                           np.concatenate([m.up, up]).astype(np.float32), write=np.concatenate([m.write, write]))
            for m in rolled]
    truth = [(k, (k - 1) % 4) for k in range(4)]
    distinct = block_contributions(copy, "silu").distinct
    paired = pair_experts([(m.gate, m.up) for m in original], [(m.gate, m.up) for m in copy], weights_b=distinct)
    assert sorted(paired.pairs) == truth
    alike = pair_experts([(m.gate, m.up) for m in original], [(m.gate, m.up) for m in copy],
                         weights_b=block_contributions(copy, "silu").sizes)
    assert sorted(alike.pairs) != truth  # what leaving them out answers
