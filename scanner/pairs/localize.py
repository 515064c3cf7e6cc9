"""Localized testing (paper 4.3.1, App. H.2): which blocks of B derive from which blocks of A, and which units.

phi_MATCH is run on every (block of A, block of B) pair of two fingerprints, the block map is read off
the matrix of p-values (``scanner.stats.block_map``), and for every mapped pair the hidden units of B
are aligned with those of A. Activations are normalised once per block, so each of the L_A * L_B pairs
costs two matrix products and two matchings (by default greedy, and exact where that finds the pair related:
scanner.stats.matching); on a GPU the products and the candidate selection run there.

Wide blocks are screened first: phi_MATCH of a fixed, evenly spaced subset of ``screen_units`` of A's units
against all of B's (a rectangular MATCH, about screen_units / units of the full cost). A pair whose screen
p-value is above ``screen_stop_log10_p`` keeps it (such a pair can never be mapped: its corrected p-value sits
far above any threshold); the others are tested in full and report the full p-value. Each reported p-value
is valid: for a level a below the stop, P(reported <= a) <= P(full <= a) = a; above it, at most
P(screen <= stop) + P(stop < screen <= a) = a. So the Bonferroni-corrected map keeps its guarantee, and
a 32 x 32 localize of 7B models costs about one whole-model test plus 1024 small screens.

`localize_replayed` tests the same block pairs on replayed activations (scanner.pairs.replay): every block of B run
on the residual stream that entered each block of A, so a depth prune's deeper blocks, whose own streams
have drifted, are still mapped. MoE blocks pair their experts first (scanner.stats.experts) either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from scanner.errors import IncomparableError
from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.replay import replay
from scanner.reading.activations import MLPActivations
from scanner.stats.block_map import block_map, bonferroni_log10
from scanner.stats.degenerate import MIN_INFORMATIVE_UNITS, host_rows
from scanner.stats.experts import ExpertPairing, pair_block_experts
from scanner.stats.independence import phi_match_similarity
from scanner.stats.matching import MatchingRule, match_similarity, unit_rows
from scanner.stats.views import decoupled_up

if TYPE_CHECKING:
    from scanner.fingerprints.fingerprint import Fingerprint


@dataclass(frozen=True)
class BlockPair:
    """phi_MATCH between block layer_a of A and block layer_b of B (FISHER over experts for MoE blocks), and the
    mean cosine of the matched units' activations (closeness: 1 for a copied block; None where nothing was
    matched; for a pair that ended after its screen, the screen's units')."""

    layer_a: int
    layer_b: int
    log10_p: float
    closeness: float | None = None


@dataclass(frozen=True)
class LocalizeResult:
    """All L_A x L_B block tests, the chosen block map, and per mapped pair the unit map of B onto A.

    ``unit_maps[(layer_a, layer_b)][k]`` is the unit of A's block that B's unit k corresponds to
    (-1 when B's block is wider and unit k was left over); for MoE blocks, the first expert's.
    """

    pairs: list[BlockPair]
    map: list[tuple[int, int]]
    unit_maps: dict[tuple[int, int], np.ndarray]
    model_a: str = ""
    model_b: str = ""
    threshold_log10: float = -2.0
    monotone: bool = True
    notes: list[str] = field(default_factory=list)

    def matrix(self) -> np.ndarray:
        """The (L_A, L_B) matrix of uncorrected log10 p-values."""
        if not self.pairs:
            return np.zeros((0, 0))
        rows = 1 + max(p.layer_a for p in self.pairs)
        cols = 1 + max(p.layer_b for p in self.pairs)
        out = np.zeros((rows, cols))
        for p in self.pairs:
            out[p.layer_a, p.layer_b] = p.log10_p
        return out

    def to_json_dict(self) -> dict:
        return {
            "model_a": self.model_a,
            "model_b": self.model_b,
            "threshold_log10": self.threshold_log10,
            "correction": f"bonferroni x{len(self.pairs)}",
            "order": "monotone" if self.monotone else "any",
            "pairs": [{"layer_a": p.layer_a, "layer_b": p.layer_b, "log10_p": p.log10_p, "closeness": p.closeness}
                      for p in self.pairs],
            "map": [{"layer_a": a, "layer_b": b} for a, b in self.map],
            "notes": list(self.notes),
        }


SCREEN_UNITS = 1024
"""Units of A a block pair's screen matches (blocks no wider than this are tested in full directly)."""
SCREEN_STOP_LOG10_P = -2.0
"""A screen p-value above this ends the pair's test (the pair cannot be mapped at any useful threshold)."""


def localize(
    a: Fingerprint,
    b: Fingerprint,
    *,
    threshold_log10: float = -2.0,
    monotone: bool = True,
    device: str = "cpu",
    screen_units: int | None = SCREEN_UNITS,
    screen_stop_log10_p: float = SCREEN_STOP_LOG10_P,
    rule: MatchingRule = "screened",
) -> LocalizeResult:
    """phi_MATCH on all block pairs of two fingerprints, the block map, and the unit map of each mapped pair.

    A pair is mapped when its log10 p, Bonferroni-corrected for the L_A * L_B tests, is at most
    ``threshold_log10`` and (with ``monotone``) it belongs to the strongest order-preserving map. Blocks wider
    than ``screen_units`` are screened on that many of A's units first (None: every pair in full). ``rule``: how
    MATCH pairs units, in the tests and the unit maps (scanner.stats.matching). Raises IncomparableError when the
    fingerprints were taken on different input sets.
    """
    reason = a.comparable_with(b)
    if reason is not None:
        raise IncomparableError(reason)
    sign_free = a.meta.up_sign_free
    units_a, units_b = _unit_blocks(a.blocks, device, sign_free), _unit_blocks(b.blocks, device, sign_free)
    routed = ([a.meta.routed_experts(i) for i in range(len(a.blocks))],
              [b.meta.routed_experts(j) for j in range(len(b.blocks))])
    tester = _PairTester(len(units_a) * len(units_b), routed, sign_free, threshold_log10, screen_units,
                         screen_stop_log10_p, rule)
    for j, block_b in enumerate(units_b):
        for i, block_a in enumerate(units_a):
            tester.test(i, j, block_a, block_b)
    return tester.result(a.meta.model, b.meta.model, monotone, [])


def localize_replayed(
    path_a: str | Path,
    path_b: str | Path,
    *,
    inputs: InputSpec = InputSpec(),
    threshold_log10: float = -2.0,
    monotone: bool = True,
    device: str = "cpu",
    screen_units: int | None = SCREEN_UNITS,
    screen_stop_log10_p: float = SCREEN_STOP_LOG10_P,
    rule: MatchingRule = "screened",
) -> LocalizeResult:
    """`localize` of two checkpoints with every block of B run on the residual stream entering each block of A
    (scanner.pairs.replay): deep blocks of a depth-pruned model see their parent block's inputs, not a drifted stream.

    Costs L_A * L_B block forward passes of B on the canonical tokens (each block of B read once) besides the
    tests; the p-values are phi_MATCH's, valid for the reason scanner.pairs.replay gives, so the map keeps its
    Bonferroni guarantee.
    """
    replayed = replay(path_a, path_b, inputs=inputs, device=device)
    sign_free = replayed.up_sign_free
    units_a = _unit_blocks(replayed.a, device, sign_free)
    tester = _PairTester(len(units_a) * len(replayed.b[0]), (replayed.routed_a, replayed.routed_b), sign_free,
                         threshold_log10, screen_units, screen_stop_log10_p, rule)
    for j in range(len(replayed.b[0])):
        for i, block_a in enumerate(units_a):
            tester.test(i, j, block_a, _unit_blocks([replayed.b[i][j]], device, sign_free)[0])
            replayed.b[i][j] = []  # tested: free it
    note = (f"every block of B was run on the residual stream entering each block of A, mapped into B's basis "
            f"(scanner.pairs.replay; input set {replayed.input_set.id})")
    return tester.result(str(path_a), str(path_b), monotone, [note])


class _PairTester:
    """The block-pair tests of one localize: p-values, screens, expert pairings, and unit maps of the pairs that
    could be mapped (Bonferroni-corrected p at most the threshold), so blocks need not be kept until the end."""

    def __init__(self, n_pairs: int, routed: tuple[list[int], list[int]], up_sign_free: bool, threshold_log10: float,
                 screen_units: int | None, screen_stop_log10_p: float, rule: MatchingRule) -> None:
        self.log10_p: dict[tuple[int, int], float] = {}
        self.closeness: dict[tuple[int, int], float | None] = {}
        self.unit_maps: dict[tuple[int, int], np.ndarray] = {}
        self.n_pairs, self.routed, self.threshold = n_pairs, routed, threshold_log10
        self.up_sign_free, self.rule = up_sign_free, rule
        self.screen_units, self.screen_stop = screen_units, screen_stop_log10_p
        self.screened, self.moe = 0, False
        self.untestable: list[tuple[int, int]] = []

    def test(self, i: int, j: int, block_a: list[Units], block_b: list[Units]) -> None:
        self.moe |= len(block_a) > 1 or len(block_b) > 1
        pairing = pair_block_experts(_on_cpu(block_a), _on_cpu(block_b), self.routed[0][i], self.routed[1][j])
        paired = [(block_a[x], block_b[y]) for x, y in pairing.pairs]
        if not any(min(a.kept.size, b.kept.size) >= MIN_INFORMATIVE_UNITS for a, b in paired):
            self.untestable.append((i, j))
        rows = _screen_rows(block_a, block_b, self.screen_units)
        if rows is not None:
            self.log10_p[(i, j)], self.closeness[(i, j)] = _block_test(paired, pairing, self.up_sign_free, self.rule,
                                                                       rows)
            if self.log10_p[(i, j)] > self.screen_stop:
                self.screened += 1
                return
        self.log10_p[(i, j)], self.closeness[(i, j)] = _block_test(paired, pairing, self.up_sign_free, self.rule)
        if self.log10_p[(i, j)] + math.log10(max(1, self.n_pairs)) <= self.threshold:
            (x, y) = pairing.pairs[0]
            self.unit_maps[(i, j)] = _unit_map(block_a[x], block_b[y], self.up_sign_free, self.rule)

    def result(self, model_a: str, model_b: str, monotone: bool, notes: list[str]) -> LocalizeResult:
        rows = 1 + max((i for i, _ in self.log10_p), default=-1)
        cols = 1 + max((j for _, j in self.log10_p), default=-1)
        p = np.zeros((rows, cols))
        for (i, j), value in self.log10_p.items():
            p[i, j] = value
        if self.moe:
            notes.append("MoE blocks: experts are matched before testing (scanner.stats.experts), block p-values "
                         "combine them by FISHER (Bonferroni against a dense MLP); unit maps are those of B's first "
                         "paired expert")
        if self.screened:
            notes.append(f"{self.screened} of {p.size} block pairs ended after a screen on {self.screen_units} units "
                         f"of A (their p-value is the screen's, above {self.screen_stop:g}; still valid)")
        if self.untestable:
            notes.append(f"{len(self.untestable)} of {p.size} block pairs could not be tested (too few informative "
                         f"units on a side, e.g. blocks {self.untestable[0][0]} and {self.untestable[0][1]}): their "
                         "cells read p = 1 as 'no map', not as evidence of independence")
        chosen = block_map(p, self.threshold, monotone=monotone) if p.size else []
        return LocalizeResult(
            pairs=[BlockPair(i, j, float(p[i, j]), self.closeness.get((i, j))) for i in range(p.shape[0])
                   for j in range(p.shape[1])],
            map=chosen,
            unit_maps={pair: self.unit_maps[pair] for pair in chosen},
            model_a=model_a,
            model_b=model_b,
            threshold_log10=self.threshold,
            monotone=monotone,
            notes=notes,
        )


def corrected_log10_p(result: LocalizeResult) -> np.ndarray:
    """The (L_A, L_B) matrix of Bonferroni-corrected log10 p-values that the block map thresholds."""
    return bonferroni_log10(result.matrix())


def _screen_rows(block_a: list[Units], block_b: list[Units], units: int | None) -> Any:
    """Evenly spaced unit indices of A for a screen, or None when either block is too narrow to need one."""
    width_a, width_b = block_a[0].gate.shape[0], block_b[0].gate.shape[0]
    if units is None or min(width_a, width_b) <= units:
        return None
    return np.unique(np.linspace(0, width_a - 1, units).round().astype(np.int64))


def _block_test(paired: list[tuple[Units, Units]], pairing: ExpertPairing, up_sign_free: bool, rule: MatchingRule,
                rows: Any = None) -> tuple[float, float | None]:
    """phi_MATCH of one block pair's paired experts, combined as the pairing says, on A's units ``rows`` if given
    (indices among A's informative units): log10 p and the mean closeness of the paired experts (an expert pair with
    too few informative units counts as p = 1 and adds no closeness)."""
    pick = (lambda x: x) if rows is None else (lambda x: x[rows])
    tests = [phi_match_similarity(pick(a.gate) @ b.gate.T, _up_similarity(pick(a.up), b.up, up_sign_free),
                                  (pick(a.stored_up), b.stored_up), up_sign_free, rule)
             if min(a.kept.size, b.kept.size) >= MIN_INFORMATIVE_UNITS else None for a, b in paired]
    near = [t.closeness for t in tests if t is not None and t.closeness is not None]
    return (pairing.combine([0.0 if t is None else t.log10_p for t in tests]),
            float(np.mean(near)) if near else None)


def _up_similarity(up_a: Any, up_b: Any, sign_free: bool) -> Any:
    """Cosines of unit-length up rows, up to sign where the view's sign is free (scanner.stats.matching)."""
    similarity = up_a @ up_b.T
    return abs(similarity) if sign_free else similarity


@dataclass(frozen=True)
class Units:
    """One MLP's informative units (scanner.stats.degenerate: all-zero and constant ones set aside, each group of
    duplicated units one unit, so no tie is broken by index order): gate and up activations with unit-length rows, on
    the device, and each row's unit. ``up`` is the view phi_MATCH matches (scanner.stats.views.decoupled_up),
    ``stored_up`` the up rows as stored, which the closeness reads."""

    gate: Any
    up: Any
    stored_up: Any
    kept: np.ndarray  # the unit (row of the fingerprint) of each row
    width: int  # units in the MLP, set-aside ones included


def _unit_blocks(blocks: list[list[MLPActivations]], device: str, up_sign_free: bool) -> list[list[Units]]:
    """Per block, per expert: its informative units, on ``device``."""
    out = []
    for experts in blocks:
        units = []
        for e in experts:
            screen = e.screen(up_sign_free)
            kept = np.flatnonzero(screen.informative)
            gate = screen.gate if screen.gate is not None else host_rows(e.gate)[kept]
            stored_up = screen.up if screen.up is not None else host_rows(e.up)[kept]
            rows = [unit_rows(x) for x in (gate, decoupled_up(gate, stored_up), stored_up)]
            if device != "cpu":
                import torch

                rows = [torch.from_numpy(x).to(device) for x in rows]
            units.append(Units(*rows, kept, e.gate.shape[0]))
        out.append(units)
    return out


def _on_cpu(block: list[Units]) -> list[tuple[np.ndarray, np.ndarray]]:
    """A block's expert activations as numpy arrays (expert pairing runs on the CPU; single MLPs skip it)."""
    if len(block) == 1 or isinstance(block[0].gate, np.ndarray):
        return [(u.gate, u.up) for u in block]
    return [(u.gate.float().cpu().numpy(), u.up.float().cpu().numpy()) for u in block]


def _unit_map(a: Units, b: Units, up_sign_free: bool, rule: MatchingRule) -> np.ndarray:
    """B unit -> A unit by MATCH on gate and up together (sum of both cosines), over the informative units; -1 for
    B's leftover and set-aside units."""
    matching = match_similarity(a.gate @ b.gate.T + _up_similarity(a.up, b.up, up_sign_free), rule)
    unit_map = np.full(b.width, -1, dtype=np.int64)
    unit_map[b.kept[matching.b_index]] = a.kept[matching.a_index]
    return unit_map


def plot_unit_map(
    unit_map: np.ndarray,
    path: str | Path,
    *,
    layer_a: int,
    layer_b: int,
    model_a: str = "A",
    model_b: str = "B",
) -> Path:
    """Scatter of matched units like the paper's Figure 11 (x: unit of A, y: matched unit of B), as a PNG.

    A copy with permuted units shows a permutation's scatter; a pruned or re-ordered copy shows which
    units of A survived where. Rendered with matplotlib's Agg canvas (no display needed).
    """
    from matplotlib.figure import Figure

    from scanner.text_safety import PLOT_TEXT, plot_label

    unit_map = np.asarray(unit_map)
    units_b = np.flatnonzero(unit_map >= 0)
    figure = Figure(figsize=(4.5, 4.5), dpi=120)
    axes = figure.add_subplot()
    axes.scatter(unit_map[units_b], units_b, s=max(0.2, min(6.0, 4000.0 / max(1, units_b.size))), linewidths=0)
    axes.set_xlabel(plot_label(f"unit of {model_a}, block {layer_a}"), **PLOT_TEXT)  # ids are data, not mathtext
    axes.set_ylabel(plot_label(f"matched unit of {model_b}, block {layer_b}"), **PLOT_TEXT)
    axes.set_title(f"unit map: block {layer_a} -> block {layer_b}", fontsize=10)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path
