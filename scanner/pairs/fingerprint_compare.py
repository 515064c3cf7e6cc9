"""A pair test between two fingerprints: phi_MATCH (or phi_H) of their blocks, with no checkpoint open.

`scanner.pairs.compare.compare_models` computes its activation statistics through here too, so a test from two
fingerprint files gives exactly the numbers of a live test on the same input set.

A pair test runs in stages, each a function of the previous one's result, so every note a reader gets comes from
what a stage returned:

1. **plan**: which block pairs are compared (by index; when depths differ and candidate retrieval mapped blocks, on
   the mapped pairs as well) and what the inputs mean for the result (`plan_notes`);
2. **pair**: in each block pair, which MLP of A goes with which of B: experts are matched, not paired by index, and
   each block's routed-expert count is its own (`pair_blocks` -> `BlockPair`);
3. **screen**: each side's informative units, per MLP (scanner.stats.degenerate; computed once per fingerprint);
4. **match**: phi_MATCH (or phi_H) of every paired MLP, the matrices of many blocks built together where that
   pays (`test_block_pairs` -> `BlockOutcome`);
5. **combine**: experts into their block (`block_result`), blocks into the pair by FISHER, under the sequential
   design, and the two pairings of a depth difference by Bonferroni (`run_design` -> `DesignOutcome`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import TypeVar

from scanner.errors import IncomparableError
from scanner.fingerprints.fingerprint import Fingerprint
from scanner.fingerprints.shared_vocab import is_shared_string_input_set, shared_inputs_note
from scanner.pairs.results import LayerResult, PairTestResult
from scanner.reading.activations import BlockContributions, MLPActivations, block_contributions, pooled_activations
from scanner.reading.canonical_mlp import odd_linear
from scanner.stats.experts import ExpertPairing, pair_block_experts
from scanner.stats.independence import BlockTest, fisher
from scanner.stats.logp import log10_bonferroni, log10_fisher
from scanner.stats.matching import MatchingRule
from scanner.stats.pooled_units import POOLED_UNITS, pooled_block_log10_p, pooled_rows
from scanner.stats.registry import FINGERPRINT_STATISTICS, STATISTIC_BY_NAME, Reads, Statistic
from scanner.stats.sequential import SequentialDesign

T = TypeVar("T")
R = TypeVar("R")
BlockPairing = tuple[int, int]
"""(block of A, block of B)."""


@dataclass(frozen=True)
class BlockPair:
    """One block of A against one of B, their MLPs paired: ``mlps[k]`` are the k-th paired (A, B) MLPs."""

    layer_a: int
    layer_b: int
    pairing: ExpertPairing
    mlps: list[tuple[MLPActivations, MLPActivations]]
    expert_map: str | None  # B's expert <- A's expert, where the experts were not paired one to one by index
    pooled: tuple[MLPActivations, MLPActivations] | None = None  # each side's MLPs as one, where a side has several


@dataclass(frozen=True)
class BlockOutcome:
    """A block pair's result, and what a reader should know about how it was reached."""

    result: LayerResult
    set_aside: str  # what the screen set aside in the block's MLPs ("" when nothing)
    expert_map: str | None
    pooled: str = ""  # "" where the block's units were not tested pooled; else "tested", or "decided" where that
    # test gave the smaller p-value (scanner.stats.pooled_units)


@dataclass(frozen=True)
class DesignOutcome:
    """The blocks a pairing compared and its log10 p (None when no block could be tested); ``settled_by`` the
    screening blocks when they settled it."""

    blocks: list[BlockOutcome]
    log10_p: float | None
    settled_by: list[int] | None = None
    compared_of: int = 0  # block pairs the pairing had


