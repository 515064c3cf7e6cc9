"""Quantized safetensors as the Hub serves them, dequantized on the fly, one tensor at a time.

A GPTQ, AWQ or FP8 checkpoint stores each linear layer as packed integers or float8 plus scales (and zero
points) instead of `{prefix}.weight`. `dequantizing` wraps such a checkpoint so that every reader sees the usual
`{prefix}.weight` in float32 (out, in), computed from the stored parts only when that tensor is read, and the
parts themselves disappear from the tensor list. Schemes hubtrace does not implement are refused by name, never
read as if they were float weights.

Layouts (what the tools that write these files produce):
* GPTQ, 4 bits: `qweight` int32 (in/8, out), eight 4-bit values per int32 along the input dim, lowest bits
  first; `qzeros` int32 (groups, out/8) packed the same way along the output dim; `scales` (groups, out);
  optional `g_idx` (in,) the group of each input column (act-order). W[o, i] = scale[g, o] * (q[i, o] - z[g, o]),
  where the classic format ("gptq", AutoGPTQ's) stores z - 1 and "gptq_v2" stores z.
* AWQ (GEMM), 4 bits: `qweight` int32 (in, out/8) and `qzeros` (groups, out/8), packed along the output dim in
  AWQ's interleaved nibble order (0, 2, 4, 6, 1, 3, 5, 7); `scales` (groups, out); groups of consecutive inputs.
* FP8: `weight` float8_e4m3fn with `weight_scale_inv` per block (`weight_block_size`, e.g. 128 x 128, as
  DeepSeek-V3 and Qwen3 FP8 store it) or `weight_scale` per tensor or per output channel (compressed-tensors'
  float-quantized format). W = float(weight) * scale.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from scanner.errors import CheckpointError
from scanner.reading.checkpoint import Checkpoint, _TensorEntry

#: Nibble j of an AWQ int32 holds output column AWQ_ORDER[j] of its group of eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
_FP8_SCALES = ("weight_scale_inv", "weight_scale")
#: Companions of FP8 weights that describe activations or the KV cache, not the weights.
_FP8_IGNORED = ("input_scale", "k_scale", "v_scale", "output_scale")


class DequantizedCheckpoint(Checkpoint):
    """A quantized checkpoint seen as float: `{prefix}.weight` float32, computed from its parts when read."""

    def __init__(self, base: Checkpoint, scheme: str, weights: dict[str, Callable[[], torch.Tensor]],
                 shapes: dict[str, tuple[int, ...]], hidden: set[str]) -> None:
        entries = {n: base._entries[n] for n in base.tensor_names() if n not in hidden}
        for name, shape in shapes.items():
            entries[name] = _TensorEntry(base.path, torch.float32, shape)
        config = {k: v for k, v in base.config.items() if k != "quantization_config"}
        note = f"{scheme} weights dequantized to float32 as they were read"
        super().__init__(base.path, config, entries, (*base.notes, note))
        self.scheme = scheme
        self._base = base
        self._weights = weights

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        return self._weights[name]() if name in self._weights else self._base.get(name)

    def get_rows(self, name: str, rows: Sequence[int] | slice) -> torch.Tensor:
        if name not in self._weights:
            return self._base.get_rows(name, rows)
        full = self.get(name)
        wanted = list(range(*rows.indices(full.shape[0]))) if isinstance(rows, slice) else [int(r) for r in rows]
        bad = [r for r in wanted if not 0 <= r < full.shape[0]]
        if bad:
            raise IndexError(f"rows {bad[:5]} out of range for tensor {name} with {full.shape[0]} rows")
        return full[wanted]

    def _stored_bytes(self, name: str, chunk_bytes: int) -> Iterator[memoryview]:
        """Dequantized float32 values for a quantized weight (one tensor in memory), stored bytes otherwise."""
        if name not in self._weights:
            yield from self._base._stored_bytes(name, chunk_bytes)
            return
        flat = memoryview(self.get(name).contiguous().numpy()).cast("B")
        for start in range(0, len(flat), chunk_bytes):
            yield flat[start : start + chunk_bytes]

    def close(self) -> None:
        self._base.close()
        super().close()


def dequantizing(checkpoint: Checkpoint) -> Checkpoint:
    """The checkpoint itself when config.json has no quantization_config; otherwise a dequantizing view of it.

    Raises CheckpointError naming the scheme for quantization methods hubtrace does not read.
    """
    qconfig = checkpoint.config.get("quantization_config")
    if qconfig is None:
        return checkpoint
    if not isinstance(qconfig, dict):
        raise CheckpointError(f"{checkpoint.path}: quantization_config in config.json is not an object")
    method = str(qconfig.get("quant_method", "unknown")).lower()
    if method in ("gptq", "awq"):
        return _packed_int4(checkpoint, method, qconfig)
    if method == "fp8" or (method == "compressed-tensors" and qconfig.get("format") == "float-quantized"):
        return _fp8(checkpoint, method, qconfig)
    detail = f" (format {qconfig.get('format')!r})" if method == "compressed-tensors" else ""
    raise CheckpointError(
        f"{checkpoint.path}: quantization scheme {method!r}{detail} is not supported; hubtrace dequantizes GPTQ and "
        "AWQ (4-bit) and FP8 (float8_e4m3fn with weight_scale or weight_scale_inv)"
    )


def _packed_int4(checkpoint: Checkpoint, method: str, qconfig: dict[str, Any]) -> DequantizedCheckpoint:
    bits = qconfig.get("bits", qconfig.get("w_bit"))
    if bits != 4:
        raise CheckpointError(f"{checkpoint.path}: {method} with {bits} bits is not supported (4-bit only)")
    if method == "awq" and str(qconfig.get("version", "gemm")).lower() != "gemm":
        raise CheckpointError(f"{checkpoint.path}: AWQ version {qconfig.get('version')!r} is not supported (GEMM only)")
    zero_offset = 1 if method == "gptq" and qconfig.get("checkpoint_format", "gptq") == "gptq" else 0
    prefixes = [n.removesuffix(".qweight") for n in checkpoint.tensor_names() if n.endswith(".qweight")]
    if not prefixes:
        raise CheckpointError(f"{checkpoint.path}: config.json declares {method} but no tensor is a .qweight")
    weights, shapes, hidden = {}, {}, set()
    for prefix in prefixes:
        parts = {p: f"{prefix}.{p}" for p in _GPTQ_PARTS if checkpoint.has(f"{prefix}.{p}")}
        missing = {"qweight", "qzeros", "scales"} - set(parts)
        if missing:
            raise CheckpointError(f"{checkpoint.path}: {prefix} has a qweight but no {', '.join(sorted(missing))}")
        shape = _packed_shape(checkpoint, method, parts, prefix)
        read = _gptq_reader if method == "gptq" else _awq_reader
        weights[f"{prefix}.weight"] = read(checkpoint, parts, zero_offset)
        shapes[f"{prefix}.weight"] = shape
        hidden.update(parts.values())
    return DequantizedCheckpoint(checkpoint, f"{method.upper()} 4-bit", weights, shapes, hidden)


def _packed_shape(checkpoint: Checkpoint, method: str, parts: dict[str, str], prefix: str) -> tuple[int, int]:
    """(out, in) from the headers, after checking that qweight, qzeros and scales agree."""
    packed, zeros, scales = (checkpoint.shape(parts[p]) for p in ("qweight", "qzeros", "scales"))
    if len(packed) != 2 or len(zeros) != 2 or len(scales) != 2:
        raise CheckpointError(f"{checkpoint.path}: {prefix} quantized parts are not matrices")
    n_out, n_in = (packed[1], packed[0] * 8) if method == "gptq" else (packed[1] * 8, packed[0])
    if scales[1] != n_out or zeros != (scales[0], n_out // 8) or scales[0] < 1 or n_in % scales[0]:
        raise CheckpointError(
            f"{checkpoint.path}: {prefix} qweight {list(packed)}, qzeros {list(zeros)} and scales {list(scales)} "
            f"do not describe one {method} layer"
        )
    if "g_idx" in parts and checkpoint.shape(parts["g_idx"]) != (n_in,):
        raise CheckpointError(f"{checkpoint.path}: {prefix}.g_idx has shape {list(checkpoint.shape(parts['g_idx']))}")
    return n_out, n_in


def unpack_int4(packed: torch.Tensor, dim: int, order: Sequence[int] = tuple(range(8))) -> torch.Tensor:
    """Eight 4-bit values out of each int32 along `dim` (nibble j, lowest first, is element order[j])."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    nibbles = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & 0xF  # (..., 8) in nibble order
    nibbles = nibbles[..., torch.argsort(torch.tensor(order))]  # element order within each group of eight
    moved = nibbles.movedim(-1, dim + 1) if dim == 0 else nibbles
    shape = list(packed.shape)
    shape[dim] *= 8
    return moved.reshape(shape)


