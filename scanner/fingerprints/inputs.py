"""Canonical activation inputs: seeded token-id sequences that any two models sharing a tokenizer agree on.

The ids come from SHAKE-256 of a versioned seed rather than a library RNG, so an input set id names
the same tokens on every machine and every numpy/torch release; a fingerprint taken today stays
comparable with one taken next year.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

INPUT_SET_VERSION = 1


@dataclass(frozen=True)
class InputSpec:
    """How many uniformly random token sequences to run, and from which seed."""

    seed: int = 0
    n_sequences: int = 4
    seq_len: int = 64
    version: int = INPUT_SET_VERSION

    def __post_init__(self) -> None:
        if self.n_sequences < 1 or self.seq_len < 1:
            raise ValueError(f"an input set needs at least one token, got {self.n_sequences}x{self.seq_len}")


@dataclass(frozen=True)
class InputSet:
    """The token ids (n_sequences, seq_len) drawn uniformly from [0, token_range), and their stable id."""

    spec: InputSpec
    token_range: int
    ids: np.ndarray

    @property
    def id(self) -> str:
        s = self.spec
        return f"v{s.version}-seed{s.seed}-{s.n_sequences}x{s.seq_len}-ids<{self.token_range}"

    @property
    def n_tokens(self) -> int:
        return int(self.ids.size)


def canonical_inputs(token_range: int, spec: InputSpec = InputSpec()) -> InputSet:
    """Uniform token ids in [0, token_range) from the versioned seed (modulo bias below 2**-40)."""
    if token_range < 2:
        raise ValueError(f"token range must be at least 2, got {token_range}")
    count = spec.n_sequences * spec.seq_len
    stream = hashlib.shake_256(f"hubtrace-canonical-inputs/v{spec.version}/seed{spec.seed}".encode()).digest(8 * count)
    words = np.frombuffer(stream, dtype="<u8")
    ids = (words % np.uint64(token_range)).astype(np.int64).reshape(spec.n_sequences, spec.seq_len)
    return InputSet(spec=spec, token_range=token_range, ids=ids)


def shared_token_range(*ranges: int) -> int:
    """The id range both models understand: a padded or extended vocabulary keeps the shared prefix."""
    return min(ranges)