def compare_fingerprints(
    a: Fingerprint,
    b: Fingerprint,
    statistic: str = "match",
    *,
    device: str | None = None,
    design: SequentialDesign | None = None,
    workers: int = 1,
    block_map: tuple[tuple[int, int], ...] | None = None,
    rule: MatchingRule = "screened",
) -> PairTestResult:
    """Test independence from two fingerprints, blocks paired by index; FISHER over blocks (and experts).

    ``device`` None or "cpu" computes the cosine matrices on the CPU; a CUDA device builds the matrices of all
    compared blocks there and matches them there. ``rule``: how MATCH pairs units (scanner.stats.matching: by
    default greedily, then exactly where that finds a block related). ``design`` compares its screening blocks
    first and stops when they settle the test (scanner.stats.sequential); None compares every block. On the host,
    ``workers`` > 1 compares that many blocks at once on threads, so one block's cosine products (outside the GIL)
    overlap another's matching; the result is the same (bench/bench_7b_pair.py --workers measures the gain).
    ``block_map`` (candidate retrieval's (block of a, block of b) pairs) matters when the depths differ: the pair is
    then tested both by index and on the mapped blocks, and reports twice the smaller p-value (Bonferroni over the
    two pairings; scanner.retrieval.candidates says why the mapped one is valid). Raises IncomparableError when the
    fingerprints were taken on different input sets.
    """
    device = None if device in (None, "cpu") else device
    entry = fingerprint_statistic(statistic)
    reason = a.comparable_with(b)
    if reason is not None:
        raise IncomparableError(reason)
    mapped = len(a.blocks) != len(b.blocks) and bool(block_map)

    def test(block_pairs: list[BlockPairing]) -> list[BlockOutcome]:
        return test_block_pairs(a, b, [pair_blocks(a, b, pairing) for pairing in block_pairs], entry,
                                device=device, rule=rule, workers=workers)

    by_index = run_design([(layer, layer) for layer in range(min(len(a.blocks), len(b.blocks)))], test, design)
    outcome, log10_p, by_map = by_index, by_index.log10_p, None
    if mapped:
        by_map = run_design(sorted({(int(x), int(y)) for x, y in block_map}), test, design)
        tested = [o for o in (by_index, by_map) if o.log10_p is not None]
        outcome = min(tested, key=lambda o: o.log10_p) if tested else by_index
        # Bonferroni over the pairings that could be tested (which could is set by each side's units, not by a p)
        log10_p = log10_bonferroni([o.log10_p for o in tested]) if tested else None
    layers = [block.result for block in outcome.blocks]
    return PairTestResult(
        model_a=a.meta.model,
        model_b=b.meta.model,
        statistic=statistic,
        log10_p=log10_p,
        layers=layers,
        n_layers=len(layers),
        inputs=a.meta.input_set,
        notes=[*plan_notes(a, b, entry, mapped), *rule_notes(rule),
               *outcome_notes(outcome, a, b, mapped, outcome is by_map)],
        closeness=mean_closeness(layers),
        cannot_test=None if log10_p is not None else untestable_reason(layers),
    )


def fingerprint_statistic(name: str) -> Statistic:
    """The registry's entry for ``name`` (scanner.stats.registry), which must be one a fingerprint can give."""
    if name not in FINGERPRINT_STATISTICS:
        raise ValueError(f"statistic {name!r} cannot be computed from fingerprints; "
                         f"choose one of {', '.join(FINGERPRINT_STATISTICS)}")
    return STATISTIC_BY_NAME[name]


# -- stage 1: plan -----------------------------------------------------------------------------------------------


def plan_notes(a: Fingerprint, b: Fingerprint, entry: Statistic, mapped: bool) -> list[str]:
    """What a reader should know before the blocks: the inputs, a depth difference, the statistic's caveat (phi_H's
    weakness)."""
    if is_shared_string_input_set(a.meta.input_set):
        notes = [shared_inputs_note(a.meta.input_set, a.meta.token_range)]
    else:
        notes = input_notes(
            (a.meta.tokenizer_hash, b.meta.tokenizer_hash), (a.meta.vocab_size, b.meta.vocab_size), a.meta.token_range
        )
    if len(a.blocks) != len(b.blocks) and not mapped:
        notes.append(depth_note(len(a.blocks), len(b.blocks)))
    if entry.caveat:
        notes.append(entry.caveat)
    canonical = canonical_note(a, b)
    return notes + ([canonical] if canonical else [])


