"""Quantized copies of float model folders, laid out as GPTQ, AWQ and FP8 checkpoints are on the Hub.

The tests and benches need quantized checkpoints whose float parent is known; hubtrace writes them itself
(round-to-nearest per group, no calibration data: a real GPTQ run moves weights a little further from the
parent, which only makes it a closer analogue of a short fine-tune). Every linear layer of every block is
quantized; embeddings, norms and the output head stay float, as the quantization tools leave them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from scanner.formats import open_model_checkpoint
from scanner.formats.quantized import AWQ_ORDER, block_scales, pack_int4

_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def rtn_int4(weight: torch.Tensor, group: torch.Tensor, n_groups: int) -> tuple[torch.Tensor, ...]:
    """Asymmetric 4-bit round-to-nearest of a float (out, in) weight with the input columns in groups.

    Returns q (out, in) in 0..15, zeros (groups, out) in 1..14 and scales (groups, out): W ~ (q - zero) * scale.
    """
    w = weight.float()
    lows = torch.stack([w[:, group == g].amin(1).clamp(max=0) for g in range(n_groups)])  # (groups, out)
    highs = torch.stack([w[:, group == g].amax(1).clamp(min=0) for g in range(n_groups)])
    scales = ((highs - lows) / 15).clamp(min=1e-8)
    # zero 0 cannot be stored in the classic GPTQ layout (zeros minus one), so zero >= 1 and the scale widens to fit
    zeros = torch.round(-lows / scales).clamp(1, 14)
    scales = torch.maximum(highs / (15 - zeros), -lows / zeros).clamp(min=1e-8)
    q = torch.round(w / scales[group].T + zeros[group].T).clamp(0, 15)
    return q.to(torch.int32), zeros.to(torch.int32), scales.half()


def write_quantized(source: Path, out: Path, scheme: str, *, group_size: int = 32, act_order: bool = False,
                    block: tuple[int, int] | None = (32, 32)) -> Path:
    """A copy of the float folder `source` quantized with `scheme` ("gptq", "awq", "fp8" or "fp8-tensor").

    gptq: classic AutoGPTQ layout (zeros stored minus one), act-order `g_idx` when asked; awq: GEMM layout;
    fp8: float8_e4m3fn weights with `weight_scale_inv` per `block`; fp8-tensor: compressed-tensors'
    float-quantized format, one `weight_scale` per tensor.
    """
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = open_model_checkpoint(source)
    tensors: dict[str, torch.Tensor] = {}
    for name in checkpoint.tensor_names():
        weight = checkpoint.get(name)
        prefix = name.removesuffix(".weight")
        if not (name.endswith(".weight") and prefix.rsplit(".", 1)[-1] in _LINEAR):
            tensors[name] = weight.contiguous()
        elif scheme in ("gptq", "awq"):
            tensors.update(_int4_parts(prefix, weight, scheme, group_size, act_order, len(tensors)))
        else:
            tensors.update(_fp8_parts(prefix, weight, block if scheme == "fp8" else None))
    save_file(tensors, str(out / "model.safetensors"))
    config = dict(checkpoint.config)
    config["quantization_config"] = _quantization_config(scheme, group_size, act_order, block)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for extra in source.iterdir():
        if extra.is_file() and extra.name not in ("config.json", "model.safetensors"):
            shutil.copy(extra, out / extra.name)
    return out


def _int4_parts(prefix: str, weight: torch.Tensor, scheme: str, group_size: int, act_order: bool,
                seed: int) -> dict[str, torch.Tensor]:
    n_in = weight.shape[1]
    n_groups = n_in // group_size
    if act_order:  # groups of scattered columns, as GPTQ's activation order leaves them
        rank = torch.argsort(torch.randperm(n_in, generator=torch.Generator().manual_seed(seed)))
        group = rank // group_size
    else:
        group = torch.arange(n_in) // group_size
    q, zeros, scales = rtn_int4(weight, group, n_groups)
    if scheme == "gptq":
        parts = {"qweight": pack_int4(q.T, dim=0), "qzeros": pack_int4(zeros - 1, dim=1), "scales": scales}
        if act_order:
            parts["g_idx"] = group.to(torch.int32)
    else:
        parts = {"qweight": pack_int4(q.T.contiguous(), dim=1, order=AWQ_ORDER),
                 "qzeros": pack_int4(zeros, dim=1, order=AWQ_ORDER), "scales": scales}
    return {f"{prefix}.{k}": v.contiguous() for k, v in parts.items()}


def _fp8_parts(prefix: str, weight: torch.Tensor, block: tuple[int, int] | None) -> dict[str, torch.Tensor]:
    w = weight.float()
    if block is None:
        scale = (w.abs().amax() / FP8_MAX).clamp(min=1e-12)
        return {f"{prefix}.weight": (w / scale).to(torch.float8_e4m3fn), f"{prefix}.weight_scale": scale.reshape(1)}
    rows, cols = -(-w.shape[0] // block[0]), -(-w.shape[1] // block[1])
    scale = torch.empty(rows, cols)
    for r in range(rows):
        for c in range(cols):
            tile = w[r * block[0] : (r + 1) * block[0], c * block[1] : (c + 1) * block[1]]
            scale[r, c] = (tile.abs().amax() / FP8_MAX).clamp(min=1e-12)
    full = block_scales(scale, block, w.shape)
    return {f"{prefix}.weight": (w / full).to(torch.float8_e4m3fn), f"{prefix}.weight_scale_inv": scale}


def _quantization_config(scheme: str, group_size: int, act_order: bool, block: tuple[int, int] | None) -> dict:
    if scheme == "gptq":
        return {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": act_order, "sym": False,
                "checkpoint_format": "gptq"}
    if scheme == "awq":
        return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    if scheme == "fp8":
        return {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": list(block)}
    if scheme == "fp8-tensor":
        return {"quant_method": "compressed-tensors", "format": "float-quantized"}
    raise ValueError(f"unknown scheme {scheme!r}")
