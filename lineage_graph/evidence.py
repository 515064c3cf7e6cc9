"""What the lineage graph is built from and what it produces, as plain values (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from scanner.declared.merge_config import MergeDeclaration

DEFAULT_MIN_DIRECTION_CONFIDENCE = 0.8
"""Directions below this confidence are drawn without an arrow and read "direction undecided" (the investigator's
``lineage.min_direction_confidence``). Here, not in lineage_graph.direction, so the command line and the config
read it without importing networkx."""


@dataclass(frozen=True)
class ModelInfo:
    """One current model: its shape, what its card claims, and weight summaries used for direction."""

    model_id: str
    revision: str = ""
    architecture: str | None = None
    n_layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    n_experts: int | None = None
    declared_base_models: tuple[str, ...] = ()
    declared_relation: str | None = None
    claims_from_scratch: bool = False
    license: str | None = None
    created_at: datetime | None = None
    activation_rank: tuple[float, ...] | None = None
    """Per-block effective rank of the unit-normalised MLP activations (fingerprint summaries), when known."""
    activation_scale: tuple[float, ...] | None = None
    """Per-block median over units of the root mean square of each unit's gate (first view) activation on the canonical
    inputs (fingerprint summaries ``gate_rms_quantiles``), when known."""
    declared_merge: MergeDeclaration | None = None
    """What the model folder's mergekit_config.yml declares (its models are in declared_base_models too)."""
    mlp_values: bytes = b""
    """The MLP weight values sampled for the verbatim share (float32 bytes, scanner.stats.verbatim), when known."""
    mlp_layout: str = ""
    """Digest of the matrices mlp_values was read from: samples of one layout line up."""

    @property
    def declares_base(self) -> bool:
        return bool(self.declared_base_models)


@dataclass(frozen=True)
class PairTest:
    """The current test of one unordered pair (model_a < model_b) with the statistic the graph uses."""

    model_a: str
    model_b: str
    statistic: str
    log10_p: float
    n_layers: int
    layers: tuple[dict, ...] = ()
    input_set: str = ""
    reason: str = "comparable"
    revision_a: str = ""
    revision_b: str = ""
    closeness: float | None = None
    """Mean cosine of matched activations (phi_MATCH; None for tests stored before it was recorded)."""


@dataclass(frozen=True)
class Direction:
    """Who derives from whom for one dependent pair; parent/child are None when the evidence is silent or cancels.

    confidence is the combined probability (0.5 = a coin flip) that parent -> child is right.
    """

    parent: str | None
    child: str | None
    confidence: float
    reasons: tuple[str, ...] = ()
    decided: bool = True
    """False when the confidence is below the level the investigator set (``lineage.min_direction_confidence``), or
    when nothing but a signal that may not decide alone (``direction.NOT_ALONE``) leans this way: the pair keeps its
    place in the tree, but is drawn without an arrow and reads "direction undecided"."""
    corroborated: bool = True
    """False when every piece of evidence for this leaning is a signal that may not decide alone (the activation
    rank): such a direction is never claimed, whatever its confidence."""

    @property
    def claimed(self) -> bool:
        """Whether an arrow parent -> child is drawn: a parent is known and the confidence reaches the set level."""
        return self.parent is not None and self.decided


@dataclass(frozen=True)
class Edge:
    """A tested pair after FDR control, with its evidence and (for dependent pairs) its direction."""

    test: PairTest
    log10_q: float
    dependent: bool
    direction: Direction
    block_map: tuple[tuple[int, int], ...] = ()
    """Block pairs (layer_a, layer_b) whose own test is significant at the graph's level."""
    joins_family: bool = False
    """Dependent and significant under family-wise (Holm) control too: only such edges join models into families."""
    kinship: str | None = None
    """How the two stand in their family's tree (``lineage.KINSHIPS``: parent, merge_parent, alternative_parent, copy,
    ancestor, sibling, cousin, relative); None for a pair outside any one family tree."""

    @property
    def pair(self) -> tuple[str, str]:
        return self.test.model_a, self.test.model_b

    @property
    def strength(self) -> float:
        """-log10 p: how strongly the weights reject independence."""
        return -self.test.log10_p


@dataclass(frozen=True)
class Discrepancy:
    """A conflict between what a card declares and what the weights show."""

    model_id: str
    kind: str
    related_model: str | None
    confidence: float
    detail: str
    evidence: dict = field(default_factory=dict)
