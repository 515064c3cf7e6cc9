"""Retrieval entries: a few unit-level signatures per block, small enough to index every model of a hub.

A unit's signature is its gate and up activation vectors over the canonical tokens, each scaled to unit length,
projected to ``dim`` dimensions by a FIXED Gaussian matrix (same seed for every model, so signatures of any two
models on the same input set are comparable), each part scaled to unit length again and the two concatenated (unit
length once more). What the transformations of a derivative do to it:

* permuting hidden units permutes the signatures (the entry keeps a set of them, in a canonical order);
* rescaling a unit's gate/up against its down projection (T6) is removed by the unit-length scaling;
* a negative factor (a gated MLP's up row and down column both negated: the outputs do not change) flips the up
  part; so a gated unit is stored in its canonical sign, the one that points its up part along the fixed up
  direction (``canonical_signs``, version 4): a unit and its negation give one signature, and a relative's unit,
  whose up part points about the same way, gets the same sign unless its projection on that direction is near 0.
  Two units then meet at the mean of their gate and up cosines. A sign-free form of the up part (its square p p^T,
  version 3) needs no sign at all, but it enters the up cosine squared: a unit whose views a long fine-tune moves
  to cosine 0.55 meets its parent near 0.4 rather than 0.55, too few such units collide, and the zoo's 4x long
  fine-tune goes unretrieved on some builds of the zoo (bench/bench_retrieval_recall.py; BENCHMARKS.md, "Candidate
  retrieval");
* rotating or permuting the residual stream (T1, T3) changes weights, not activations on token inputs;
* a fine-tune, a merge or a width prune moves a kept unit's activations a little, so its signature stays close.

Which units are kept is the set's only choice: the ``units_per_block`` units whose signature points furthest along
one fixed direction (a gate half and an up half, of equal length; the up half read after the sign is set, so the
choice is the same for a unit and its negation). That is a function of each unit's own activations, so it is
invariant to permuting and rescaling units, and a unit near the top of the parent stays near the top of a
derivative; the entry is therefore the same set for a model and any relabelling of its units. Every expert of an
MoE block competes for the block's places (an expert upcycled from a dense MLP brings the dense model's top units).

What is kept of a chosen unit is its signature less its component along each half of that direction, each part
scaled to unit length again (version 2 on; ``SignatureParams(version=1)`` keeps the whole signature, for
comparisons). Every chosen unit lies far along the direction, so that component is what unrelated units have in
common: left in, it raised the cosine of unrelated units by about 0.2 and their chance of passing the collision
threshold about thirtyfold, which at hub scale buried the related pairs under unrelated ones (BENCHMARKS.md).

Only informative units compete (``screen``): units that are all-zero, constant over the canonical tokens or
of a direction another unit of the block repeats are set aside first (scanner.stats.degenerate, the screen φ_MATCH
uses). A constant unit's signature is the same vector in every model, and a block of duplicated units
fills the places with copies of one signature, so either would make unrelated models collide in every block:
every pair of a hub holding such models would become a candidate. The screen reads one model's own units, so the
score stays a function of the unit sets (scanner.retrieval.candidates) and the selected p-values stay valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from scanner.fingerprints.fingerprint import Fingerprint
from scanner.reading.activations import MLPActivations
from scanner.stats.degenerate import screen_units

SIGNATURE_VERSION = 4
_NORM_FLOOR = 1e-12


@dataclass(frozen=True)
class SignatureParams:
    """How entries are made; two entries are comparable only when their params (and input sets) are equal."""

    dim: int = 32                 # projected dimensions per part (gate, up); signatures have 2 * dim
    units_per_block: int = 16     # signatures per block that go into the index
    query_units_per_block: int = 64   # signatures per block that query it (a superset: the next ones in order)
    seed: int = 20261123          # of the fixed projection and direction: never change without a new version
    version: int = SIGNATURE_VERSION
    screen: bool = True           # only informative units compete (False: every unit, as entries before the screen)

    def to_json_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json_dict(cls, data: dict) -> SignatureParams:
        """Params as an entry file stores them; a field the file lacks takes the value entries had before the field
        existed (``PARAMS_BEFORE_FIELDS``), so an older entry compares unequal and is made again."""
        return cls(**{**PARAMS_BEFORE_FIELDS, **data})


PARAMS_BEFORE_FIELDS = {"screen": False}
"""What entries written before a field existed were made with."""


@dataclass(frozen=True)
class RetrievalEntry:
    """A model's retrieval entry: ``vectors`` (n, 2*dim) unit rows (float32 as made from a fingerprint, float16 as
    an entry file stores them), the block each row comes from, and which rows are indexed (the first
    ``units_per_block`` of each block; all rows query)."""

    vectors: np.ndarray
    blocks: np.ndarray        # (n,) int32 block index of each row
    indexed: np.ndarray       # (n,) bool
    n_layers: int
    input_set: str
    params: SignatureParams
    database_id: str | None = None   # the database whose folder keeps its file (None: not from a file, or older)

    def __post_init__(self) -> None:
        if self.vectors.ndim != 2 or self.vectors.shape[1] != 2 * self.params.dim:
            raise ValueError(f"retrieval vectors must be (n, {2 * self.params.dim}), got {self.vectors.shape}")
        if self.blocks.shape != (self.vectors.shape[0],) or self.indexed.shape != self.blocks.shape:
            raise ValueError("retrieval entry needs one block index and one indexed flag per vector")


def projection(tokens: int, params: SignatureParams) -> tuple[np.ndarray, np.ndarray]:
    """The fixed (tokens, dim) Gaussian projection and the (2*dim,) unit direction that picks units (its gate and
    up halves of equal length, so neither part outweighs the other in the choice)."""
    rng = np.random.default_rng([params.seed, params.version, tokens])
    matrix = rng.standard_normal((tokens, params.dim)).astype(np.float32) / np.sqrt(params.dim, dtype=np.float32)
    halves = _unit_rows(rng.standard_normal((2, params.dim)).astype(np.float32))
    return matrix, halves.ravel() / np.sqrt(2, dtype=np.float32)


def unit_signatures(gate: np.ndarray, up: np.ndarray, params: SignatureParams, up_sign_free: bool = False
                    ) -> np.ndarray:
    """Signatures of every unit of one MLP: (units, 2*dim) float32 unit rows; ``up_sign_free`` (a gated MLP) puts
    each unit in its canonical sign (``canonical_signs``)."""
    matrix, direction = projection(gate.shape[1], params)
    gate_part, up_part = (_unit_rows(_unit_rows(np.asarray(x, dtype=np.float32)) @ matrix) for x in (gate, up))
    if up_sign_free:
        up_part = up_part * canonical_signs(up_part, direction[params.dim:])[:, None]
    return _unit_rows(np.concatenate([gate_part, up_part], axis=1))


def canonical_signs(up_part: np.ndarray, up_direction: np.ndarray) -> np.ndarray:
    """+1 or -1 per unit: the sign that points its up part along the direction's up half (+1 at a tie). The same
    signature for a unit and its negation, so neither the choice of units nor the entry depends on a copier's
    signs."""
    return np.where(up_part @ up_direction < 0, -1.0, 1.0).astype(np.float32)


def select_units(signatures: np.ndarray, params: SignatureParams, tokens: int, keep: int) -> np.ndarray:
    """Indices of the ``keep`` units furthest along the fixed direction, ordered by that projection (ties by the
    signature's sum, so the order never depends on the units' labels)."""
    _, direction = projection(tokens, params)
    scores = signatures @ direction
    keep = min(keep, scores.shape[0])
    top = np.argpartition(-scores, keep - 1)[:keep] if keep < scores.shape[0] else np.arange(scores.shape[0])
    return top[np.lexsort((signatures[top].sum(axis=1), -scores[top]))]


def without_direction(signatures: np.ndarray, direction: np.ndarray) -> np.ndarray:
    """Chosen units' signatures less their component along each half of the choosing direction (the gate part's
    along the gate half, the up part's along the up half), each part and the whole at unit length again."""
    half = signatures.shape[1] // 2
    parts = []
    for part, axis in ((signatures[:, :half], direction[:half]), (signatures[:, half:], direction[half:])):
        axis = axis / np.linalg.norm(axis)
        parts.append(_unit_rows(part - (part @ axis)[:, None] * axis[None, :]))
    return _unit_rows(np.concatenate(parts, axis=1))


