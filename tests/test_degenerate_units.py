"""Valid p-values whatever the weights: all-zero, constant and duplicated units never make unrelated models look
related.

Issue 24's reproduction: a model whose gate and up units are all zero tested dependent on every model (rho = 1,
p = 1e-854), because MATCH's ties were broken by index order in the gate and the up matchings alike; half-zeroed
unrelated models gave p = 1e-19. scanner.stats.degenerate now sets such units aside before matching.

Validity tests: 150 independent pairs per case, a one-sided KS test against uniform at alpha = 0.01 (the issue's
bar: 1% false failures per test, about 21% that one of the 24 would fail for some new seed; the seeds are fixed),
for phi_MATCH, phi_U, phi_H and localize, with 25% or 50% of one side's units (or both sides') zeroed or
duplicated, in both argument orders. One-sided, because validity is P(p <= a) <= a: a block left with few
informative units is conservative by design (fewer than 8: p = 1), which a two-sided test would flag as
non-uniform (50% duplicated leaves about 9 of 48 units, measured).

Retrieval scores are no p-values, but they choose which pairs are tested: constant units (one signature in every
model) must not make unrelated models candidates; the unscreened control shows that they would.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from scanner.fingerprints.fingerprint import Fingerprint
from scanner.pairs.localize import localize
from scanner.reading.activations import MLPActivations
from scanner.retrieval.candidates import MIN_SCORE, scored_pairs
from scanner.retrieval.index import RetrievalIndex
from scanner.retrieval.signatures import DEFAULT_PARAMS, SignatureParams, retrieval_entry
from scanner.stats.degenerate import MIN_INFORMATIVE_UNITS, screen_units
from scanner.stats.independence import phi_h, phi_match, phi_u
from scanner.stats.logp import log10_inverse_factorial
from tests.synthetic_fingerprints import template_fingerprint

PAIRS = 150
ALPHA = 0.01
UNITS, WIDTH, TOKENS = 48, 16, 128


def _too_small(p_values: list[float]) -> float:
    """KS p-value against uniform for the alternative that the p-values are stochastically smaller (invalid)."""
    return stats.kstest(p_values, "uniform", alternative="greater").pvalue


def _degenerate(rows: np.ndarray, kind: str, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """rows with `fraction` of them zeroed, or each replaced by a copy of another (kept) row."""
    rows = rows.copy()
    chosen = rng.choice(rows.shape[0], size=int(round(fraction * rows.shape[0])), replace=False)
    if kind == "zero":
        rows[chosen] = 0.0
    else:
        sources = np.setdiff1d(np.arange(rows.shape[0]), chosen)
        rows[chosen] = rows[rng.choice(sources, size=chosen.size)]
    return rows


def _glu(rng: np.random.Generator, x: np.ndarray, kind: str | None, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(gate, up) activations (units, tokens) of a random GLU on x, the same units made degenerate in both views."""
    gate, up = rng.normal(size=(UNITS, WIDTH)), rng.normal(size=(UNITS, WIDTH))
    if kind is not None:
        state = rng.bit_generator.state
        gate = _degenerate(gate, kind, fraction, rng)
        rng.bit_generator.state = state  # the same units in the up view
        up = _degenerate(up, kind, fraction, rng)
    return (x @ gate.T).T, (x @ up.T).T


