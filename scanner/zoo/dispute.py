"""The Solar-Open-100B vs GLM-4.5-Air dispute in miniature, on models built here (docs/moe-dispute.md).

A GLM-4.5-Air-shaped MoE (`glm4_moe`: routed experts with a DeepSeek-style router and one shared expert), a copy
converted into another model type (`solar_open`) with its experts and their hidden units permuted and rescaled, as
a copier hiding the source would, and an independently initialised `solar_open` of the same shape. The conversion
leaves the function unchanged (the router's rows move with the experts), so only the weights can tell.

    python -m scanner.zoo.dispute OUT_DIR    # writes OUT_DIR/{glm-air-mini,solar-open-mini,solar-independent}
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import Glm4MoeConfig, Glm4MoeForCausalLM, SolarOpenConfig, SolarOpenForCausalLM

from scanner.quiet import no_progress_bars
from scanner.zoo.moe import ExpertCamouflage, camouflage_experts

#: One shape for all three: every layer an MoE block (Solar Open has no dense first layers), 8 routed experts, and the
#: rotary embedding on whole heads (GLM-4.5 rotates half of each head, which Solar Open's attention cannot express: a
#: real conversion would differ there, in attention, and nowhere in the MLPs this test reads).
SHAPE = dict(vocab_size=256, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
             n_group=1, topk_group=1, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0})


def glm_air_mini(seed: int) -> Glm4MoeForCausalLM:
    """A tiny GLM-4.5-Air-shaped model with the model's own random initialisation."""
    torch.manual_seed(seed)
    return Glm4MoeForCausalLM(Glm4MoeConfig(**SHAPE, intermediate_size=96, first_k_dense_replace=0)).eval()


def solar_open_mini(seed: int) -> SolarOpenForCausalLM:
    """An independently initialised Solar Open of the same shape."""
    torch.manual_seed(seed)
    return SolarOpenForCausalLM(SolarOpenConfig(**SHAPE)).eval()


@torch.no_grad()
def convert_to_solar_open(glm: Glm4MoeForCausalLM, seed: int) -> tuple[SolarOpenForCausalLM, ExpertCamouflage]:
    """glm's weights as a Solar Open model, experts permuted (with the router's rows and score-correction bias) and
    their units permuted and rescaled: the same function under another model type."""
    camouflaged, planted = camouflage_experts(glm, seed)
    solar = solar_open_mini(seed)
    solar.load_state_dict(camouflaged.state_dict(), strict=True)
    return solar.eval(), planted


def build_dispute(root: Path) -> dict[str, Path]:
    """Save the three models under root; returns their folders by name."""
    glm = glm_air_mini(seed=0)
    converted, _ = convert_to_solar_open(glm, seed=1)
    folders = {"glm-air-mini": root / "glm-air-mini", "solar-open-mini": root / "solar-open-mini",
               "solar-independent": root / "solar-independent"}
    with no_progress_bars():
        for folder, model in zip(folders.values(), (glm, converted, solar_open_mini(seed=2))):
            model.save_pretrained(folder)
    return folders


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m scanner.zoo.dispute OUT_DIR")
    for name, folder in build_dispute(Path(sys.argv[1])).items():
        print(f"{name:18} {folder}")
