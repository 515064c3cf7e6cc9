"""Output-preserving weight camouflage T1-T6 (paper App. D, Table 6) for Llama models, and its verification.

With hidden states as row vectors x and a Linear weight W acting as x W^T, the residual stream is
re-expressed as x Q where Q = P R is a permutation (T1) times a random orthogonal matrix (T3).
RMSNorm commutes with Q because Q preserves the norm, so each norm gain gamma is replaced by an
arbitrary non-zero gamma' (T5) and folded into the next linear map: W -> W diag(gamma) Q diag(1/gamma').
Maps writing into the residual stream become Q^T W. Per block, the MLP units are permuted (T2) and
up/down are scaled by c and 1/c (T6). Query and key are rotated per block (T4) only in the planes
RoPE rotates, i.e. dims (j, j + head_dim/2) of each head in transformers' rotate_half convention,
with the same angle for a KV head and the query heads sharing it; 2-D rotations commute, so RoPE
and every q.k are unchanged. All algebra runs in float64 before casting back to float32.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

TRANSFORMS = ("T1", "T2", "T3", "T4", "T5", "T6")


@dataclass(frozen=True)
class CamouflageRecord:
    """What was applied; the rotation, norm gains and q/k angles are reproducible from ``seed``."""

    seed: int
    transforms: tuple[str, ...]
    embedding_permutation: list[int]
    mlp_permutations: list[list[int]]
    mlp_scales: list[float]
    max_logit_diff: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def random_orthogonal(n: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random n x n orthogonal matrix (QR of a Gaussian with the sign fix), float64."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def random_gains(n: int, generator: torch.Generator) -> torch.Tensor:
    """Non-zero norm gains with random sign and magnitude in [1/2, 2] (T5), float64."""
    magnitude = torch.exp((2 * torch.rand(n, generator=generator, dtype=torch.float64) - 1) * math.log(2.0))
    sign = torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0).double()
    return magnitude * sign


def rope_plane_rotation(config: LlamaConfig, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotations (for the q and k projection outputs) that act only inside RoPE's 2-D planes (T4)."""
    head_dim = config.head_dim
    half = head_dim // 2
    n_rep = config.num_attention_heads // config.num_key_value_heads
    angles = 2 * math.pi * torch.rand(config.num_key_value_heads, half, generator=generator, dtype=torch.float64)

    def head_rotation(theta: torch.Tensor) -> torch.Tensor:
        rot = torch.zeros(head_dim, head_dim, dtype=torch.float64)
        j = torch.arange(half)
        rot[j, j] = torch.cos(theta)
        rot[j + half, j + half] = torch.cos(theta)
        rot[j, j + half] = -torch.sin(theta)
        rot[j + half, j] = torch.sin(theta)
        return rot

    k_rot = torch.block_diag(*[head_rotation(angles[g]) for g in range(config.num_key_value_heads)])
    q_rot = torch.block_diag(*[head_rotation(angles[h // n_rep]) for h in range(config.num_attention_heads)])
    return q_rot, k_rot


def camouflage(model: LlamaForCausalLM, seed: int) -> tuple[LlamaForCausalLM, CamouflageRecord]:
    """Apply T1-T6 with randomness from ``seed``; returns the camouflaged copy and its verified record."""
    config = model.config
    d, width = config.hidden_size, config.intermediate_size
    g = torch.Generator().manual_seed(seed)
    old = {k: v.double() for k, v in model.state_dict().items()}
    emb_perm = torch.randperm(d, generator=g)
    basis = torch.eye(d, dtype=torch.float64)[emb_perm] @ random_orthogonal(d, g)

    def refold(gamma: torch.Tensor, gamma_new: torch.Tensor) -> torch.Tensor:
        return torch.diag(gamma) @ basis @ torch.diag(1.0 / gamma_new)

    new = {"model.embed_tokens.weight": old["model.embed_tokens.weight"] @ basis}
    mlp_perms, scales = [], []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        gamma_in = random_gains(d, g)
        into_attn = refold(old[p + "input_layernorm.weight"], gamma_in)
        q_rot, k_rot = rope_plane_rotation(config, g)
        new[p + "input_layernorm.weight"] = gamma_in
        new[p + "self_attn.q_proj.weight"] = q_rot @ old[p + "self_attn.q_proj.weight"] @ into_attn
        new[p + "self_attn.k_proj.weight"] = k_rot @ old[p + "self_attn.k_proj.weight"] @ into_attn
        new[p + "self_attn.v_proj.weight"] = old[p + "self_attn.v_proj.weight"] @ into_attn
        new[p + "self_attn.o_proj.weight"] = basis.T @ old[p + "self_attn.o_proj.weight"]

        gamma_post = random_gains(d, g)
        into_mlp = refold(old[p + "post_attention_layernorm.weight"], gamma_post)
        units = torch.randperm(width, generator=g)
        scale = float(torch.exp((2 * torch.rand(1, generator=g, dtype=torch.float64) - 1) * math.log(4.0)))
        new[p + "post_attention_layernorm.weight"] = gamma_post
        new[p + "mlp.gate_proj.weight"] = (old[p + "mlp.gate_proj.weight"] @ into_mlp)[units]
        new[p + "mlp.up_proj.weight"] = scale * (old[p + "mlp.up_proj.weight"] @ into_mlp)[units]
        new[p + "mlp.down_proj.weight"] = (basis.T @ old[p + "mlp.down_proj.weight"])[:, units] / scale
        mlp_perms.append(units.tolist())
        scales.append(scale)

    gamma_final = random_gains(d, g)
    new["model.norm.weight"] = gamma_final
    new["lm_head.weight"] = old["lm_head.weight"] @ refold(old["model.norm.weight"], gamma_final)
    if new.keys() != old.keys():
        raise ValueError(f"unexpected parameters: {sorted(old.keys() ^ new.keys())}")

    child = copy.deepcopy(model)
    child.load_state_dict({k: v.float() for k, v in new.items()})
    record = CamouflageRecord(
        seed=seed,
        transforms=TRANSFORMS,
        embedding_permutation=emb_perm.tolist(),
        mlp_permutations=mlp_perms,
        mlp_scales=scales,
        max_logit_diff=max_logit_diff(model, child, seed),
    )
    return child, record


@torch.no_grad()
def max_logit_diff(a: LlamaForCausalLM, b: LlamaForCausalLM, seed: int, n_seq: int = 4) -> float:
    """Largest absolute float32 logit difference between two models on random token sequences."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, a.config.vocab_size, (n_seq, a.config.max_position_embeddings), generator=g)
    return float((a.eval()(input_ids=tokens).logits - b.eval()(input_ids=tokens).logits).abs().max())
