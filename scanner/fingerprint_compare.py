"""phi_MATCH and phi_H between two fingerprints: the activation statistics with no checkpoint open.

`scanner.compare.compare_models` computes its activation statistics through here too, so a test from two
fingerprint files gives exactly the numbers of a live test on the same input set.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar, get_args

from scanner.activations import MLPActivations
from scanner.errors import IncomparableError
from scanner.fingerprint import Fingerprint
from scanner.results import LayerResult, PairTestResult
from scanner.shared_vocab import is_shared_string_input_set, shared_inputs_note
from scanner.stats.experts import ExpertPairing, pair_block_experts
from scanner.stats.independence import BlockTest, fisher, phi_h, phi_match, phi_match_many
from scanner.stats.logp import log10_fisher
from scanner.stats.matching import AssignmentSolver
from scanner.stats.sequential import SequentialDesign

FingerprintStatistic = Literal["match", "hidden"]
"""The statistics a fingerprint carries activations for (and so the ones a scan can test)."""
FINGERPRINT_STATISTICS: tuple[str, ...] = get_args(FingerprintStatistic)

T = TypeVar("T")
R = TypeVar("R")


def compare_fingerprints(
    a: Fingerprint,
    b: Fingerprint,
    statistic: str = "match",
    *,
    device: str | None = None,
    design: SequentialDesign | None = None,
    workers: int = 1,
    block_map: tuple[tuple[int, int], ...] | None = None,
    solver: AssignmentSolver = "auto",
) -> PairTestResult:
    """Test independence from two fingerprints, blocks paired by index; FISHER over blocks (and experts).

    ``device`` None or "cpu" computes the cosine matrices with numpy; a CUDA device computes them there and
    solves the assignments of all compared blocks there as one batch (``solver``: see scanner.stats.matching; the
    matchings are the same whoever solves them, each certified optimal). ``design`` compares its screening blocks
    first and stops when they settle the test (scanner.stats.sequential); None compares every block. On the host,
    ``workers`` > 1 compares that many blocks at once on threads, so one block's cosine products (BLAS, outside the
    GIL) overlap another's assignment; the result is the same (bench/bench_7b_pair.py --workers measures the gain).
    ``block_map`` (candidate retrieval's (block of a, block of b) pairs) matters when the depths differ: the pair
    is then tested both by index and on the mapped blocks, and reports twice the smaller p-value (Bonferroni over
    the two pairings; scanner.retrieval.candidates says why the mapped one is valid). Raises IncomparableError
    when the fingerprints were taken on different input sets.
    """
    device = None if device in (None, "cpu") else device
    if statistic not in FINGERPRINT_STATISTICS:
        raise ValueError(
            f"statistic {statistic!r} cannot be computed from fingerprints; "
            f"choose one of {', '.join(FINGERPRINT_STATISTICS)}"
        )
    reason = a.comparable_with(b)
    if reason is not None:
        raise IncomparableError(reason)
    if is_shared_string_input_set(a.meta.input_set):
        notes = [shared_inputs_note(a.meta.input_set, a.meta.token_range)]
    else:
        notes = input_notes(
            (a.meta.tokenizer_hash, b.meta.tokenizer_hash), (a.meta.vocab_size, b.meta.vocab_size), a.meta.token_range
        )
    depth = min(len(a.blocks), len(b.blocks))
    mapped = len(a.blocks) != len(b.blocks) and bool(block_map)
    if len(a.blocks) != len(b.blocks) and not mapped:
        notes.append(depth_note(len(a.blocks), len(b.blocks)))
    if statistic == "hidden":
        notes.append("phi_H is fooled by permuting hidden units; use --stat match against adversaries")

    expert_maps: dict[int, str] = {}
    set_aside: dict[int, str] = {}

    def screened(layer_a: int, tests: list[BlockTest]) -> list[BlockTest]:
        """Keep what scanner.stats.degenerate set aside in this block's tests, for the pair's notes."""
        notes_here = sorted({t.set_aside for t in tests if t.set_aside})
        if notes_here:
            set_aside[layer_a] = "; ".join(notes_here)
        return tests

    def paired(layers_ab: tuple[int, int]) -> tuple[ExpertPairing, list[tuple[MLPActivations, MLPActivations]]]:
        layer_a, layer_b = layers_ab
        experts_a, experts_b = a.blocks[layer_a], b.blocks[layer_b]
        pairing = pair_fingerprint_experts(a, b, layer_a, layer_b)
        if not pairing.by_index or len(experts_a) != len(experts_b):
            expert_maps[layer_a] = pairing.describe()
        return pairing, [(experts_a[i], experts_b[j]) for i, j in pairing.pairs]

    def block(layers_ab: tuple[int, int]) -> LayerResult:
        pairing, pairs = paired(layers_ab)
        if statistic == "hidden":
            tests = [phi_h(x.hidden(a.meta.hidden_act, a.meta.mlp_kind), y.hidden(b.meta.hidden_act, b.meta.mlp_kind),
                           device=device) for x, y in pairs]
        else:
            tests = [phi_match(x.gate, x.up, y.gate, y.up, device=device) for x, y in pairs]
        return block_result(*layers_ab, screened(layers_ab[0], tests), pairing)

    def batched(block_pairs: list[tuple[int, int]]) -> list[LayerResult]:
        """Every block's (and expert's) phi_MATCH with the assignments solved together (see phi_match_many)."""
        plans = [(layers_ab, *paired(layers_ab)) for layers_ab in block_pairs]
        inputs = [(x.gate, x.up, y.gate, y.up) for _, _, pairs in plans for x, y in pairs]
        tests = iter(phi_match_many(inputs, device=device, solver=solver))
        return [block_result(*layers_ab, screened(layers_ab[0], [next(tests) for _ in pairs]), pairing)
                for layers_ab, pairing, pairs in plans]

    def compared(block_pairs: list[tuple[int, int]]) -> list[LayerResult]:
        if statistic == "match" and (device is not None or solver == "auction"):
            return batched(block_pairs)
        return parallel_map(block, block_pairs, workers)

    def test(block_pairs: list[tuple[int, int]]) -> tuple[list[LayerResult], float]:
        screen = [block_pairs[i] for i in design.screen(len(block_pairs))] if design is not None else block_pairs
        layers = compared(screen)
        log10_p = log10_fisher([layer.log10_p for layer in layers])
        if design is not None and len(screen) < len(block_pairs):
            if design.stops(log10_p):
                notes.append(screen_note([la for la, _ in screen], len(block_pairs), log10_p))
            else:
                layers = sorted([*layers, *compared([p for p in block_pairs if p not in screen])],
                                key=lambda result: result.layer_a)
                log10_p = design.continued_log10_p(log10_fisher([layer.log10_p for layer in layers]))
        return layers, log10_p

    layers, log10_p = test([(layer, layer) for layer in range(depth)])
    if mapped:
        mapped_layers, mapped_log10_p = test(sorted({(int(x), int(y)) for x, y in block_map}))
        by_map = mapped_log10_p < log10_p
        log10_p = min(0.0, min(log10_p, mapped_log10_p) + math.log10(2.0))
        layers = mapped_layers if by_map else layers
        notes.append(mapped_note(len(a.blocks), len(b.blocks), by_map))
    if expert_maps:
        notes.append(expert_map_note(expert_maps))
    if set_aside:
        notes.append(set_aside_note(set_aside))
    return PairTestResult(
        model_a=a.meta.model,
        model_b=b.meta.model,
        statistic=statistic,
        log10_p=log10_p,
        layers=layers,
        n_layers=len(layers),
        inputs=a.meta.input_set,
        notes=notes,
        closeness=mean_closeness(layers),
    )


def parallel_map(function: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[function(x) for x in items]``, on up to ``workers`` threads when there is more than one item."""
    if workers <= 1 or len(items) <= 1:
        return [function(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="hubtrace-block") as pool:
        return list(pool.map(function, items))


def mean_closeness(layers: list[LayerResult]) -> float | None:
    """The pair's closeness: the mean over compared blocks (None when no block has one, e.g. phi_H)."""
    values = [layer.closeness for layer in layers if layer.closeness is not None]
    return sum(values) / len(values) if values else None


def screen_note(screen: list[int], depth: int, log10_p: float) -> str:
    return (
        f"sequential test: screening blocks {', '.join(map(str, screen))} of {depth} gave log10 p = {log10_p:.1f}, "
        "which settles it; the other blocks were not compared (the p-value stays valid, see scanner.stats.sequential)"
    )


def mapped_note(depth_a: int, depth_b: int, by_map: bool) -> str:
    return (
        f"depths differ ({depth_a} vs {depth_b} blocks): tested by index and on the block pairs candidate retrieval "
        f"maps; the {'mapped blocks' if by_map else 'index pairing'} gave the smaller p-value, reported doubled "
        "(Bonferroni over the two pairings)"
    )


def input_notes(tokenizer_hashes: tuple[str | None, str | None], id_ranges: tuple[int, int], shared: int) -> list[str]:
    """What a reader should know about the inputs of a pair: other tokenizers, other vocabularies."""
    notes = []
    hash_a, hash_b = tokenizer_hashes
    if hash_a and hash_b and hash_a != hash_b:
        notes.append(
            "the tokenizers differ, so the same ids mean different text: "
            "activation tests keep their validity but lose power"
        )
    if id_ranges[0] != id_ranges[1]:
        notes.append(
            f"vocabularies differ ({id_ranges[0]} vs {id_ranges[1]} ids); inputs use the shared first {shared}"
        )
    return notes


def depth_note(depth_a: int, depth_b: int) -> str:
    return (
        f"depths differ ({depth_a} vs {depth_b} blocks): blocks are paired by index over the common first "
        f"{min(depth_a, depth_b)}; `hubtrace localize` searches all block pairs"
    )


def pair_fingerprint_experts(a: Fingerprint, b: Fingerprint, layer_a: int, layer_b: int) -> ExpertPairing:
    """Which expert of A's block goes with which of B's (scanner.stats.experts: matched, not paired by index)."""
    return pair_block_experts(
        [(x.gate, x.up) for x in a.blocks[layer_a]], [(y.gate, y.up) for y in b.blocks[layer_b]],
        a.meta.n_experts, b.meta.n_experts,
    )


def expert_map_note(expert_maps: dict[int, str]) -> str:
    """One note for every block whose experts were not paired by index: B's expert <- A's expert."""
    blocks = "; ".join(f"block {layer}: {text}" for layer, text in sorted(expert_maps.items()))
    return (f"experts matched on unit-order-invariant activation similarity before testing "
            f"(B's expert <- A's expert; see scanner.stats.experts): {blocks}")


def set_aside_note(set_aside: dict[int, str]) -> str:
    """One note for every block where MATCH set units aside: all-zero or duplicated units carry no evidence, and
    a solver would break their ties by index order (scanner.stats.degenerate)."""
    blocks = "; ".join(f"block {layer}: {text}" for layer, text in sorted(set_aside.items()))
    return f"units set aside before matching, as all-zero or duplicated (no evidence; see scanner.stats.degenerate): " \
           f"{blocks}"


def block_result(
    layer_a: int, layer_b: int, tests: list[BlockTest], pairing: ExpertPairing | None = None
) -> LayerResult:
    """One block pair's result; an MoE block's experts are combined by FISHER, or by Bonferroni when they share
    one dense MLP (rho is then undefined); closeness is the mean over the experts' matched units."""
    closeness = [t.closeness for t in tests if t.closeness is not None]
    mean = sum(closeness) / len(closeness) if closeness else None
    if len(tests) == 1:
        return LayerResult(layer_a, layer_b, tests[0].log10_p, tests[0].rho, tests[0].n_units, mean)
    log10_p = pairing.combine([t.log10_p for t in tests]) if pairing is not None else fisher(tests)
    return LayerResult(layer_a, layer_b, log10_p, None, sum(t.n_units for t in tests), mean)