DEFAULT_PARAMS = SignatureParams()


def retrieval_entry(fingerprint: Fingerprint, params: SignatureParams = DEFAULT_PARAMS) -> RetrievalEntry:
    """The entry of a fingerprint: ``query_units_per_block`` signatures of every block (all experts competing),
    the first ``units_per_block`` of them indexed.

    Indexing fewer units than query keeps the index small, and a derivative whose units drifted (a long
    fine-tune) still finds its parent: a unit in the parent's indexed top needs only to stay in the derivative's
    wider query top, not in its indexed one."""
    vectors, blocks, indexed = [], [], []
    sign_free = fingerprint.meta.up_sign_free
    for layer, experts in enumerate(fingerprint.blocks):
        signatures = np.concatenate([unit_signatures(e.gate, e.up, params, sign_free) for e in experts])
        if params.screen:
            signatures = signatures[informative_units(experts, sign_free)]
        tokens = experts[0].gate.shape[1]
        kept = select_units(signatures, params, tokens, params.query_units_per_block)
        chosen = signatures[kept]
        vectors.append(without_direction(chosen, projection(tokens, params)[1]) if params.version >= 2 else chosen)
        blocks.append(np.full(kept.shape[0], layer, dtype=np.int32))
        indexed.append(np.arange(kept.shape[0]) < params.units_per_block)
    return RetrievalEntry(np.concatenate(vectors), np.concatenate(blocks), np.concatenate(indexed),
                          len(fingerprint.blocks), fingerprint.meta.input_set, params)


def informative_units(experts: Sequence[MLPActivations], up_sign_free: bool = False) -> np.ndarray:
    """Bool per unit of the block (experts in order, competing together): not all-zero, not constant, and one per
    group of units that repeat a direction in the gate and the up view (phi_MATCH's screen)."""
    return screen_units(np.concatenate([e.gate for e in experts]), np.concatenate([e.up for e in experts]),
                        sign_free=(False, up_sign_free)).informative


def _unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), _NORM_FLOOR)
