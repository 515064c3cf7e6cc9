"""phi_MATCH and phi_H between two fingerprints: the activation statistics with no checkpoint open.

`scanner.compare.compare_models` computes its activation statistics through here too, so a test from two
fingerprint files gives exactly the numbers of a live test on the same input set.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

from scanner.errors import IncomparableError
from scanner.fingerprint import Fingerprint
from scanner.results import LayerResult, PairTestResult
from scanner.stats.independence import BlockTest, fisher, phi_h, phi_match
from scanner.stats.logp import log10_fisher
from scanner.stats.sequential import SequentialDesign

FingerprintStatistic = Literal["match", "hidden"]
"""The statistics a fingerprint carries activations for (and so the ones a scan can test)."""
FINGERPRINT_STATISTICS: tuple[str, ...] = get_args(FingerprintStatistic)


def compare_fingerprints(
    a: Fingerprint,
    b: Fingerprint,
    statistic: str = "match",
    *,
    device: str | None = None,
    design: SequentialDesign | None = None,
    block_map: tuple[tuple[int, int], ...] | None = None,
) -> PairTestResult:
    """Test independence from two fingerprints, blocks paired by index; FISHER over blocks (and experts).

    ``device`` None or "cpu" computes the cosine matrices with numpy; a CUDA device computes them there and
    selects assignment candidates there too (same matchings, see scanner.stats.assignment). ``design`` compares
    its screening blocks first and stops when they settle the test (scanner.stats.sequential); None compares
    every block. ``block_map`` (candidate retrieval's (block of a, block of b) pairs) matters when the depths
    differ: the pair is then tested both by index and on the mapped blocks, and reports twice the smaller p-value
    (Bonferroni over the two pairings; scanner.retrieval.candidates says why the mapped one is valid).
    Raises IncomparableError when the fingerprints were taken on different input sets.
    """
    device = None if device in (None, "cpu") else device
    if statistic not in FINGERPRINT_STATISTICS:
        raise ValueError(
            f"statistic {statistic!r} cannot be computed from fingerprints; choose one of {', '.join(FINGERPRINT_STATISTICS)}"
        )
    reason = a.comparable_with(b)
    if reason is not None:
        raise IncomparableError(reason)
    notes = input_notes(
        (a.meta.tokenizer_hash, b.meta.tokenizer_hash), (a.meta.vocab_size, b.meta.vocab_size), a.meta.token_range
    )
    depth = min(len(a.blocks), len(b.blocks))
    mapped = len(a.blocks) != len(b.blocks) and bool(block_map)
    if len(a.blocks) != len(b.blocks) and not mapped:
        notes.append(depth_note(len(a.blocks), len(b.blocks)))
    if statistic == "hidden":
        notes.append("phi_H is fooled by permuting hidden units; use --stat match against adversaries")

    def block(layer_a: int, layer_b: int) -> LayerResult:
        experts_a, experts_b = a.blocks[layer_a], b.blocks[layer_b]
        if len(experts_a) != len(experts_b) and expert_note(len(experts_a), len(experts_b)) not in notes:
            notes.append(expert_note(len(experts_a), len(experts_b)))
        if statistic == "hidden":
            tests = [phi_h(x.hidden(a.meta.hidden_act), y.hidden(b.meta.hidden_act), device=device)
                     for x, y in zip(experts_a, experts_b)]
        else:
            tests = [phi_match(x.gate, x.up, y.gate, y.up, device=device) for x, y in zip(experts_a, experts_b)]
        return block_result(layer_a, layer_b, tests)

    def test(pairs: list[tuple[int, int]]) -> tuple[list[LayerResult], float]:
        screen = [pairs[i] for i in design.screen(len(pairs))] if design is not None else pairs
        layers = [block(*pair) for pair in screen]
        log10_p = log10_fisher([layer.log10_p for layer in layers])
        if design is not None and len(screen) < len(pairs):
            if design.stops(log10_p):
                notes.append(screen_note([la for la, _ in screen], len(pairs), log10_p))
            else:
                layers = sorted([*layers, *(block(*pair) for pair in pairs if pair not in screen)],
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
    return PairTestResult(
        model_a=a.meta.model,
        model_b=b.meta.model,
        statistic=statistic,
        log10_p=log10_p,
        layers=layers,
        n_layers=len(layers),
        inputs=a.meta.input_set,
        notes=notes,
    )


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
            "the tokenizers differ, so the same ids mean different text: activation tests keep their validity but lose power"
        )
    if id_ranges[0] != id_ranges[1]:
        notes.append(f"vocabularies differ ({id_ranges[0]} vs {id_ranges[1]} ids); inputs use the shared first {shared}")
    return notes


def depth_note(depth_a: int, depth_b: int) -> str:
    return (
        f"depths differ ({depth_a} vs {depth_b} blocks): blocks are paired by index over the common first "
        f"{min(depth_a, depth_b)}; `hubtrace localize` searches all block pairs"
    )


def expert_note(experts_a: int, experts_b: int) -> str:
    return f"expert counts differ ({experts_a} vs {experts_b}); experts are paired by index up to the smaller count"


def block_result(layer_a: int, layer_b: int, tests: list[BlockTest]) -> LayerResult:
    """One block pair's result; an MoE block's experts are combined by FISHER (rho is then undefined)."""
    if len(tests) == 1:
        return LayerResult(layer_a, layer_b, tests[0].log10_p, tests[0].rho, tests[0].n_units)
    return LayerResult(layer_a, layer_b, fisher(tests), None, sum(t.n_units for t in tests))