CASES = [(kind, fraction, both) for kind in ("zero", "duplicate") for fraction in (0.25, 0.5) for both in (False, True)]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fraction", "both"), CASES)
def test_phi_match_p_values_stay_uniform_with_degenerate_units_in_either_order(kind, fraction, both) -> None:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(TOKENS, WIDTH))
    forward, backward = [], []
    for _ in range(PAIRS):
        ga, ua = _glu(rng, x, kind, fraction)
        gb, ub = _glu(rng, x, kind if both else None, fraction)
        forward.append(10 ** phi_match(ga, ua, gb, ub).log10_p)
        backward.append(10 ** phi_match(gb, ub, ga, ua).log10_p)
    assert _too_small(forward) >= ALPHA
    assert _too_small(backward) >= ALPHA


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fraction"), [(k, f) for k in ("zero", "duplicate") for f in (0.25, 0.5)])
def test_phi_u_and_phi_h_p_values_stay_uniform_with_degenerate_units(kind, fraction) -> None:
    rng = np.random.default_rng(12)
    x = rng.normal(size=(TOKENS, WIDTH))
    u_forward, u_backward, h_forward, h_backward = [], [], [], []
    for _ in range(PAIRS):
        up_a = _degenerate(rng.normal(size=(UNITS, WIDTH)), kind, fraction, rng)
        up_b = rng.normal(size=(UNITS, WIDTH))
        u_forward.append(10 ** phi_u(up_a, up_b).log10_p)
        u_backward.append(10 ** phi_u(up_b, up_a).log10_p)
        hidden_a = _degenerate(np.maximum(x @ rng.normal(size=(UNITS, WIDTH)).T, 0).T, kind, fraction, rng)
        hidden_b = np.maximum(x @ rng.normal(size=(UNITS, WIDTH)).T, 0).T
        h_forward.append(10 ** phi_h(hidden_a, hidden_b).log10_p)
        h_backward.append(10 ** phi_h(hidden_b, hidden_a).log10_p)
    for ps in (u_forward, u_backward, h_forward, h_backward):
        assert _too_small(ps) >= ALPHA


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Fingerprint:
    return template_fingerprint(tmp_path_factory.mktemp("template") / "llama", tokens=64)


def _fingerprint(template: Fingerprint, name: str, gate: np.ndarray, up: np.ndarray) -> Fingerprint:
    meta = dataclasses.replace(template.meta, model=name, n_layers=1, intermediate_size=gate.shape[0], n_experts=0)
    return Fingerprint(meta, [[MLPActivations(gate=gate.astype(np.float32), up=up.astype(np.float32))]])


@pytest.mark.slow
def test_localize_p_values_stay_uniform_with_half_the_units_zeroed(template: Fingerprint) -> None:
    rng = np.random.default_rng(13)
    x = rng.normal(size=(64, WIDTH))
    ps = []
    for k in range(PAIRS):
        a = _fingerprint(template, f"a{k}", *_glu(rng, x, "zero", 0.5))
        b = _fingerprint(template, f"b{k}", *_glu(rng, x, None, 0.0))
        ps.append(10 ** localize(a, b, screen_units=None).pairs[0].log10_p)
    assert _too_small(ps) >= ALPHA


def test_an_all_zero_mlp_cannot_be_tested_and_says_why() -> None:
    """Issue 24's upload with zero MLPs: rho was 1 against every model. Now: the block cannot be tested, and why
    (never p = 1, which would read as evidence of independence)."""
    rng = np.random.default_rng(14)
    x = rng.normal(size=(TOKENS, WIDTH))
    zero = np.zeros((UNITS, TOKENS))
    gate, up = _glu(rng, x, None, 0.0)
    for result in (phi_match(zero, zero, gate, up), phi_match(gate, up, zero, zero), phi_u(zero, gate)):
        assert "48 all-zero" in result.set_aside and "cannot be tested" in result.set_aside
        assert "too few informative units" in result.cannot_test and "has 0" in result.cannot_test


