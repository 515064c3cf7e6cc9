"""Test two checkpoints for independence: open both, gather what the statistic needs, compute it.

I/O and orchestration live here; the statistics themselves are pure functions in scanner.stats.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scanner.activations import glu_activations, load_causal_lm, mlp_inputs, next_token_log_probs
from scanner.adapters import ArchitectureAdapter, adapter_for
from scanner.checkpoint import Checkpoint, open_checkpoint
from scanner.errors import IncomparableError
from scanner.inputs import InputSet, InputSpec, canonical_inputs, shared_token_range
from scanner.results import LayerResult, PairTestResult
from scanner.stats.independence import BlockTest, fisher, phi_h, phi_match, phi_u
from scanner.stats.jsd import mean_jensen_shannon
from scanner.stats.l2 import BlockSource, phi_l2
from scanner.stats.logp import log10_fisher

STATISTICS = ("match", "up", "hidden", "l2", "jsd")


@dataclass(frozen=True)
class OpenModel:
    """A validated checkpoint with its adapter: everything the statistics read comes through here."""

    name: str
    checkpoint: Checkpoint
    adapter: ArchitectureAdapter

    @property
    def token_range(self) -> int:
        base = self.checkpoint.tokenizer_base_vocab_size()
        vocab = self.adapter.shape.vocab_size
        return min(vocab, base) if base else vocab


def open_model(path: str | Path) -> OpenModel:
    checkpoint = open_checkpoint(path)
    return OpenModel(name=str(path), checkpoint=checkpoint, adapter=adapter_for(checkpoint))


def _pair_inputs(a: OpenModel, b: OpenModel, spec: InputSpec, notes: list[str]) -> InputSet:
    hash_a, hash_b = a.checkpoint.tokenizer_hash(), b.checkpoint.tokenizer_hash()
    if hash_a and hash_b and hash_a != hash_b:
        notes.append("the tokenizers differ, so the same ids mean different text: activation tests keep their validity but lose power")
    if a.token_range != b.token_range:
        notes.append(f"vocabularies differ ({a.token_range} vs {b.token_range} ids); inputs use the shared first {min(a.token_range, b.token_range)}")
    return canonical_inputs(shared_token_range(a.token_range, b.token_range), spec)


def _model_mlp_inputs(model: OpenModel, inputs: InputSet, device: str) -> list:
    lm = load_causal_lm(model.checkpoint, device)
    try:
        return mlp_inputs(lm, model.adapter, inputs.ids)
    finally:
        del lm
        gc.collect()


def _paired_experts(a: OpenModel, b: OpenModel, layer_a: int, layer_b: int, notes: list[str]):
    experts_a, experts_b = a.adapter.mlp(layer_a), b.adapter.mlp(layer_b)
    if len(experts_a) != len(experts_b):
        note = f"expert counts differ ({len(experts_a)} vs {len(experts_b)}); experts are paired by index up to the smaller count"
        if note not in notes:
            notes.append(note)
    return list(zip(experts_a, experts_b))


def _block_result(layer_a: int, layer_b: int, tests: list[BlockTest]) -> LayerResult:
    if len(tests) == 1:
        return LayerResult(layer_a, layer_b, tests[0].log10_p, tests[0].rho, tests[0].n_units)
    return LayerResult(layer_a, layer_b, fisher(tests), None, sum(t.n_units for t in tests))


def _blockwise(
    a: OpenModel, b: OpenModel, notes: list[str], block_tests: Callable[[int, int], list[BlockTest]]
) -> list[LayerResult]:
    depth_a, depth_b = a.adapter.shape.n_layers, b.adapter.shape.n_layers
    if depth_a != depth_b:
        notes.append(
            f"depths differ ({depth_a} vs {depth_b} blocks): blocks are paired by index over the common first "
            f"{min(depth_a, depth_b)}; `hubtrace localize` searches all block pairs"
        )
    return [_block_result(layer, layer, block_tests(layer, layer)) for layer in range(min(depth_a, depth_b))]


def _test_up(a: OpenModel, b: OpenModel, notes: list[str]) -> list[LayerResult]:
    if a.adapter.shape.hidden_size != b.adapter.shape.hidden_size:
        raise IncomparableError(
            f"phi_U compares weight rows, which needs equal hidden sizes ({a.adapter.shape.hidden_size} vs "
            f"{b.adapter.shape.hidden_size}); use --stat match, which works across shapes"
        )
    notes.append("phi_U is fooled by permuting hidden units or the residual stream; use --stat match against adversaries")
    return _blockwise(
        a, b, notes, lambda la, lb: [phi_u(wa.up.numpy(), wb.up.numpy()) for wa, wb in _paired_experts(a, b, la, lb, notes)]
    )


def _test_activations(a: OpenModel, b: OpenModel, statistic: str, inputs: InputSet, device: str, notes: list[str]):
    inputs_a, inputs_b = _model_mlp_inputs(a, inputs, device), _model_mlp_inputs(b, inputs, device)

    def block_tests(layer_a: int, layer_b: int) -> list[BlockTest]:
        acts_a = glu_activations(inputs_a[layer_a], a.adapter.mlp(layer_a))
        acts_b = glu_activations(inputs_b[layer_b], b.adapter.mlp(layer_b))
        if len(acts_a) != len(acts_b):
            _paired_experts(a, b, layer_a, layer_b, notes)
        if statistic == "hidden":
            act_a, act_b = a.adapter.shape.hidden_act, b.adapter.shape.hidden_act
            return [phi_h(x.hidden(act_a), y.hidden(act_b)) for x, y in zip(acts_a, acts_b)]
        return [phi_match(x.gate, x.up, y.gate, y.up) for x, y in zip(acts_a, acts_b)]

    if statistic == "hidden":
        notes.append("phi_H is fooled by permuting hidden units; use --stat match against adversaries")
    return _blockwise(a, b, notes, block_tests)


def _block_source(model: OpenModel) -> BlockSource:
    def read_block(layer: int) -> dict[str, np.ndarray]:
        return {role: t.numpy() for role, t in model.adapter.block_weights(layer).items()}

    return BlockSource(read_block=read_block, n_layers=model.adapter.shape.n_layers, hidden_size=model.adapter.shape.hidden_size)


def compare_models(
    path_a: str | Path,
    path_b: str | Path,
    statistic: str = "match",
    *,
    inputs: InputSpec = InputSpec(),
    permutations: int = 99,
    seed: int = 0,
    device: str = "cpu",
) -> PairTestResult:
    """Test the null hypothesis that two checkpoints were trained independently, with one statistic."""
    if statistic not in STATISTICS:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {', '.join(STATISTICS)}")
    a, b = open_model(path_a), open_model(path_b)
    notes: list[str] = []
    n_layers = min(a.adapter.shape.n_layers, b.adapter.shape.n_layers)
    common = dict(model_a=a.name, model_b=b.name, statistic=statistic, n_layers=n_layers)

    if statistic == "up":
        layers = _test_up(a, b, notes)
        return PairTestResult(log10_p=fisher_of(layers), layers=layers, inputs=None, notes=notes, **common)
    if statistic == "l2":
        result = phi_l2(_block_source(a), _block_source(b), n_samples=permutations, seed=seed)
        notes.append(
            f"PERMTEST over {permutations} Appendix B permutations of model A: p cannot go below 1/{permutations + 1}"
        )
        return PairTestResult(log10_p=result.log10_p, layers=[], inputs=None, notes=notes, value=result.observed, **common)

    input_set = _pair_inputs(a, b, inputs, notes)
    if statistic == "jsd":
        log_probs = [next_token_log_probs(load_causal_lm(m.checkpoint, device), input_set.ids, input_set.token_range) for m in (a, b)]
        notes.append("phi_JSD has no valid null distribution (it is invariant to every output-preserving change): raw value only, no p-value")
        return PairTestResult(
            log10_p=None, layers=[], inputs=input_set.id, notes=notes, value=mean_jensen_shannon(*log_probs), **common
        )
    layers = _test_activations(a, b, statistic, input_set, device, notes)
    return PairTestResult(log10_p=fisher_of(layers), layers=layers, inputs=input_set.id, notes=notes, **common)


def fisher_of(layers: list[LayerResult]) -> float:
    """FISHER over per-block p-values (independent across blocks under the null, Theorem 2)."""
    return log10_fisher([layer.log10_p for layer in layers])