def rule_notes(rule: MatchingRule) -> list[str]:
    """A note where units were matched by other than the default rule (a stored test says how it was made)."""
    described = {"exact": "the exact maximum-weight assignment", "greedy": "the greedy matching alone"}
    if rule not in described:
        return []
    return [f"units matched by {described[rule]} (matching rule '{rule}'; by default, blocks the greedy matching finds "
            "related are matched exactly: scanner.stats.matching)"]


# -- stage 2: pair -----------------------------------------------------------------------------------------------


def pair_blocks(a: Fingerprint, b: Fingerprint, pairing: BlockPairing) -> BlockPair:
    """Block ``pairing[0]`` of A against block ``pairing[1]`` of B, each MLP of one paired with one of the other."""
    layer_a, layer_b = pairing
    experts_a, experts_b = a.blocks[layer_a], b.blocks[layer_b]
    paired = pair_fingerprint_experts(a, b, layer_a, layer_b)
    shown = not paired.by_index or len(experts_a) != len(experts_b)
    pooled = (block_pooled(a, layer_a), block_pooled(b, layer_b)) if max(len(experts_a), len(experts_b)) > 1 else None
    return BlockPair(layer_a, layer_b, paired, [(experts_a[i], experts_b[j]) for i, j in paired.pairs],
                     paired.describe() if shown else None, pooled)


def block_pooled(fp: Fingerprint, layer: int) -> MLPActivations:
    """Block ``layer``'s MLPs read as one, the units a block pools (scanner.stats.pooled_units), made once per
    fingerprint and block: its screen is then computed once for every pair it is tested in. A dense block is its one
    MLP as it is (its units are one model's own, in its own order; a pair worker may hold them on its GPU)."""
    mlps = fp.blocks[layer]
    if len(mlps) == 1:
        return mlps[0]
    cache = fp.__dict__.setdefault("_pooled", {})
    if layer not in cache:
        cache[layer] = pooled_activations(mlps, pooled_rows(contributions(fp, layer).sizes))
    return cache[layer]


def pair_fingerprint_experts(a: Fingerprint, b: Fingerprint, layer_a: int, layer_b: int) -> ExpertPairing:
    """Which expert of A's block goes with which of B's (scanner.stats.experts: matched, not paired by index), with
    each block's own routed-expert count, B's units weighed by what they add to the block, units repeated in another
    MLP as nothing (they do not tell B's experts apart)."""
    return pair_block_experts(
        [(x.gate, x.up) for x in a.blocks[layer_a]], [(y.gate, y.up) for y in b.blocks[layer_b]],
        a.meta.routed_experts(layer_a), b.meta.routed_experts(layer_b),
        weights_b=contributions(b, layer_b).distinct if len(b.blocks[layer_b]) > 1 else None,
    )


def contributions(fp: Fingerprint, layer: int) -> BlockContributions:
    """What each unit of each MLP of block ``layer`` adds to its output (scanner.reading.activations.
    block_contributions), made once per fingerprint and block."""
    cache = fp.__dict__.setdefault("_contributions", {})
    if layer not in cache:
        cache[layer] = block_contributions(fp.blocks[layer], fp.meta.hidden_act, fp.meta.mlp_kind)
    return cache[layer]


# -- stages 3 and 4: screen and match ----------------------------------------------------------------------------


def test_block_pairs(a: Fingerprint, b: Fingerprint, pairs: list[BlockPair], entry: Statistic, *,
                     device: str | None, rule: MatchingRule, workers: int) -> list[BlockOutcome]:
    """Every paired MLP's test by the statistic's ``compute``, screened on each side's informative units, through
    the stage that gathers what it reads (BLOCK_TESTS)."""
    return BLOCK_TESTS[entry.reads](a, b, pairs, entry, device=device, rule=rule, workers=workers)