def test_duplicated_and_constant_units_are_set_aside_and_the_rest_still_detects_a_copy() -> None:
    """A copy of a block with a quarter of its units duplicated and one made constant still tests dependent, on
    the informative units only; the screen counts what it set aside."""
    rng = np.random.default_rng(15)
    x = rng.normal(size=(TOKENS, WIDTH))
    gate, up = _glu(rng, x, "duplicate", 0.25)
    gate[0], up[0] = 3.0, -2.0  # a constant unit: one direction with any other constant unit
    gate[1], up[1] = 1.0, 1.0
    screen = screen_units(gate, up)
    assert screen.constant == 2 and screen.duplicated >= 12 and screen.zero == 0
    lone_gate, lone_up = _glu(rng, x, None, 0.0)
    lone_gate[5], lone_up[5] = 2.0, 0.5  # one constant unit, repeated by no other: in every model its direction
    lone = screen_units(lone_gate, lone_up)
    assert (lone.constant, lone.duplicated, lone.kept) == (1, 0, UNITS - 1) and not lone.informative[5]
    assert screen.kept >= MIN_INFORMATIVE_UNITS
    noisy = (gate + 0.01 * rng.normal(size=gate.shape), up + 0.01 * rng.normal(size=up.shape))
    result = phi_match(gate, up, *noisy)
    assert result.log10_p < -10 and result.n_units <= screen.kept
    assert "duplicated" in result.set_aside


def test_the_note_reaches_the_pair_result(template: Fingerprint) -> None:
    from scanner.pairs.fingerprint_compare import compare_fingerprints

    rng = np.random.default_rng(16)
    x = rng.normal(size=(64, WIDTH))
    a = _fingerprint(template, "zeroed", *_glu(rng, x, "zero", 0.5))
    b = _fingerprint(template, "other", *_glu(rng, x, None, 0.0))
    result = compare_fingerprints(a, b)
    assert any("set aside" in note and "24 all-zero" in note for note in result.notes)


RETRIEVAL_MODELS, RETRIEVAL_BLOCKS = 10, 6


