"""phi_l2: negative l2 distance between the blocks of two models, made into a p-value by PERMTEST.

Raw weight distances mean nothing on their own (unrelated models can be closer than a fine-tune and
its base); resampling the distance under Appendix B permutations of one model gives it a calibrated
null. Blocks are read through callables so a caller can stream them from disk one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from scanner.errors import IncomparableError
from scanner.stats.independence import PermTestResult, permtest
from scanner.stats.permutations import ModelPermutation, mlp_groups, permute_role, sample_permutation

BlockWeights = dict[str, np.ndarray]


@dataclass(frozen=True)
class BlockSource:
    """A model seen block by block (canonical roles, float32), optionally under one Appendix B permutation."""

    read_block: Callable[[int], BlockWeights]
    n_layers: int
    hidden_size: int
    permutation: ModelPermutation | None = None

    def block(self, layer: int) -> BlockWeights:
        weights = self.read_block(layer)
        if self.permutation is None:
            return weights
        return {role: permute_role(role, tensor, self.permutation, layer) for role, tensor in weights.items()}


def negative_l2_distance(a: BlockSource, b: BlockSource) -> float:
    """-sum over blocks of the l2 distance between the blocks' parameters (higher means closer)."""
    if a.n_layers != b.n_layers:
        raise IncomparableError(f"phi_l2 needs equal depths, got {a.n_layers} and {b.n_layers} blocks")
    total = 0.0
    for layer in range(a.n_layers):
        block_a, block_b = a.block(layer), b.block(layer)
        if block_a.keys() != block_b.keys():
            raise IncomparableError(f"block {layer} holds different tensors: {sorted(block_a)} vs {sorted(block_b)}")
        squared = 0.0
        for role, tensor in block_a.items():
            if tensor.shape != block_b[role].shape:
                raise IncomparableError(
                    f"phi_l2 needs equal shapes; block {layer} {role}: {tensor.shape} vs {block_b[role].shape}"
                )
            squared += float(np.sum((tensor.astype(np.float64) - block_b[role]) ** 2))
        total += np.sqrt(squared)
    return -total


def phi_l2(a: BlockSource, b: BlockSource, n_samples: int = 99, seed: int = 0) -> PermTestResult[BlockSource]:
    """PERMTEST of phi_l2 with Pi = Pi_emb x Pi_mlp applied to model a (p >= 1/(n_samples+1))."""
    groups = {
        (layer, group): width
        for layer in range(a.n_layers)
        for group, width in mlp_groups({role: t.shape for role, t in a.read_block(layer).items()}).items()
    }

    def sample_transform(rng: np.random.Generator) -> Callable[[BlockSource], BlockSource]:
        permutation = sample_permutation(rng, a.hidden_size, groups)
        return lambda source: replace(source, permutation=permutation)

    return permtest(negative_l2_distance, a, b, sample_transform, n_samples=n_samples, seed=seed)