def test_hidden(a: Fingerprint, b: Fingerprint, pairs: list[BlockPair], entry: Statistic, *,
                device: str | None, rule: MatchingRule, workers: int) -> list[BlockOutcome]:
    """phi_H of every paired MLP's hidden activations, blocks on ``workers`` threads."""
    def hidden(pair: BlockPair) -> BlockOutcome:
        return outcome(pair, [entry.compute(x.hidden(a.meta.hidden_act, a.meta.mlp_kind),
                                            y.hidden(b.meta.hidden_act, b.meta.mlp_kind), device=device, rule=rule)
                              for x, y in pair.mlps])

    return parallel_map(hidden, pairs, workers)


def test_gate_and_up(a: Fingerprint, b: Fingerprint, pairs: list[BlockPair], entry: Statistic, *,
                     device: str | None, rule: MatchingRule, workers: int) -> list[BlockOutcome]:
    """phi_MATCH of every paired MLP's gate and up views: on a GPU the blocks' matrices are built there together;
    otherwise blocks go one at a time, on ``workers`` threads."""
    sign_free = a.meta.up_sign_free
    gate_sign_free = plain_gate_sign_free(a) and plain_gate_sign_free(b)

    def matched(group: list[BlockPair]) -> list[BlockOutcome]:
        mlps = [mlp for pair in group for mlp in [*pair.mlps, *([pair.pooled] if pair.pooled else [])]]
        tests = iter(entry.compute([(x.gate, x.up, y.gate, y.up) for x, y in mlps], device=device, rule=rule,
                                   up_sign_free=sign_free, gate_sign_free=gate_sign_free,
                                   screens=[(x.screen(sign_free), y.screen(sign_free)) for x, y in mlps],
                                   writes=[None if x.write is None or y.write is None else (x.write, y.write)
                                           for x, y in mlps]))
        return [outcome(pair, [next(tests) for _ in pair.mlps], next(tests) if pair.pooled else None)
                for pair in group]

    if device is not None:
        return matched(pairs)
    return parallel_map(lambda pair: matched([pair])[0], pairs, workers)


BLOCK_TESTS: dict[Reads, Callable[..., list[BlockOutcome]]] = {
    "gate and up activations": test_gate_and_up,
    "hidden activations": test_hidden,
}
"""How the blocks of two fingerprints are tested, by what the statistic reads of them (the registry's
FINGERPRINT_READS)."""


def plain_gate_sign_free(fp: Fingerprint) -> bool:
    """Whether the fingerprint's plain MLPs keep a write view free of their units' signs (act(z) - act(-z) = z:
    scanner.reading.activations.plain_views), which phi_MATCH then reads (scanner.stats.independence.phi_match_many)."""
    return fp.meta.mlp_kind == "plain" and odd_linear(fp.meta.hidden_act)


def outcome(pair: BlockPair, tests: list[BlockTest], pooled: BlockTest | None = None) -> BlockOutcome:
    """A block pair's tests combined, with what the screen set aside in it; ``pooled``, the test of each side's
    MLPs read as one, joins the block's p-value by Bonferroni (scanner.stats.pooled_units) where it could be made."""
    set_aside = "; ".join(sorted({t.set_aside for t in tests if t.set_aside}))
    result = block_result(pair.layer_a, pair.layer_b, tests, pair.pairing)
    if pooled is None or pooled.cannot_test:
        return BlockOutcome(result, set_aside, pair.expert_map)
    experts_p = None if result.cannot_test else result.log10_p
    decided = experts_p is None or pooled.log10_p < experts_p
    result = replace(result, log10_p=pooled_block_log10_p(experts_p, pooled.log10_p), cannot_test=None,
                     n_units=pooled.n_units if decided else result.n_units)
    return BlockOutcome(result, set_aside, pair.expert_map, "decided" if decided else "tested")


# -- stage 5: combine --------------------------------------------------------------------------------------------


