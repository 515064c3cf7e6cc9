"""Synthetic fingerprints for what happens after extraction (comparison, localize, benches): a real fingerprint's
metadata, activations made to order (held as a fingerprint file holds them: unit-peak rows and their scales).

A derived block is its parent block's units permuted, plus Gaussian noise, with up optionally rescaled (a
camouflage that phi_MATCH must see through); every other block is fresh Gaussian noise, independent of all else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from scanner.activations import MLPActivations
from scanner.fingerprint import Fingerprint, stored_activations


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
            blocks_b.append([_derived(blocks_a[parents[layer]][0], rng, noise, up_scale)])
        else:
            blocks_b.append([MLPActivations(gaussian(), gaussian())])

    def fingerprint(name: str, blocks: list[list[MLPActivations]]) -> Fingerprint:
        meta = dataclasses.replace(template.meta, model=name, n_layers=depth, intermediate_size=units)
        return Fingerprint(meta, [[stored_activations(x, meta.dtype) for x in block] for block in blocks])

    return fingerprint("synthetic-a", blocks_a), fingerprint("synthetic-b", blocks_b)


def synthetic_derivative(parent: Fingerprint, name: str, seed: int, *, noise: float = 0.5,
                         up_scale: float = 1.0) -> Fingerprint:
    """A model derived from ``parent`` in every block (its units permuted afresh, fresh noise): several of them
    make a family whose members are all related to each other."""
    rng = np.random.default_rng(seed)
    blocks = [[stored_activations(_derived(block[0], rng, noise, up_scale), parent.meta.dtype)]
              for block in parent.blocks]
    return Fingerprint(dataclasses.replace(parent.meta, model=name), blocks)


def _derived(parent: MLPActivations, rng: np.random.Generator, noise: float, up_scale: float) -> MLPActivations:
    """The parent's units permuted, plus Gaussian noise, up rescaled by ``up_scale``."""
    perm = rng.permutation(parent.gate.shape[0])
    gate, up = (parent.values(part).astype(np.float32)[perm] for part in ("gate", "up"))
    gate = gate + noise * rng.standard_normal(gate.shape, dtype=np.float32)
    up = up_scale * (up + noise * rng.standard_normal(up.shape, dtype=np.float32))
    return MLPActivations(gate, up)
