"""Appendix B: the output-preserving permutations that PERMTEST resamples for phi_l2.

A residual-stream permutation (pi_emb, one per model) and one hidden-unit permutation per gated MLP
(pi_mlp, per block and per expert) act on canonical roles. Initialisation is invariant and training
equivariant under both, which is what makes the permuted copies valid null samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from scanner.errors import IncomparableError

_READS_RESIDUAL = re.compile(r"^(q|k|v|router|(.*\.)?(gate|up)|shared_router)$")
_WRITES_RESIDUAL = re.compile(r"^(o|(.*\.)?down)$")
_RESIDUAL_VECTOR = re.compile(r"^(attn_norm|mlp_norm|post_attn_norm|post_mlp_norm|final_norm)$")
_UNTOUCHED = re.compile(r"^(q_norm|k_norm|(q|k|v|o)_bias)$")
_MLP_ROW = re.compile(r"^(?P<group>(.*\.)?)(gate|up)$")
_MLP_COLUMN = re.compile(r"^(?P<group>(.*\.)?)down$")


@dataclass(frozen=True)
class ModelPermutation:
    """One draw from Pi_emb x Pi_mlp: a residual permutation and per-(block, MLP group) unit permutations."""

    residual: np.ndarray
    mlp: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)


def sample_permutation(
    rng: np.random.Generator, hidden_size: int, mlp_groups: dict[tuple[int, str], int]
) -> ModelPermutation:
    """Draw pi_emb uniformly and, for every (block, MLP group) of the given width, an independent pi_mlp."""
    return ModelPermutation(
        residual=rng.permutation(hidden_size),
        mlp={key: rng.permutation(width) for key, width in sorted(mlp_groups.items())},
    )


def mlp_groups(roles: dict[str, tuple[int, ...]]) -> dict[str, int]:
    """Width of every gated MLP in a block, keyed by its role prefix ('' for a dense block, 'experts.3.' ...)."""
    return {m.group("group"): shape[0] for role, shape in roles.items() if (m := _MLP_ROW.match(role))}


def permute_role(role: str, tensor: np.ndarray, permutation: ModelPermutation, layer: int | None) -> np.ndarray:
    """Apply the permutation to one canonical tensor (PyTorch (out, in) layout), exactly as Table 4 does."""
    out = tensor
    if role in ("embed", "lm_head"):
        return out[:, permutation.residual]
    if _RESIDUAL_VECTOR.match(role):
        return out[permutation.residual]
    if _UNTOUCHED.match(role):
        return out
    known = False
    if _READS_RESIDUAL.match(role):
        out, known = out[:, permutation.residual], True
    if _WRITES_RESIDUAL.match(role):
        out, known = out[permutation.residual, :], True
    if layer is not None and (m := _MLP_ROW.match(role)):
        out = out[permutation.mlp[(layer, m.group("group"))], :]
    if layer is not None and (m := _MLP_COLUMN.match(role)):
        out = out[:, permutation.mlp[(layer, m.group("group"))]]
    if not known:
        raise IncomparableError(f"phi_l2 does not know how the role {role!r} transforms under Appendix B permutations")
    return out