def run_design(block_pairs: list[BlockPairing], test: Callable[[list[BlockPairing]], list[BlockOutcome]],
               design: SequentialDesign | None) -> DesignOutcome:
    """FISHER over the block pairs' results; under ``design`` the screening blocks first, the rest only when those
    do not settle the test (scanner.stats.sequential keeps the reported p-value valid)."""
    screen = [block_pairs[i] for i in design.screen(len(block_pairs))] if design is not None else block_pairs
    blocks = test(screen)
    log10_p = tested_fisher(blocks)
    if design is None or len(screen) == len(block_pairs):
        return DesignOutcome(blocks, log10_p, compared_of=len(block_pairs))
    if log10_p is not None and design.stops(log10_p):
        return DesignOutcome(blocks, log10_p, [layer for layer, _ in screen], len(block_pairs))
    blocks = sorted([*blocks, *test([p for p in block_pairs if p not in screen])],
                    key=lambda block: block.result.layer_a)
    log10_p = tested_fisher(blocks)
    return DesignOutcome(blocks, None if log10_p is None else design.continued_log10_p(log10_p),
                         compared_of=len(block_pairs))


def tested_fisher(blocks: list[BlockOutcome]) -> float | None:
    """FISHER over the blocks that could be tested (None when none could: a block that cannot be tested is no
    evidence either way, never a p-value of 1). Which blocks can be tested is set by each side's own units, so
    leaving the others out keeps the combined p-value valid."""
    tested = [block.result.log10_p for block in blocks if block.result.cannot_test is None]
    return log10_fisher(tested) if tested else None


def untestable_reason(layers: list[LayerResult]) -> str:
    """Why no block of a pair could be tested: each block's reason."""
    reasons = "; ".join(f"block {layer.layer_a}: {layer.cannot_test}" for layer in layers if layer.cannot_test)
    return f"no block could be tested ({reasons or 'no block pairs'})"


def block_result(
    layer_a: int, layer_b: int, tests: list[BlockTest], pairing: ExpertPairing | None = None
) -> LayerResult:
    """One block pair's result; an MoE block's experts are combined by FISHER, or by Bonferroni when they share
    one dense MLP (rho is then undefined), over the experts that could be tested; closeness is the mean over the
    experts' matched units. A block none of whose MLPs could be tested says why (cannot_test)."""
    closeness = [t.closeness for t in tests if t.closeness is not None]
    mean = sum(closeness) / len(closeness) if closeness else None
    tested = [t for t in tests if not t.cannot_test]
    if not tested:
        reason = "; ".join(sorted({t.cannot_test for t in tests}))
        return LayerResult(layer_a, layer_b, 0.0, None, sum(t.n_units for t in tests), mean, cannot_test=reason)
    if len(tests) == 1:
        return LayerResult(layer_a, layer_b, tests[0].log10_p, tests[0].rho, tests[0].n_units, mean)
    log10_p = pairing.combine([t.log10_p for t in tested]) if pairing is not None else fisher(tested)
    return LayerResult(layer_a, layer_b, log10_p, None, sum(t.n_units for t in tests), mean)


def mean_closeness(layers: list[LayerResult]) -> float | None:
    """The pair's closeness: the mean over compared blocks (None when no block has one, e.g. phi_H)."""
    values = [layer.closeness for layer in layers if layer.closeness is not None]
    return sum(values) / len(values) if values else None