def pack_int4(values: torch.Tensor, dim: int, order: Sequence[int] = tuple(range(8))) -> torch.Tensor:
    """The inverse of `unpack_int4`: values in 0..15, eight per int32 along `dim`."""
    if dim == 0:
        grouped = values.reshape(values.shape[0] // 8, 8, *values.shape[1:]).movedim(1, -1)
    else:
        grouped = values.reshape(*values.shape[:-1], values.shape[-1] // 8, 8)
    grouped = grouped[..., list(order)].to(torch.int64)
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    packed = (grouped << shifts).sum(-1)
    return (packed - ((packed >> 31) << 32)).to(torch.int32)  # the same 32 bits, as a signed int32


def _gptq_reader(checkpoint: Checkpoint, parts: dict[str, str], zero_offset: int) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        q = unpack_int4(checkpoint.get(parts["qweight"]), dim=0).float()  # (in, out)
        zeros = unpack_int4(checkpoint.get(parts["qzeros"]), dim=1).float() + zero_offset  # (groups, out)
        scales = checkpoint.get(parts["scales"]).float()
        n_in, groups = q.shape[0], scales.shape[0]
        if "g_idx" in parts:
            group = checkpoint.get(parts["g_idx"]).long()
            if group.numel() and (group.min() < 0 or group.max() >= groups):
                raise CheckpointError(f"{checkpoint.path}: {parts['g_idx']} names groups outside 0..{groups - 1}")
        else:
            group = torch.arange(n_in) // (n_in // groups)
        return ((q - zeros[group]) * scales[group]).T.contiguous()

    return read


def _awq_reader(checkpoint: Checkpoint, parts: dict[str, str], _zero_offset: int) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        q = unpack_int4(checkpoint.get(parts["qweight"]), dim=1, order=AWQ_ORDER).float()  # (in, out)
        zeros = unpack_int4(checkpoint.get(parts["qzeros"]), dim=1, order=AWQ_ORDER).float()
        scales = checkpoint.get(parts["scales"]).float()
        group = torch.arange(q.shape[0]) // (q.shape[0] // scales.shape[0])
        return ((q - zeros[group]) * scales[group]).T.contiguous()

    return read


def _fp8(checkpoint: Checkpoint, method: str, qconfig: dict[str, Any]) -> DequantizedCheckpoint:
    block = qconfig.get("weight_block_size")
    weights, shapes, hidden = {}, {}, set()
    for name in checkpoint.tensor_names():
        prefix, _, leaf = name.rpartition(".")
        if leaf in _FP8_IGNORED:
            hidden.add(name)
        if leaf != "weight" or checkpoint.dtype(name) not in ("float8_e4m3fn", "float8_e5m2"):
            continue
        scale = next((f"{prefix}.{s}" for s in _FP8_SCALES if checkpoint.has(f"{prefix}.{s}")), None)
        if scale is None:
            raise CheckpointError(f"{checkpoint.path}: FP8 tensor {name} has no weight_scale or weight_scale_inv")
        shape = checkpoint.shape(name)
        _check_fp8_scale(checkpoint, name, scale, block)
        weights[name] = _fp8_reader(checkpoint, name, scale, block)
        shapes[name] = shape
        hidden.update({name, scale})
    if not weights:
        raise CheckpointError(f"{checkpoint.path}: config.json declares {method} but no weight is stored as float8")
    return DequantizedCheckpoint(checkpoint, "FP8", weights, shapes, hidden)


def _check_fp8_scale(checkpoint: Checkpoint, name: str, scale: str, block: Any) -> None:
    """A scale must be one value, one per output row, or one per block of the weight; nothing else is read."""
    out_in, found = checkpoint.shape(name), checkpoint.shape(scale)
    if len(out_in) != 2:
        raise CheckpointError(f"{checkpoint.path}: FP8 tensor {name} has shape {list(out_in)}, not a matrix")
    allowed = [(), (1,), (1, 1), (out_in[0],), (out_in[0], 1)]
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        allowed.append((-(-out_in[0] // block[0]), -(-out_in[1] // block[1])))
    if tuple(found) not in allowed:
        raise CheckpointError(
            f"{checkpoint.path}: FP8 scale {scale} has shape {list(found)}, which fits neither a tensor, a row nor a "
            f"block scale of {name} {list(out_in)} (weight_block_size {block!r})"
        )


def _fp8_reader(checkpoint: Checkpoint, name: str, scale_name: str, block: Any) -> Callable[[], torch.Tensor]:
    def read() -> torch.Tensor:
        weight = checkpoint.get(name).float()
        scale = checkpoint.get(scale_name).float()
        if scale.dim() == 2 and scale.shape[1] > 1:  # per block
            scale = block_scales(scale, block, weight.shape)
        elif scale.dim() == 1 and scale.numel() > 1:
            scale = scale[:, None]
        return weight * scale

    return read


def block_scales(scale: torch.Tensor, block: Sequence[int], shape: Sequence[int]) -> torch.Tensor:
    """Per-block scales (ceil(out / b0), ceil(in / b1)) spread over a weight of ``shape``: entry (i, j) is the scale
    of the block holding weight (i, j). Indexed, so it is the weight's size whatever the block says (a
    weight_block_size larger than the weight once asked for gigabytes of repeats)."""
    rows = torch.arange(shape[0]) // block[0]
    cols = torch.arange(shape[1]) // block[1]
    return scale[rows][:, cols]
