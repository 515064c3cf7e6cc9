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
    FINGERPRINT_STATISTICS,
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
from scanner.stats.independence import BlockTest, phi_u
from scanner.stats.jsd import mean_jensen_shannon
from scanner.stats.l2 import BlockSource, phi_l2
from scanner.stats.logp import log10_fisher
from scanner.stats.matching import MatchingRule
from scanner.stats.weight_statistics import (
    WEIGHT_STATISTIC_NOTES,
    WEIGHT_STATISTICS,
    PairKind,
    pair_kind,
    weight_statistic,
)

STATISTICS = ("match", "up", "hidden", "l2", "jsd", *WEIGHT_STATISTICS)


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


def _test_up(a: OpenModel, b: OpenModel, notes: list[str], rule: MatchingRule) -> list[LayerResult]:
    if a.adapter.shape.hidden_size != b.adapter.shape.hidden_size:
        raise IncomparableError(
            f"phi_U compares weight rows, which needs equal hidden sizes ({a.adapter.shape.hidden_size} vs "
            f"{b.adapter.shape.hidden_size}); use --stat match, which works across shapes"
        )
    notes.append(
        "phi_U is fooled by permuting hidden units or the residual stream; use --stat match against adversaries"
    )
    return _blockwise(
        a, b, notes,
        lambda la, lb: [phi_u(wa.up.numpy(), wb.up.numpy(), rule=rule)
                        for wa, wb in _paired_experts(a, b, la, lb, notes)],
    )


def _test_activations(a: OpenModel, b: OpenModel, statistic: str, spec: InputSpec, device: str,
                      rule: MatchingRule) -> PairTestResult:
    """phi_MATCH / phi_H through fingerprints of both models on the shared id range, as `hubtrace scan` does
    (the hashes of the validation pass spare the fingerprints a second read of every tensor); on the token
    strings both tokenizers share when their vocabularies differ (scanner.fingerprints.shared_vocab)."""
    token_range = shared_token_range(a.token_range, b.token_range)
    rows = (a.adapter.shape.vocab_size, b.adapter.shape.vocab_size)
    shared = pair_input_sets(a.checkpoint.path, b.checkpoint.path, *rows, spec)
    input_sets = shared or (None, None)
    fingerprints = [
        fingerprint_model(m.checkpoint.path, inputs=spec, device=device, token_range=token_range,
                          tensor_hashes=m.tensor_hashes, input_set=input_set)
        for m, input_set in zip((a, b), input_sets)
    ]
    return replace(compare_fingerprints(*fingerprints, statistic, device=device, rule=rule), model_a=a.name,
                   model_b=b.name)


def _block_source(model: OpenModel) -> BlockSource:
    def read_block(layer: int) -> dict[str, np.ndarray]:
        return {role: t.numpy() for role, t in model.adapter.block_weights(layer).items()}

    return BlockSource(
        read_block=read_block, n_layers=model.adapter.shape.n_layers, hidden_size=model.adapter.shape.hidden_size
    )


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
    """Test the null hypothesis that two checkpoints were trained independently, with one statistic. ``null``: the
    empirical null of the weight fingerprints that have no other, their values on independent pairs by kind of pair
    (scanner.stats.weight_statistics.pair_kind); only the pairs of the tested pair's kind are read. ``rule``: how
    MATCH pairs units for the statistics that match them (scanner.stats.matching)."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")
    a, b = open_model(path_a, follow_links=follow_links), open_model(path_b, follow_links=follow_links)
    notes = [f"{m.name}: {note}" for m in (a, b) for note in m.checkpoint.notes]
    n_layers = min(a.adapter.shape.n_layers, b.adapter.shape.n_layers)
    common = dict(model_a=a.name, model_b=b.name, statistic=statistic, n_layers=n_layers)

    if statistic == "up":
        layers = _test_up(a, b, notes, rule)
        return PairTestResult(log10_p=fisher_of(layers), layers=layers, inputs=None, notes=notes, **common)
    if statistic == "l2":
        result = phi_l2(_block_source(a), _block_source(b), n_samples=permutations, seed=seed)
        notes.append(
            f"PERMTEST over {permutations} Appendix B permutations of model A: p cannot go below 1/{permutations + 1}"
        )
        return PairTestResult(
            log10_p=result.log10_p, layers=[], inputs=None, notes=notes, value=result.observed, **common
        )

    if statistic in WEIGHT_STATISTICS:
        kind = pair_kind(*((m.adapter.shape.model_type, m.adapter.shape.n_layers, m.adapter.shape.hidden_size)
                           for m in (a, b)))
        result = weight_statistic(statistic, weight_profile(a.adapter), weight_profile(b.adapter),
                                  null=None if null is None else null.get(kind, ()), kind=kind,
                                  permutations=max(permutations, 999), seed=seed)
        notes += [result.null, WEIGHT_STATISTIC_NOTES[statistic]]
        return PairTestResult(log10_p=result.log10_p, layers=[], inputs=None, notes=notes, value=result.value,
                              **common)
    if statistic in FINGERPRINT_STATISTICS:
        result = _test_activations(a, b, statistic, inputs, device, rule)
        return replace(result, notes=[*notes, *result.notes])
    input_set = _pair_inputs(a, b, inputs, notes)  # jsd
    log_probs = [
        next_token_log_probs(load_causal_lm(m.checkpoint, device), input_set.ids, input_set.token_range) for m in (a, b)
    ]
    notes.append(
        "phi_JSD has no valid null distribution (it is invariant to every output-preserving change): "
        "raw value only, no p-value"
    )
    return PairTestResult(
        log10_p=None, layers=[], inputs=input_set.id, notes=notes, value=mean_jensen_shannon(*log_probs), **common
    )


def fisher_of(layers: list[LayerResult]) -> float:
    """FISHER over per-block p-values (independent across blocks under the null, Theorem 2)."""
    return log10_fisher([layer.log10_p for layer in layers])