def parallel_map(function: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``[function(x) for x in items]``, on up to ``workers`` threads when there is more than one item."""
    if workers <= 1 or len(items) <= 1:
        return [function(x) for x in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="hubtrace-block") as pool:
        return list(pool.map(function, items))


# -- notes -------------------------------------------------------------------------------------------------------


def outcome_notes(outcome: DesignOutcome, a: Fingerprint, b: Fingerprint, mapped: bool, by_map: bool) -> list[str]:
    """What the reported pairing's stages did: the screen that settled it, the Bonferroni over two pairings, the
    experts' map and the units set aside."""
    notes = []
    if outcome.settled_by is not None:
        notes.append(screen_note(outcome.settled_by, outcome.compared_of, outcome.log10_p))
    if mapped:
        notes.append(mapped_note(len(a.blocks), len(b.blocks), by_map))
    expert_maps = {block.result.layer_a: block.expert_map for block in outcome.blocks if block.expert_map}
    if expert_maps:
        notes.append(expert_map_note(expert_maps))
    set_aside = {block.result.layer_a: block.set_aside for block in outcome.blocks if block.set_aside}
    if set_aside:
        notes.append(set_aside_note(set_aside))
    if any(block.pooled for block in outcome.blocks):
        notes.append(pooled_note([block.result.layer_a for block in outcome.blocks if block.pooled == "decided"]))
    return notes


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


def canonical_note(a: Fingerprint, b: Fingerprint) -> str:
    """What the canonical form did to either model's experts and units as stored, "" when nothing: experts read as
    one (scanner.reading.alike_experts) or read alone for want of the routing, units folded into another unit's
    function and units that write nothing (scanner.reading.canonical_mlp), per block."""
    parts = []
    for side, fp in (("A", a), ("B", b)):
        changed = [f"block {block}: {dead} of {stored} units write nothing, {combined} folded into others"
                   for block, (stored, dead, combined) in enumerate(fp.meta.summaries.get("canonical_units", []))
                   if dead or combined]
        changed += [f"block {block}: {stored} experts read as {fp.meta.routed_experts(block)}"
                    for block, stored in enumerate(fp.meta.summaries.get("stored_experts", []))
                    if stored and stored != fp.meta.routed_experts(block)]
        changed += [f"block {block}: routing not seen, experts read alone"
                    for block, seen in enumerate(fp.meta.summaries.get("expert_routing_seen", [])) if seen is False]
        if changed:
            parts.append(f"{side}: {'; '.join(changed)}")
    if not parts:
        return ""
    return ("routed experts chosen together and weighed in proportion were read as one expert "
            "(scanner.reading.alike_experts), units that compute one function together were combined and units that "
            f"write nothing dropped before any view was read (scanner.reading.canonical_mlp): {' | '.join(parts)}")


def depth_note(depth_a: int, depth_b: int) -> str:
    return (
        f"depths differ ({depth_a} vs {depth_b} blocks): blocks are paired by index over the common first "
        f"{min(depth_a, depth_b)}; `hubtrace localize` searches all block pairs"
    )


def expert_map_note(expert_maps: dict[int, str]) -> str:
    """One note for every block whose experts were not paired by index: B's expert <- A's expert."""
    blocks = "; ".join(f"block {layer}: {text}" for layer, text in sorted(expert_maps.items()))
    return (f"experts matched on unit-order-invariant activation similarity before testing "
            f"(B's expert <- A's expert; see scanner.stats.experts): {blocks}")


def pooled_note(decided_by_pool: list[int]) -> str:
    """A note where MoE blocks were also tested on their MLPs' units pooled, naming the blocks that test decided."""
    decided = (f"; it gave the smaller in block{'s' if len(decided_by_pool) > 1 else ''} "
               f"{', '.join(map(str, decided_by_pool))}" if decided_by_pool else "")
    return ("MoE blocks were tested on their experts paired one to one and on all their MLPs' units pooled (at most "
            f"{POOLED_UNITS}, those that contribute most; scanner.stats.pooled_units), each block's p-value the "
            f"smaller of the two, times two where both could be tested{decided}")


def set_aside_note(set_aside: dict[int, str]) -> str:
    """One note for every block where MATCH set units aside: all-zero and constant units carry no evidence, and a
    group of duplicated units is one unit's evidence, kept once (scanner.stats.degenerate)."""
    blocks = "; ".join(f"block {layer}: {text}" for layer, text in sorted(set_aside.items()))
    return ("units set aside before matching, as all-zero, constant, or copies of a unit that was kept (see "
            f"scanner.stats.degenerate): {blocks}")