def _constant_rows(rows: int, tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(gate, up) rows constant over the tokens, of different sizes (one direction: one signature)."""
    rows_of_ones = np.linspace(1.0, 3.0, rows, dtype=np.float32)[:, None] * np.ones((1, tokens), dtype=np.float32)
    return rows_of_ones, rows_of_ones.copy()


def _retrieval_models(template: Fingerprint, constant_units: int) -> dict[str, Fingerprint]:
    """Independent models (random activations: a width-16 GLU's units would all lie in one 16-dimensional space and
    collide by chance), each block with ``constant_units`` constant units, and a noisy copy of the first model (the
    one related pair)."""
    rng = np.random.default_rng(17)
    models = {}
    for m in range(RETRIEVAL_MODELS):
        blocks = []
        for _ in range(RETRIEVAL_BLOCKS):
            gate, up = rng.normal(size=(UNITS, TOKENS)), rng.normal(size=(UNITS, TOKENS))
            if constant_units:
                gate[:constant_units], up[:constant_units] = _constant_rows(constant_units, TOKENS)
            blocks.append([MLPActivations(gate=gate.astype(np.float32), up=up.astype(np.float32))])
        meta = dataclasses.replace(template.meta, model=f"indie-{m}", n_layers=RETRIEVAL_BLOCKS,
                                   intermediate_size=UNITS, n_experts=0)
        models[meta.model] = Fingerprint(meta, blocks)
    first = models["indie-0"]
    noisy = [[MLPActivations(gate=e.gate + 0.05 * rng.normal(size=e.gate.shape).astype(np.float32),
                             up=e.up + 0.05 * rng.normal(size=e.up.shape).astype(np.float32)) for e in block]
             for block in first.blocks]
    models["copy-of-0"] = Fingerprint(dataclasses.replace(first.meta, model="copy-of-0"), noisy)
    return models


def _candidates(models: dict[str, Fingerprint], params: SignatureParams, folder: Path) -> set[frozenset[str]]:
    entries = {(name, "r"): retrieval_entry(fp, params) for name, fp in models.items()}
    index = RetrievalIndex(folder, next(iter(models.values())).meta.input_set, params)
    index.sync({key: (lambda e=entry: e) for key, entry in entries.items()})
    return {frozenset((p.model_a, p.model_b)) for p in scored_pairs(index, entries, min_score=MIN_SCORE)}


@pytest.mark.parametrize("constant_units", [1, 12])
def test_constant_units_do_not_make_unrelated_models_retrieval_candidates(
        template: Fingerprint, tmp_path: Path, constant_units: int) -> None:
    """A constant unit has the same signature in every model. Screened (the default), the unrelated models of a
    hub whose blocks hold one or a quarter of such units are not candidates and the noisy copy is; unscreened (the
    control, showing the check can fail), unrelated pairs collide in every block. Every chosen unit is indexed
    here, so a constant unit takes an indexed place whatever its rank along the choosing direction (the worst
    case; with 16 of 48 indexed, a lone one does or not by the luck of the fixed projection)."""
    models = _retrieval_models(template, constant_units)
    related = frozenset(("indie-0", "copy-of-0"))
    every_unit_indexed = dataclasses.replace(DEFAULT_PARAMS, units_per_block=DEFAULT_PARAMS.query_units_per_block)
    screened = _candidates(models, every_unit_indexed, tmp_path / "screened")
    assert screened == {related}
    unscreened = _candidates(models, dataclasses.replace(every_unit_indexed, screen=False), tmp_path / "unscreened")
    assert len(unscreened - {related}) >= 10
    zero = dataclasses.replace(models["indie-1"], blocks=[[MLPActivations(gate=np.zeros((UNITS, TOKENS), np.float32),
                                                                         up=np.zeros((UNITS, TOKENS), np.float32))]
                                                          for _ in range(RETRIEVAL_BLOCKS)])
    assert retrieval_entry(zero).vectors.shape[0] == 0  # an all-zero model has nothing to retrieve by
    older = {k: v for k, v in DEFAULT_PARAMS.to_json_dict().items() if k != "screen"}  # an entry from before
    assert SignatureParams.from_json_dict(older) != DEFAULT_PARAMS  # the screen: made again, not reused


# -- what a copier can do to units: scale, sign, copies ----------------------------------------------------------


def _views(rng: np.random.Generator, units: int = UNITS) -> tuple[np.ndarray, np.ndarray]:
    """A random GLU's two views on a residual stream of 64 dimensions (unrelated units far below the group bar)."""
    x = rng.normal(size=(TOKENS, 64))
    return (x @ rng.normal(size=(units, 64)).T).T, (x @ rng.normal(size=(units, 64)).T).T


def _split(gate: np.ndarray, up: np.ndarray, copies: int, jitter: float, rng: np.random.Generator
           ) -> tuple[np.ndarray, np.ndarray]:
    """Each unit made ``copies`` units with antithetic jitter (the copies' jitters sum to zero), shuffled, every copy
    rescaled by its own factor in 1e-20..1e20 and its up view's sign flipped at random (all output-preserving for a
    gated unit whose output column is shared and rescaled back)."""
    def copied(rows: np.ndarray) -> np.ndarray:
        noise = rng.normal(size=(rows.shape[0], copies, rows.shape[1]))
        noise -= noise.mean(axis=1, keepdims=True)
        scale = np.linalg.norm(rows, axis=1)[:, None, None] / np.sqrt(rows.shape[1])
        return (rows[:, None, :] + jitter * scale * noise).reshape(-1, rows.shape[1])

    order = rng.permutation(gate.shape[0] * copies)
    scales = 10.0 ** rng.uniform(-20, 20, size=(order.size, 1))
    signs = rng.choice([-1.0, 1.0], size=(order.size, 1))
    return copied(gate)[order], (copied(up)[order] * scales * signs)


def test_the_screen_does_not_see_a_unit_s_scale_or_its_up_view_s_sign() -> None:
    """Rows rescaled by factors from 1e-30 to 1e30 (and up rows negated at random, where the sign is free) give the
    same screen: zeros, constants and groups are read from directions, never from sizes."""
    rng = np.random.default_rng(21)
    gate, up = _views(rng)
    gate[3], up[3] = 0.0, 0.0
    gate[4], up[4] = 2.0, -1.0
    gate[7], up[7] = gate[9], up[9]
    plain = screen_units(gate, up, sign_free=(False, True))
    scales = 10.0 ** rng.uniform(-30, 30, size=(UNITS, 1))
    disguised = screen_units(gate * scales, up / scales * rng.choice([-1.0, 1.0], size=(UNITS, 1)),
                             sign_free=(False, True))
    assert (plain.zero, plain.constant, plain.duplicated) == (1, 1, 1)
    assert (disguised.zero, disguised.constant, disguised.duplicated) == (1, 1, 1)
    assert _partition(plain) == _partition(disguised)  # which of two exact copies leads the pair is immaterial


def _partition(screen) -> set[frozenset[int]]:
    """The screen's groups as sets of units (set-aside units left out)."""
    return {frozenset(np.flatnonzero(screen.group == leader).tolist()) for leader in np.unique(screen.group)
            if leader >= 0}


def test_a_group_of_copies_counts_once() -> None:
    rng = np.random.default_rng(22)
    gate, up = _views(rng)
    for copy_of, copies in ((5, (30, 40)), (6, (2,))):
        for row in copies:
            gate[row], up[row] = 3.0 * gate[copy_of], -0.5 * up[copy_of]
    screen = screen_units(gate, up, sign_free=(False, True))
    assert screen.duplicated == 3 and screen.kept == UNITS - 3
    assert {frozenset({5, 30, 40}), frozenset({2, 6})} <= _partition(screen)
    assert screen.informative[[5, 30, 40]].sum() == 1 and screen.informative[[2, 6]].sum() == 1
    signed = screen_units(gate, up)  # the up view's sign taken at its word: negated copies are other units
    assert signed.duplicated == 1 and frozenset({30, 40}) in _partition(signed) and signed.informative[5]


def test_a_chain_of_units_joins_no_units_far_apart() -> None:
    """Units whose views step from one unit to another (each step within the group's cosine of the next) do not
    chain the block into one group: every member of a group is close to its leader itself, so the block keeps its
    units and a copy of it still tests at the permutation floor."""
    rng = np.random.default_rng(25)
    gate, up = _views(rng, units=32)
    steps = np.linspace(0.0, 1.0, 12)[1:-1, None]
    chained = [(g, u) for i in range(32) for g, u in [(gate[i], up[i])] + [
        ((1 - t) * gate[i] + t * gate[(i + 1) % 32], (1 - t) * up[i] + t * up[(i + 1) % 32]) for t in steps]]
    chain_gate, chain_up = (np.stack(rows) for rows in zip(*chained, strict=True))
    screen = screen_units(chain_gate, chain_up, sign_free=(False, True))
    assert screen.kept >= 32 and max(len(group) for group in _partition(screen)) <= 12
    assert phi_match(gate, up, chain_gate, chain_up, up_sign_free=True).log10_p <= -20


@pytest.mark.parametrize(("copies", "jitter"), [(2, 0.0), (3, 0.0), (4, 0.25), (8, 0.3)])
def test_a_block_split_into_jittered_rescaled_copies_tests_at_the_permutation_floor(copies: int, jitter: float) -> None:
    """The copies of a unit form one group whose mean is the unit (antithetic jitter cancels), so the split copy is
    matched unit for unit; taken one by one, the copies made the gate and up matchings pick different copies."""
    rng = np.random.default_rng(23)
    gate, up = _views(rng, units=64)
    split = _split(gate, up, copies, jitter, rng)
    result = phi_match(gate, up, *split, up_sign_free=True)
    assert result.log10_p <= log10_inverse_factorial(64) + 1.0 and result.closeness >= 0.99
    assert phi_match(*split, gate, up, up_sign_free=True).log10_p <= log10_inverse_factorial(64) + 1.0
    assert "duplicated" in result.set_aside


def test_copies_whose_jitter_is_too_large_are_other_units() -> None:
    """Known limit (docs/statistics.md): copies whose directions differ by more than the group's cosine bar are
    separate units; the screen groups none of them."""
    rng = np.random.default_rng(24)
    gate, up = _views(rng, units=64)
    split = _split(gate, up, 4, 1.5, rng)
    assert screen_units(*split, sign_free=(False, True)).duplicated == 0
