"""Synthetic fingerprints for tests of what happens after extraction: real metadata, activations made to order.

A derived block is its parent block's units permuted plus Gaussian noise, so phi_MATCH finds it whatever the
width; every other block is fresh Gaussian noise, independent of everything.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from scanner.activations import MLPActivations
from scanner.fingerprint import Fingerprint, fingerprint_model
from scanner.inputs import InputSpec
from tests.tiny_models import FAMILIES, save_random


def template_fingerprint(folder: Path, tokens: int) -> Fingerprint:
    """A tiny Llama's fingerprint on one sequence of ``tokens``: the metadata synthetic pairs start from."""
    save_random(FAMILIES["llama"].config(), folder)
    return fingerprint_model(folder, inputs=InputSpec(n_sequences=1, seq_len=tokens))


def synthetic_pair(
    template: Fingerprint, depth: int, units: int, parents: Mapping[int, int], seed: int, noise: float = 0.5
) -> tuple[Fingerprint, Fingerprint]:
    """Two comparable fingerprints of ``depth`` blocks of ``units`` units; block j of B derives from block
    ``parents[j]`` of A, the other blocks of B are independent of A."""
    rng = np.random.default_rng(seed)
    tokens = template.blocks[0][0].gate.shape[1]
    gaussian = lambda: rng.standard_normal((units, tokens), dtype=np.float32)  # noqa: E731
    blocks_a = [[MLPActivations(gaussian(), gaussian())] for _ in range(depth)]
    blocks_b = []
    for layer in range(depth):
        if layer in parents:
            parent, perm = blocks_a[parents[layer]][0], rng.permutation(units)
            gate, up = (x[perm] + noise * gaussian() for x in (parent.gate, parent.up))
        else:
            gate, up = gaussian(), gaussian()
        blocks_b.append([MLPActivations(gate, up)])
    meta = dataclasses.replace(template.meta, n_layers=depth, intermediate_size=units)
    return Fingerprint(meta, blocks_a), Fingerprint(meta, blocks_b)
