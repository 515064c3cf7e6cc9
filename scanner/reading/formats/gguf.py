"""A GGUF file (llama.cpp) as a hubtrace checkpoint: Hugging Face tensor names, float32 values, a config.

Everything downstream (adapters, streaming, fingerprints, `hubtrace test`) reads checkpoints through
`scanner.reading.checkpoint.Checkpoint`, by Hugging Face names in PyTorch layout. A GGUF file stores the same weights
under llama.cpp names (`blk.3.ffn_gate.weight`), quantized in blocks (Q4_0 ... Q8_0, K-quants, F16, BF16), with
the query and key rows of Llama models reordered for llama.cpp's rotary layout and the config and tokenizer in
its metadata. This module undoes all of that lazily: a tensor is dequantized (by the `gguf` package) only when
it is read, rows alone when only rows are asked for, so peak memory stays one tensor in float32.

Values are presented as float32 (what a dequantized weight is), so `tensor_sha256` hashes those values: two GGUF
files with identical weights hash alike whatever their quantization blocks' padding.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

from scanner.errors import CheckpointError, UnsupportedArchitectureError
from scanner.reading.checkpoint import Checkpoint, _TensorEntry, open_regular
from scanner.reading.config_counts import check_config_counts
from scanner.reading.formats.gguf_file import GGUFContents, GGUFTensor, read_gguf_layout

GGUF_SUFFIX = ".gguf"
#: llama.cpp architectures read here, as the transformers model_type they are. llama.cpp's converter writes
#: Mistral models as "llama" too. Others (Gemma's shifted norms, fused Phi-3 tensors, MoE expert stacks) would need
#: their own value fixes and are refused by name rather than read wrongly.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
#: A block number as llama.cpp writes it: ASCII decimal, no leading zero ("blk.01." or "blk.²." name no block; a
#: second spelling of one block would otherwise load as that block, the later tensor winning).
BLOCK_INDEX = re.compile(r"0|[1-9][0-9]*")

#: Architectures whose converter reorders query/key rows (`permute` in llama.cpp's convert_hf_to_gguf.py).
ROTARY_PERMUTED = {"llama"}
GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
#: Tensors llama.cpp stores that transformers computes from the config (rotary frequency factors).
_DERIVED = {"rope_freqs.weight"}


class GGUFCheckpoint(Checkpoint):
    """A validated GGUF file; `path` is the file. Tensors come back dequantized, float32, Hugging Face named."""

    def __init__(self, file: Path, contents: GGUFContents, config: dict[str, Any], notes: tuple[str, ...]) -> None:
        heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
        self._sources: dict[str, tuple[GGUFTensor, np.ndarray | None]] = {}
        ignored = []
        for tensor in contents.tensors.values():
            hf_name = _hf_name(tensor.name)
            if hf_name is None:
                ignored.append(tensor.name)
                continue
            order = None
            if config["model_type"] in ROTARY_PERMUTED and hf_name.rsplit(".", 2)[-2] in heads:
                order = _unpermuted_rows(tensor, heads[hf_name.rsplit(".", 2)[-2]], file)
            self._sources[hf_name] = (tensor, order)
        unknown = sorted(set(ignored) - _DERIVED)
        if unknown:
            raise CheckpointError(
                f"{file}: GGUF tensors {unknown[:3]} have no Hugging Face counterpart hubtrace knows "
                f"({len(unknown)} in all)"
            )
        entries = {
            name: _TensorEntry(file, torch.float32, tensor.shape, tensor.start, 4 * int(np.prod(tensor.shape)))
            for name, (tensor, _) in self._sources.items()
        }
        super().__init__(file, config, entries, notes)
        self.quantization = sorted({t.qtype.name for t, _ in self._sources.values()})
        self._contents = contents
        self._memmap: np.memmap | None = None

    @property
    def metadata(self) -> dict[str, Any]:
        """The file's metadata as parsed (string arrays decoded): data, never interpreted."""
        return self._contents.metadata

    def get(self, name: str) -> torch.Tensor:
        tensor, order = self._source(name)
        return self._dequantized(tensor, slice(None) if order is None else order)

    def get_rows(self, name: str, rows: Sequence[int] | slice) -> torch.Tensor:
        tensor, order = self._source(name)
        n = tensor.shape[0]
        wanted = np.arange(n)[rows] if isinstance(rows, slice) else np.asarray([int(r) for r in rows], dtype=np.int64)
        bad = wanted[(wanted < 0) | (wanted >= n)]
        if bad.size:
            raise IndexError(f"rows {bad[:5].tolist()} out of range for tensor {name} with {n} rows")
        return self._dequantized(tensor, wanted if order is None else order[wanted])

    def _stored_bytes(self, name: str, chunk_bytes: int) -> Iterator[memoryview]:
        """The dequantized float32 values, a whole number of rows at a time (at least one row per chunk)."""
        tensor, order = self._source(name)
        if len(tensor.shape) == 1:
            yield memoryview(self._dequantized(tensor, slice(None)).numpy()).cast("B")
            return
        per_chunk = max(1, chunk_bytes // (4 * tensor.dims[0]))
        for start in range(0, tensor.n_rows, per_chunk):
            picked = np.arange(start, min(tensor.n_rows, start + per_chunk))
            values = self._dequantized(tensor, picked if order is None else order[picked])
            yield memoryview(values.numpy()).cast("B")

    def tokenizer_hash(self) -> str | None:
        """sha256 over the stored tokenizer.* metadata entries (key, type and value bytes as in the file)."""
        keys = sorted(k for k in self._contents.spans if k.startswith("tokenizer."))
        if not keys:
            return None
        digest = hashlib.sha256()
        with open_regular(self.path) as handle:  # checked on the descriptor: a FIFO swapped in cannot hang it
            for key in keys:
                start, end = self._contents.spans[key]
                handle.seek(start)
                digest.update(handle.read(end - start))
        return digest.hexdigest()

    def tokenizer_base_vocab_size(self) -> int | None:
        """The tokens the GGUF vocabulary marks as ordinary (type 1, NORMAL) or bytes (type 6), when it says."""
        types = self._contents.metadata.get("tokenizer.ggml.token_type")
        if not isinstance(types, np.ndarray) or types.size == 0 or types.dtype.kind not in "iu":
            return None
        return int(np.isin(types, (1, 6)).sum())

    def close(self) -> None:
        self._memmap = None
        super().close()

    def _source(self, name: str) -> tuple[GGUFTensor, np.ndarray | None]:
        self._entry(name)  # the one-line error for an unknown name
        return self._sources[name]

    def _dequantized(self, tensor: GGUFTensor, rows: slice | np.ndarray) -> torch.Tensor:
        """float32 rows of a tensor (PyTorch layout), dequantizing only the rows asked for."""
        if self._memmap is None:
            self._memmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        raw = self._memmap[tensor.start : tensor.start + tensor.nbytes]
        if len(tensor.shape) == 1:
            values = dequantize(raw.reshape(1, -1), tensor.qtype).reshape(-1)
            return torch.from_numpy(np.array(values[rows], dtype=np.float32))
        matrix = raw.reshape(tensor.n_rows, tensor.row_bytes)
        values = dequantize(np.ascontiguousarray(matrix[rows]), tensor.qtype)
        return torch.from_numpy(np.array(values, dtype=np.float32).reshape(-1, *tensor.shape[1:]))


def open_gguf(file: str | Path) -> GGUFCheckpoint:
    """Validate a GGUF file (header, metadata, tensor table against the file) and return lazy access to it."""
    path = Path(file)
    contents = read_gguf_layout(path)
    architecture = contents.metadata.get("general.architecture")
    if not isinstance(architecture, str) or architecture not in ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path}: GGUF architecture {architecture!r} is not supported; "
            f"supported: {', '.join(sorted(ARCHITECTURES))}"
        )
    for qtype in sorted({t.qtype for t in contents.tensors.values()}):
        _check_dequantizable(qtype, path)
    config = gguf_config(contents, path)
    check_config_counts(path, config, (t.shape for t in contents.tensors.values()))
    notes = (f"read from GGUF ({', '.join(sorted({t.qtype.name for t in contents.tensors.values()}))}), "
             "dequantized to float32",)
    return GGUFCheckpoint(path, contents, config, notes)


