"""Test two checkpoints for independence: open both, gather what the statistic needs, compute it.

I/O and orchestration live here; the statistics themselves are pure functions in scanner.stats.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from scanner.errors import IncomparableError
from scanner.fingerprints.fingerprint import fingerprint_model, model_token_range
from scanner.fingerprints.inputs import InputSet, InputSpec, canonical_inputs, shared_token_range
from scanner.fingerprints.shared_vocab import pair_input_sets
from scanner.pairs.fingerprint_compare import (
    block_result,
    compare_fingerprints,
    depth_note,
    input_notes,
)
from scanner.pairs.results import LayerResult, PairTestResult
from scanner.reading.activations import load_causal_lm, next_token_log_probs
from scanner.reading.architectures.families import ArchitectureAdapter
from scanner.reading.checkpoint import Checkpoint
from scanner.reading.validate import validate_checkpoint
from scanner.reading.weight_profiles import weight_profile
from scanner.stats import registry
from scanner.stats.independence import BlockTest
from scanner.stats.l2 import BlockSource
from scanner.stats.logp import log10_fisher
from scanner.stats.matching import MatchingRule
from scanner.stats.registry import Reads, Statistic
from scanner.stats.weight_statistics import PairKind, WeightTestOptions, pair_kind


@dataclass(frozen=True)
class OpenModel:
    """A validated checkpoint with its adapter: everything the statistics read comes through here."""

    name: str
    checkpoint: Checkpoint
    adapter: ArchitectureAdapter
    tensor_hashes: dict[str, str] | None = None

    @property
    def token_range(self) -> int:
        return model_token_range(self.checkpoint, self.adapter)


def open_model(path: str | Path, *, follow_links: bool = False) -> OpenModel:
    """Every check of `validate_checkpoint` (NaN/Inf weights and folder safety included) before any statistic."""
    checkpoint, adapter, hashes = validate_checkpoint(path, follow_links=follow_links)
    return OpenModel(name=str(path), checkpoint=checkpoint, adapter=adapter, tensor_hashes=hashes)


def _pair_inputs(a: OpenModel, b: OpenModel, spec: InputSpec, notes: list[str]) -> InputSet:
    shared = shared_token_range(a.token_range, b.token_range)
    notes += input_notes(
        (a.checkpoint.tokenizer_hash(), b.checkpoint.tokenizer_hash()), (a.token_range, b.token_range), shared
    )
    return canonical_inputs(shared, spec)


def expert_note(experts_a: int, experts_b: int) -> str:
    return f"expert counts differ ({experts_a} vs {experts_b}); experts are paired by index up to the smaller count"


def _paired_experts(a: OpenModel, b: OpenModel, layer_a: int, layer_b: int, notes: list[str]):
    experts_a, experts_b = a.adapter.mlp(layer_a), b.adapter.mlp(layer_b)
    if len(experts_a) != len(experts_b) and expert_note(len(experts_a), len(experts_b)) not in notes:
        notes.append(expert_note(len(experts_a), len(experts_b)))
    return list(zip(experts_a, experts_b))


def _blockwise(
    a: OpenModel, b: OpenModel, notes: list[str], block_tests: Callable[[int, int], list[BlockTest]]
) -> list[LayerResult]:
    depth_a, depth_b = a.adapter.shape.n_layers, b.adapter.shape.n_layers
    if depth_a != depth_b:
        notes.append(depth_note(depth_a, depth_b))
    return [block_result(layer, layer, block_tests(layer, layer)) for layer in range(min(depth_a, depth_b))]


@dataclass(frozen=True)
class PairRequest:
    """How one pair is to be tested, beside the statistic: compare_models' keyword arguments."""

    inputs: InputSpec
    permutations: int
    seed: int
    device: str
    null: Mapping[PairKind, Sequence[float]] | None
    rule: MatchingRule


def _test_up(a: OpenModel, b: OpenModel, entry: Statistic, request: PairRequest, notes: list[str]) -> PairTestResult:
    if a.adapter.shape.hidden_size != b.adapter.shape.hidden_size:
        raise IncomparableError(
            f"phi_U compares weight rows, which needs equal hidden sizes ({a.adapter.shape.hidden_size} vs "
            f"{b.adapter.shape.hidden_size}); use --stat match, which works across shapes"
        )
    layers = _blockwise(
        a, b, notes,
        lambda la, lb: [entry.compute(wa.up.numpy(), wb.up.numpy(), rule=request.rule)
                        for wa, wb in _paired_experts(a, b, la, lb, notes)],
    )
    return _result(a, b, entry, notes, log10_p=fisher_of(layers), layers=layers)


def _test_activations(a: OpenModel, b: OpenModel, entry: Statistic, request: PairRequest,
                      notes: list[str]) -> PairTestResult:
    """phi_MATCH / phi_H through fingerprints of both models on the shared id range, as `hubtrace scan` does
    (the hashes of the validation pass spare the fingerprints a second read of every tensor); on the token
    strings both tokenizers share when their vocabularies differ (scanner.fingerprints.shared_vocab)."""
    token_range = shared_token_range(a.token_range, b.token_range)
    rows = (a.adapter.shape.vocab_size, b.adapter.shape.vocab_size)
    shared = pair_input_sets(a.checkpoint.path, b.checkpoint.path, *rows, request.inputs)
    input_sets = shared or (None, None)
    fingerprints = [
        fingerprint_model(m.checkpoint.path, inputs=request.inputs, device=request.device, token_range=token_range,
                          tensor_hashes=m.tensor_hashes, input_set=input_set)
        for m, input_set in zip((a, b), input_sets)
    ]
    result = compare_fingerprints(*fingerprints, entry.name, device=request.device, rule=request.rule)
    return replace(result, model_a=a.name, model_b=b.name, notes=[*notes, *result.notes])


