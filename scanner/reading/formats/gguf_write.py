"""Write any checkpoint hubtrace reads as a GGUF file, the way llama.cpp's converter lays it out.

Investigators meet re-quantized and re-exported copies of models; the tests and benches build them with this
(GGUF round trips, Q8_0/Q4_0 copies of a float model). Tensors go through the `gguf` package's writer and
quantizers, one tensor in memory at a time before quantization; query and key rows are reordered for llama.cpp's
rotary layout exactly as its converter does, so reading the file back exercises the inverse.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

from scanner.errors import CheckpointError
from scanner.reading.checkpoint import Checkpoint
from scanner.reading.formats.gguf import ARCHITECTURES, BLOCK_NAMES, GLOBAL_NAMES, ROTARY_PERMUTED, GGUFCheckpoint

_GGUF_OF_GLOBAL = {hf: gguf for gguf, hf in GLOBAL_NAMES.items()}
_GGUF_OF_BLOCK = {hf: gguf for gguf, hf in BLOCK_NAMES.items()}
#: Types the `gguf` package can quantize to (the K-quants it can only read).
WRITABLE = (
    GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16, GGMLQuantizationType.Q8_0,
    GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1,
)


def write_gguf(checkpoint: Checkpoint, out: str | Path, qtype: GGMLQuantizationType) -> Path:
    """`checkpoint` as a GGUF file: matrices in `qtype` (F32 where rows are not whole blocks), vectors in F32.

    A GGUF source passes its tokenizer metadata on; a safetensors source gets none (hubtrace reads ids alone).
    """
    if qtype not in WRITABLE:
        raise ValueError(f"cannot write {qtype.name}; writable types: {', '.join(t.name for t in WRITABLE)}")
    config = checkpoint.config
    model_type = config.get("model_type")
    arch = next((a for a, t in ARCHITECTURES.items() if t == model_type), None)
    if arch is None:
        raise CheckpointError(f"{checkpoint.path}: no GGUF export for model_type {model_type!r}")
    path = Path(out)
    writer = GGUFWriter(path, arch, use_temp_file=True)
    _write_config(writer, arch, config)
    if isinstance(checkpoint, GGUFCheckpoint):
        _copy_tokenizer(writer, checkpoint)
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config.get("num_key_value_heads")}
    for name in checkpoint.tensor_names():
        values = checkpoint.get(name).float().numpy()
        module = name.rsplit(".", 2)[-2]
        if arch in ROTARY_PERMUTED and module in heads:
            n_heads = heads[module] or heads["q_proj"]
            half = values.shape[0] // n_heads // 2
            values = values.reshape(n_heads, 2, half, -1).swapaxes(1, 2).reshape(values.shape)
        block_size, _ = GGML_QUANT_SIZES[qtype]
        kind = qtype if values.ndim == 2 and values.shape[1] % block_size == 0 else GGMLQuantizationType.F32
        data = quantize(np.ascontiguousarray(values), kind)
        writer.add_tensor(_gguf_name(name, checkpoint), data, raw_dtype=kind)
        del values, data
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _write_config(writer: GGUFWriter, arch: str, config: dict) -> None:
    """Config values under llama.cpp's keys (transformers' GGUF table read backwards)."""
    values = dict(config)
    values.setdefault("head_dim", config["hidden_size"] // config["num_attention_heads"])
    for key, hf_key in GGUF_CONFIG_MAPPING[ARCHITECTURES[arch]].items():
        value = values.get(hf_key) if hf_key else None
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            writer.add_uint32(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)


def _copy_tokenizer(writer: GGUFWriter, source: GGUFCheckpoint) -> None:
    metadata = source.metadata
    if isinstance(metadata.get("tokenizer.ggml.model"), str):
        writer.add_tokenizer_model(metadata["tokenizer.ggml.model"])
    if isinstance(metadata.get("tokenizer.ggml.pre"), str):
        writer.add_tokenizer_pre(metadata["tokenizer.ggml.pre"])
    if isinstance(metadata.get("tokenizer.ggml.tokens"), list):
        writer.add_token_list(metadata["tokenizer.ggml.tokens"])
    if isinstance(metadata.get("tokenizer.ggml.token_type"), np.ndarray):
        writer.add_token_types(metadata["tokenizer.ggml.token_type"].tolist())
    if isinstance(metadata.get("tokenizer.ggml.merges"), list):
        writer.add_token_merges(metadata["tokenizer.ggml.merges"])


def _gguf_name(name: str, checkpoint: Checkpoint) -> str:
    stem, _, suffix = name.rpartition(".")
    if stem in _GGUF_OF_GLOBAL:
        return f"{_GGUF_OF_GLOBAL[stem]}.{suffix}"
    parts = stem.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _GGUF_OF_BLOCK:
        return f"blk.{int(parts[2])}.{_GGUF_OF_BLOCK[parts[3]]}.{suffix}"
    raise CheckpointError(f"{checkpoint.path}: tensor {name} has no GGUF name")