def gguf_config(contents: GGUFContents, file: Path) -> dict[str, Any]:
    """A config.json-like dict from GGUF metadata, through transformers' own GGUF key table for the family."""
    architecture = contents.metadata["general.architecture"]
    model_type = ARCHITECTURES[architecture]
    config: dict[str, Any] = {"model_type": model_type}
    for key, hf_key in GGUF_CONFIG_MAPPING[model_type].items():
        value = contents.metadata.get(f"{architecture}.{key}")
        if hf_key is not None and value is not None:
            config[hf_key] = value
    if "vocab_size" not in config and isinstance(contents.metadata.get("tokenizer.ggml.tokens"), list):
        config["vocab_size"] = len(contents.metadata["tokenizer.ggml.tokens"])
    config["tie_word_embeddings"] = "output.weight" not in contents.tensors
    missing = [k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size") if k not in config]
    if missing:
        raise CheckpointError(f"{file}: GGUF metadata lacks {', '.join(missing)} for {architecture}")
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    for key in ("num_attention_heads", "num_key_value_heads", "num_hidden_layers", "hidden_size"):
        if not isinstance(config[key], int) or config[key] < 1:
            raise CheckpointError(f"{file}: GGUF metadata gives {key} = {config[key]!r}, not a positive integer")
    return config


def _hf_name(gguf_name: str) -> str | None:
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in ("weight", "bias"):
        return None
    if stem in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[stem]}.{suffix}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and BLOCK_INDEX.fullmatch(parts[1]) and parts[2] in BLOCK_NAMES:
        return f"model.layers.{int(parts[1])}.{BLOCK_NAMES[parts[2]]}.{suffix}"
    return None


def _unpermuted_rows(tensor: GGUFTensor, n_heads: int, file: Path) -> np.ndarray:
    """For each Hugging Face row, the GGUF row that holds it.

    llama.cpp's converter views each head's rows as (2, head_dim/2) and transposes them to (head_dim/2, 2),
    interleaving the two rotary halves; this is the inverse index of that reordering.
    """
    n = tensor.shape[0]
    if n % (2 * n_heads):
        raise CheckpointError(f"{file}: tensor {tensor.name} has {n} rows, not 2 x {n_heads} heads of whole rows")
    hf_of_gguf = np.arange(n).reshape(n_heads, 2, n // n_heads // 2).swapaxes(1, 2).reshape(-1)
    return np.argsort(hf_of_gguf)


def _check_dequantizable(qtype: GGMLQuantizationType, file: Path) -> None:
    _, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
    except NotImplementedError:
        raise CheckpointError(f"{file}: GGUF tensors of type {qtype.name} cannot be dequantized by hubtrace") from None


