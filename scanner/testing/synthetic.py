"""Synthetic fingerprints for what happens after extraction (comparison, localize, benches): a real fingerprint's
metadata, activations made to order.

A derived block is its parent block's units permuted, plus Gaussian noise, with up optionally rescaled (a
camouflage that phi_MATCH must see through); every other block is fresh Gaussian noise, independent of all else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from scanner.activations import MLPActivations
from scanner.fingerprint import Fingerprint


def synthetic_pair(
    template: Fingerprint,
    depth: int,
    units: int,
    parents: Mapping[int, int],
    seed: int,
    *,
    noise: float = 0.5,
    up_scale: float = 1.0,
) -> tuple[Fingerprint, Fingerprint]:
    """Two comparable fingerprints of ``depth`` blocks of ``units`` units on the template's input set; block j of
    B derives from block ``parents[j]`` of A, B's other blocks are independent of A."""
    rng = np.random.default_rng(seed)
    tokens = template.blocks[0][0].gate.shape[1]
    gaussian = lambda: rng.standard_normal((units, tokens), dtype=np.float32)  # noqa: E731
    blocks_a = [[MLPActivations(gaussian(), gaussian())] for _ in range(depth)]
    blocks_b = []
    for layer in range(depth):
        if layer in parents:
            parent, perm = blocks_a[parents[layer]][0], rng.permutation(units)
            gate, up = parent.gate[perm] + noise * gaussian(), up_scale * (parent.up[perm] + noise * gaussian())
        else:
            gate, up = gaussian(), gaussian()
        blocks_b.append([MLPActivations(gate, up)])

    def fingerprint(name: str, blocks: list[list[MLPActivations]]) -> Fingerprint:
        meta = dataclasses.replace(template.meta, model=name, n_layers=depth, intermediate_size=units)
        return Fingerprint(meta, blocks)

    return fingerprint("synthetic-a", blocks_a), fingerprint("synthetic-b", blocks_b)
