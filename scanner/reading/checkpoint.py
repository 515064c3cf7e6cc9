"""Read-only, lazy access to a Hugging Face model folder's safetensors weights.

hubtrace reads checkpoints that strangers uploaded, so nothing here executes anything found in the folder: pickle
weights and remote code are refused, never loaded. Every safetensors header is parsed and checked by hand before
safetensors maps the file, so a truncated or lying file is refused with a one-line reason instead of crashing,
reading garbage or allocating what its header claims. Tensors are then read one at a time (or a few rows of one),
memory-mapped, in their stored dtype: fingerprinting a 70B model must not need 140 GB of RAM.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import torch
from safetensors import SafetensorError, safe_open
from transformers import CONFIG_MAPPING

from scanner.errors import CheckpointError, UnsafeCheckpointError
from scanner.files import NotRegularFileError, open_regular_file, stream_sha256
from scanner.reading.config_counts import check_config_counts

SINGLE_WEIGHTS = "model.safetensors"
SHARD_INDEX = "model.safetensors.index.json"
# Weights that only torch.load (i.e. unpickling, i.e. running code) could read.
PICKLE_WEIGHT_PATTERNS = ("pytorch_model.bin", "pytorch_model-*.bin", "*.pt", "*.pth", "*.ckpt")
# Files that define what the embedding rows mean; hashed together to tell "same tokenizer" cheaply.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json", "merges.txt", "vocab.txt"
)
# The safetensors library refuses larger headers too; a bigger claim is corruption or an attack.
MAX_HEADER_BYTES = 100 * 1024 * 1024
#: Largest JSON file hubtrace (or transformers, for the folder it loads) reads, by file name; checked before reading.
#: Real files are far below: a config is a few KB, DeepSeek-V3's shard index 9 MB, a 256k-token tokenizer.json 35 MB.
JSON_LIMITS = {"config.json": 4 << 20, SHARD_INDEX: 64 << 20, "tokenizer.json": 256 << 20}
DEFAULT_JSON_LIMIT = 16 << 20
_HASH_CHUNK = 8 << 20

_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "U16": torch.uint16,
    "I16": torch.int16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "U32": torch.uint32,
    "I32": torch.int32,
    "F32": torch.float32,
    "U64": torch.uint64,
    "I64": torch.int64,
    "F64": torch.float64,
}


@dataclass(frozen=True)
class _TensorEntry:
    """Where one tensor lives and what its (already validated) header says about it."""

    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int = 0  # absolute byte offset of the tensor's data in `file`
    nbytes: int = 0


class Checkpoint:
    """A validated model folder; tensors are read on demand, one at a time, memory-mapped.

    Obtain one with `open_checkpoint`. File handles are opened lazily and kept until `close()` (or the end of a
    `with` block), so reading many tensors of one shard maps it once.
    """

    def __init__(
        self, path: Path, config: dict[str, Any], entries: dict[str, _TensorEntry], notes: tuple[str, ...] = ()
    ) -> None:
        self.path = path
        self.config = config  # config.json as hubtrace uses it (an ignored auto_map removed)
        self.notes = notes  # what was accepted with a caveat, for results to repeat
        self._entries = entries
        self._handles: dict[Path, Any] = {}
        self.read_observer: Callable[[str, torch.Tensor], None] | None = None
        """Called with every tensor `get` reads, before it is returned (the one-pass value check of
        scanner.reading.validate); None: nobody watches."""

    def tensor_names(self) -> list[str]:
        """All stored tensor names, sorted."""
        return sorted(self._entries)

    def has(self, name: str) -> bool:
        return name in self._entries

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape from the header: costs no tensor read."""
        return self._entry(name).shape

    def dtype(self, name: str) -> str:
        """Stored dtype as torch names it without the prefix, e.g. "bfloat16"."""
        return str(self._entry(name).dtype).removeprefix("torch.")

    def get(self, name: str) -> torch.Tensor:
        """The whole tensor, in its stored dtype."""
        entry = self._entry(name)
        try:
            tensor = self._handle(entry.file).get_tensor(name)
        except SafetensorError as exc:
            raise CheckpointError(f"cannot read tensor {name} from {entry.file}: {exc}") from exc
        if self.read_observer is not None:
            self.read_observer(name, tensor)
        return tensor

    def get_rows(self, name: str, rows: Sequence[int] | slice) -> torch.Tensor:
        """Rows (indices along dim 0) of a tensor, in the order asked, reading only those rows.

        Consecutive ascending indices are read as one slice, so a block of token ids costs one read, not one per row.
        """
        entry = self._entry(name)
        if not entry.shape:
            raise IndexError(f"tensor {name} is a scalar and has no rows")
        n = entry.shape[0]
        wanted = list(range(*rows.indices(n))) if isinstance(rows, slice) else [int(r) for r in rows]
        bad = [r for r in wanted if not 0 <= r < n]
        if bad:
            raise IndexError(f"rows {bad[:5]} out of range for tensor {name} with {n} rows")
        try:
            view = self._handle(entry.file).get_slice(name)
            pieces = [view[start:stop] for start, stop in _runs(wanted)]
        except SafetensorError as exc:
            raise CheckpointError(f"cannot read rows of tensor {name} from {entry.file}: {exc}") from exc
        if not pieces:
            return torch.empty((0, *entry.shape[1:]), dtype=entry.dtype)
        return torch.cat(pieces)

    def tensor_sha256(self, name: str) -> str:
        """sha256 of a tensor's stored bytes, streamed from the file in chunks (never the whole tensor in memory).

        Equal hashes mean bit-identical stored tensors: an exact copy is found without comparing any statistic.
        """
        digest = hashlib.sha256()
        for chunk in self._stored_bytes(name, _HASH_CHUNK):
            digest.update(chunk)
        return digest.hexdigest()

    def tensor_chunks(self, name: str, max_bytes: int = 16 << 20) -> Iterator[torch.Tensor]:
        """The tensor's stored values, flattened, as consecutive 1-D chunks of at most `max_bytes` each.

        Read straight from the file into one reused buffer, so checking every value of a 2 GB embedding costs
        `max_bytes` of memory, not 2 GB. A chunk is valid only until the next one is produced.
        """
        entry = self._entry(name)
        itemsize = entry.dtype.itemsize
        for chunk in self._stored_bytes(name, max(itemsize, max_bytes - max_bytes % itemsize)):
            yield torch.frombuffer(chunk, dtype=entry.dtype)

    def _stored_bytes(self, name: str, chunk_bytes: int) -> Iterator[memoryview]:
        """A tensor's stored bytes in order, `chunk_bytes` at a time (the last may be shorter), in one reused buffer."""
        entry = self._entry(name)
        buffer = memoryview(bytearray(min(chunk_bytes, entry.nbytes)))
        try:
            with open(entry.file, "rb") as handle:
                handle.seek(entry.start)
                left = entry.nbytes
                while left:
                    view = buffer[: min(left, chunk_bytes)]
                    filled = 0
                    while filled < len(view):
                        got = handle.readinto(view[filled:])
                        if not got:
                            raise CheckpointError(f"{entry.file} ended inside tensor {name}")
                        filled += got
                    yield view
                    left -= filled
        except OSError as exc:
            raise CheckpointError(f"cannot read tensor {name} from {entry.file}: {exc.strerror or exc}") from exc

    def tokenizer_hash(self) -> str | None:
        """sha256 over the tokenizer files present (name and content of each), or None when there are none.

        Two checkpoints with equal hashes tokenize identically, so their embedding rows can be compared id by id.
        """
        digest, found = hashlib.sha256(), False
        for name in TOKENIZER_FILES:
            try:  # opened first, checked on the descriptor: a FIFO swapped in after a check cannot hang the read
                with open_regular_file(self.path / name) as handle:
                    content = stream_sha256(handle)
            except FileNotFoundError:
                continue
            except NotRegularFileError as exc:
                if exc.is_dir:
                    continue  # a folder of that name is no tokenizer file, as before
                raise CheckpointError(f"cannot read {self.path / name}: not a regular file (a FIFO, socket or "
                                      f"device), which hubtrace never opens") from exc
            except OSError as exc:
                raise CheckpointError(f"cannot read {self.path / name}: {exc.strerror or exc}") from exc
            digest.update(name.encode() + b"\0" + content.encode())
            found = True
        return digest.hexdigest() if found else None

    def tokenizer_base_vocab_size(self) -> int | None:
        """Entries in tokenizer.json's model vocab, without the added tokens listed beside it.

        Fine-tunes often append special tokens; the base vocab is what a derived model shares with its parent.
        None when there is no tokenizer.json or its model has no vocab. The JSON is parsed, never executed.
        """
        file = self.path / "tokenizer.json"
        if not file.is_file():
            return None
        data = read_json_file(file)
        model = data.get("model") if isinstance(data, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        # BPE/WordPiece/WordLevel store {token: id}; Unigram stores [[token, score], ...].
        return len(vocab) if isinstance(vocab, dict | list) else None

    def close(self) -> None:
        """Drops the memory maps; later reads reopen them."""
        self._handles.clear()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Checkpoint({str(self.path)!r}, {len(self._entries)} tensors)"

    def _entry(self, name: str) -> _TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise CheckpointError(f"{self.path} has no tensor {name!r}") from None

    def _handle(self, file: Path) -> Any:
        if file not in self._handles:
            try:
                self._handles[file] = safe_open(str(file), framework="pt")
            except (OSError, SafetensorError) as exc:
                raise CheckpointError(f"cannot open {file}: {exc}") from exc
        return self._handles[file]


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Validate a Hugging Face model folder and return lazy access to its weights.

    Raises CheckpointError (one line, naming the file) for anything missing, unreadable or inconsistent, and
    UnsafeCheckpointError when the folder could only be loaded by executing code from it.
    """
    folder = Path(path)
    try:
        mode = folder.stat().st_mode
    except OSError as exc:
        raise CheckpointError(f"cannot open checkpoint folder {folder}: {exc.strerror or exc}") from exc
    if not stat.S_ISDIR(mode):
        raise CheckpointError(f"checkpoint path {folder} is not a directory")
    config_file = folder / "config.json"
    if not os.path.lexists(config_file):
        raise CheckpointError(f"{folder} has no config.json, so it is not a Hugging Face model folder")
    config = read_json_file(config_file)
    if not isinstance(config, dict):
        raise CheckpointError(f"{config_file} must hold a JSON object, not {type(config).__name__}")
    check_config_names(config_file, config)
    notes = _remote_code_policy(config_file, config)
    entries = _weight_entries(folder)
    check_config_counts(config_file, config, (entry.shape for entry in entries.values()))
    return Checkpoint(folder, config, entries, notes)


def check_config_names(source: Path, config: dict[str, Any]) -> None:
    """The two fields that choose transformers classes must have their types: model_type a string, architectures a
    list of class names (a dict or a bare string is refused here, not indexed into later)."""
    model_type = config.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise CheckpointError(f"{source}: model_type must be a string, not {type(model_type).__name__}")
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        raise CheckpointError(f"{source}: architectures must be a list of class names, not "
                              f"{type(architectures).__name__}")


def _remote_code_policy(config_file: Path, config: dict[str, Any]) -> tuple[str, ...]:
    """Refuse a config that only remote code can read; for a built-in model_type drop auto_map and say so.

    auto_map names Python files in the folder that transformers imports only under trust_remote_code=True, which
    hubtrace never passes. When transformers ships the model_type, its own classes read the config and weights
    (the tests compare weights and what they compute, so the custom code is not needed); otherwise nothing can.
    """
    if "auto_map" not in config:
        return ()
    model_type = config.get("model_type")
    if not (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        raise UnsafeCheckpointError(
            f"{config_file}: model_type {model_type!r} is not built into transformers, so the model needs remote "
            "code (auto_map), which hubtrace never runs"
        )
    del config["auto_map"]
    return (
        f"config.json names remote code (auto_map); hubtrace did not run it and read the model with transformers' "
        f"built-in {model_type} classes",
    )


def _weight_entries(folder: Path) -> dict[str, _TensorEntry]:
    """Tensor name -> entry, from model.safetensors or the shard index (the same precedence as transformers)."""
    single = folder / SINGLE_WEIGHTS
    if os.path.lexists(single):
        return _read_header(single)
    index = folder / SHARD_INDEX
    if os.path.lexists(index):
        return _sharded_entries(folder, index)
    pickles = sorted({p.name for pattern in PICKLE_WEIGHT_PATTERNS for p in folder.glob(pattern)})
    if pickles:
        raise UnsafeCheckpointError(
            f"{folder} has only pickle weights ({', '.join(pickles)}); hubtrace never unpickles, "
            "convert them to safetensors first"
        )
    raise CheckpointError(f"{folder} has no weights: expected {SINGLE_WEIGHTS} or {SHARD_INDEX}")


def _sharded_entries(folder: Path, index: Path) -> dict[str, _TensorEntry]:
    data = read_json_file(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if (
        not isinstance(weight_map, dict)
        or not weight_map
        or not all(isinstance(shard, str) for shard in weight_map.values())
    ):
        raise CheckpointError(f"{index} has no weight_map naming tensors and their shard files")
    headers: dict[str, dict[str, _TensorEntry]] = {}
    for shard in sorted(set(weight_map.values())):
        # A shard name is a plain file name in this folder; anything else could read files elsewhere.
        if shard in ("", ".", "..") or Path(shard).name != shard:
            raise CheckpointError(f"{index} names shard {shard!r}, which is not a file name inside {folder}")
        if not os.path.lexists(folder / shard):
            raise CheckpointError(f"{index} names shard {shard}, which is missing from {folder}")
        headers[shard] = _read_header(folder / shard)
    entries = {}
    for name, shard in weight_map.items():
        if name not in headers[shard]:
            raise CheckpointError(f"{index} maps tensor {name} to {shard}, but that shard has no such tensor")
        entries[name] = headers[shard][name]
    return entries


def _read_header(file: Path) -> dict[str, _TensorEntry]:
    """Parse and check one safetensors header without trusting it: sizes, dtypes, offsets against the file."""
    try:
        with open_regular(file) as handle:
            size = os.fstat(handle.fileno()).st_size
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise CheckpointError(f"{file} has {size} bytes, too few to be a safetensors file")
            header_len = int.from_bytes(prefix, "little")
            if header_len > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{file}: header claims {header_len} bytes, over the {MAX_HEADER_BYTES} hubtrace accepts"
                )
            if 8 + header_len > size:
                raise CheckpointError(f"{file}: header claims {header_len} bytes but the file has only {size}")
            raw = handle.read(header_len)
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CheckpointError(f"{file}: safetensors header is not valid JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: safetensors header is not a JSON object")
    data_size = size - 8 - header_len
    entries: dict[str, _TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _parse_tensor_info(file, name, info)
        expected = dtype.itemsize * math.prod(shape)
        if end - begin != expected:
            raise CheckpointError(
                f"{file}: tensor {name} is {list(shape)} {info['dtype']} = {expected} bytes "
                f"but its data_offsets span {end - begin}"
            )
        if end > data_size:
            raise CheckpointError(
                f"{file} is truncated: tensor {name} ends at data byte {end} but the file holds only {data_size}"
            )
        entries[name] = _TensorEntry(file, dtype, shape, 8 + header_len + begin, end - begin)
        spans.append((begin, end, name))
    spans.sort()
    for (_, prev_end, prev_name), (begin, _, name) in zip(spans, spans[1:]):
        if begin < prev_end:
            raise CheckpointError(f"{file}: tensors {prev_name} and {name} overlap in the data section")
    return entries


def _parse_tensor_info(file: Path, name: str, info: Any) -> tuple[torch.dtype, tuple[int, ...], int, int]:
    if not isinstance(info, dict):
        raise CheckpointError(f"{file}: header entry for tensor {name} is not an object")
    stored_dtype = info.get("dtype")
    dtype = _DTYPES.get(stored_dtype) if isinstance(stored_dtype, str) else None
    if dtype is None:
        raise CheckpointError(f"{file}: tensor {name} has dtype {stored_dtype!r}, which hubtrace cannot read")
    shape = info.get("shape")
    offsets = info.get("data_offsets")
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise CheckpointError(f"{file}: tensor {name} has an invalid shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int for n in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointError(f"{file}: tensor {name} has invalid data_offsets {offsets!r}")
    return dtype, tuple(shape), offsets[0], offsets[1]


def json_limit(file: Path) -> int:
    """The size limit for a JSON file of this name (`JSON_LIMITS`, else `DEFAULT_JSON_LIMIT`)."""
    return JSON_LIMITS.get(file.name, DEFAULT_JSON_LIMIT)


def read_json_file(file: Path) -> Any:
    """A JSON file of the folder, parsed (never executed): a regular file within `json_limit`, checked before any
    byte is read, so a FIFO, a device or a huge sparse file is a one-line CheckpointError, not a hang or a
    MemoryError."""
    limit = json_limit(file)
    with open_regular(file) as handle:
        try:
            size = os.fstat(handle.fileno()).st_size
            text = handle.read(limit + 1) if size <= limit else b""
        except OSError as exc:
            raise CheckpointError(f"cannot read {file}: {exc.strerror or exc}") from exc
    if size > limit or len(text) > limit:
        raise CheckpointError(f"{file} is {max(size, len(text))} bytes, over the {limit}-byte limit for {file.name}")
    try:
        return json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: also a 5000-digit integer
        raise CheckpointError(f"{file} is not valid JSON: {' '.join(str(exc).split())}") from exc


def open_regular(file: Path) -> BinaryIO:
    """file opened for reading if it is a regular file (`open_regular_file`: checked on the open descriptor); a
    FIFO, socket or device is refused without blocking."""
    try:
        return open_regular_file(file)
    except NotRegularFileError as exc:
        raise CheckpointError(f"cannot read {file}: not a regular file (a folder, FIFO, socket or device), which "
                              f"hubtrace never opens") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read {file}: {exc.strerror or exc}") from exc


def _runs(rows: list[int]) -> list[tuple[int, int]]:
    """Split row indices into [start, stop) runs of consecutive ascending indices, keeping their order."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return runs