def _block_source(model: OpenModel) -> BlockSource:
    def read_block(layer: int) -> dict[str, np.ndarray]:
        return {role: t.numpy() for role, t in model.adapter.block_weights(layer).items()}

    return BlockSource(
        read_block=read_block, n_layers=model.adapter.shape.n_layers, hidden_size=model.adapter.shape.hidden_size
    )


def _test_l2(a: OpenModel, b: OpenModel, entry: Statistic, request: PairRequest, notes: list[str]) -> PairTestResult:
    result = entry.compute(_block_source(a), _block_source(b), n_samples=request.permutations, seed=request.seed)
    notes.append(f"PERMTEST over {request.permutations} Appendix B permutations of model A: p cannot go below "
                 f"1/{request.permutations + 1}")
    return _result(a, b, entry, notes, log10_p=result.log10_p, value=result.value)


def _test_weights(a: OpenModel, b: OpenModel, entry: Statistic, request: PairRequest,
                  notes: list[str]) -> PairTestResult:
    """A weight fingerprint against the null of its entry; an empirical one only from pairs of the tested pair's
    kind (model types, depths, widths)."""
    kind = pair_kind(*((m.adapter.shape.model_type, m.adapter.shape.n_layers, m.adapter.shape.hidden_size)
                       for m in (a, b)))
    null = None if request.null is None else request.null.get(kind, ())
    result = entry.compute(weight_profile(a.adapter), weight_profile(b.adapter),
                           WeightTestOptions(null, kind, max(request.permutations, 999), request.seed))
    notes.append(result.null)
    return _result(a, b, entry, notes, log10_p=result.log10_p, value=result.value)


def _test_outputs(a: OpenModel, b: OpenModel, entry: Statistic, request: PairRequest,
                  notes: list[str]) -> PairTestResult:
    input_set = _pair_inputs(a, b, request.inputs, notes)
    log_probs = [next_token_log_probs(load_causal_lm(m.checkpoint, request.device), input_set.ids,
                                      input_set.token_range) for m in (a, b)]
    return _result(a, b, entry, notes, log10_p=None, value=entry.compute(*log_probs), inputs=input_set.id)


def _result(a: OpenModel, b: OpenModel, entry: Statistic, notes: list[str], *, log10_p: float | None,
            layers: list[LayerResult] | None = None, value: float | None = None,
            inputs: str | None = None) -> PairTestResult:
    """A checkpoint test's result, closed by the caveat its statistic carries."""
    return PairTestResult(model_a=a.name, model_b=b.name, statistic=entry.name, log10_p=log10_p, layers=layers or [],
                          n_layers=min(a.adapter.shape.n_layers, b.adapter.shape.n_layers), inputs=inputs,
                          notes=[*notes, *([entry.caveat] if entry.caveat else [])], value=value)


PairTest = Callable[[OpenModel, OpenModel, Statistic, PairRequest, list[str]], PairTestResult]
TESTS_BY_READS: dict[Reads, PairTest] = {
    "gate and up activations": _test_activations,
    "hidden activations": _test_activations,
    "up-projection weights": _test_up,
    "block weights": _test_l2,
    "next-token distributions": _test_outputs,
    "weight profile": _test_weights,
}
"""How a checkpoint pair gathers what a statistic reads (scanner.stats.registry) and tests it."""


def compare_models(
    path_a: str | Path,
    path_b: str | Path,
    statistic: str = "match",
    *,
    inputs: InputSpec = InputSpec(),
    permutations: int = 99,
    seed: int = 0,
    device: str = "cpu",
    follow_links: bool = False,
    null: Mapping[PairKind, Sequence[float]] | None = None,
    rule: MatchingRule = "screened",
) -> PairTestResult:
    """Test the null hypothesis that two checkpoints were trained independently, with one statistic (any of
    scanner.stats.registry). ``null``: the empirical null of the weight fingerprints that have no other, their values
    on independent pairs by kind of pair (scanner.stats.weight_statistics.pair_kind); only the pairs of the tested
    pair's kind are read. ``rule``: how MATCH pairs units for the statistics that match them (scanner.stats.matching).
    """
    entry = registry.statistic(statistic)
    a, b = open_model(path_a, follow_links=follow_links), open_model(path_b, follow_links=follow_links)
    notes = [f"{m.name}: {note}" for m in (a, b) for note in m.checkpoint.notes]
    request = PairRequest(inputs, permutations, seed, device, null, rule)
    return TESTS_BY_READS[entry.reads](a, b, entry, request, notes)


def fisher_of(layers: list[LayerResult]) -> float:
    """FISHER over per-block p-values (independent across blocks under the null, Theorem 2)."""
    return log10_fisher([layer.log10_p for layer in layers])
