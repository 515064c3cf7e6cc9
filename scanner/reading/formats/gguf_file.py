"""A bounded parser of the GGUF container (llama.cpp's format): header, metadata and tensor table, all checked.

The `gguf` package's reader trusts the file: a hostile count in the header makes it loop for hours or index past
the end, and on a real 135M model it spends ~10 s building a numpy view per metadata element. This parser walks
the same layout with `struct` over a memory map, refuses any count or length the rest of the file cannot hold,
and checks every tensor's type, dims, alignment and extent against the file before anything is read. Tensor data
is left in place; `scanner.reading.formats.gguf` dequantizes it on demand with the `gguf` package.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType

from scanner.errors import CheckpointError

#: GGUF versions with 64-bit counts (version 1 used 32-bit counts and is long gone from the hubs).
SUPPORTED_VERSIONS = (2, 3)
#: ggml tensors have at most four dims.
MAX_DIMS = 4
#: Longest key or tensor name accepted (ggml itself allows 64-byte tensor names).
MAX_NAME_BYTES = 1 << 12

_SCALARS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<?"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


@dataclass(frozen=True)
class GGUFTensor:
    """One tensor of the table: ggml dims (innermost first), its type and where its bytes are in the file."""

    name: str
    qtype: GGMLQuantizationType
    dims: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """PyTorch order: (out, in) for a matrix."""
        return tuple(reversed(self.dims))

    @property
    def row_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        return self.dims[0] // block_size * type_size

    @property
    def n_rows(self) -> int:
        return math.prod(self.dims[1:])


@dataclass(frozen=True)
class GGUFContents:
    """What the file says: metadata (string arrays decoded, numbers as Python values), tensors by GGUF name, and
    the byte span of every metadata entry (for hashing the tokenizer exactly as stored)."""

    version: int
    metadata: dict[str, Any]
    spans: dict[str, tuple[int, int]]
    tensors: dict[str, GGUFTensor]


def read_gguf_layout(file: Path) -> GGUFContents:
    """Parse and check a GGUF file's header, metadata and tensor table; CheckpointError (one line) if anything
    is malformed, truncated or claims more than the file holds."""
    try:
        with open(file, "rb") as handle:
            size = handle.seek(0, 2)
            if size < 24:
                raise CheckpointError(f"{file} has {size} bytes, too few to be a GGUF file")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _Parser(file, data).parse()
    except OSError as exc:
        raise CheckpointError(f"cannot read GGUF file {file}: {exc.strerror or exc}") from exc


def is_gguf_file(file: Path) -> bool:
    """True when the file starts with the GGUF magic (the name alone proves nothing)."""
    try:
        with open(file, "rb") as handle:
            return handle.read(4) == _U32.pack(GGUF_MAGIC)
    except OSError:
        return False


class _Parser:
    def __init__(self, file: Path, data: mmap.mmap) -> None:
        self.file, self.data, self.pos = file, data, 0

    def fail(self, what: str) -> CheckpointError:
        return CheckpointError(f"{self.file}: not a readable GGUF file: {what}")

    def take(self, n: int, what: str) -> bytes:
        if n > len(self.data) - self.pos:
            raise self.fail(f"{what} needs {n} bytes at offset {self.pos}, past the end of the file ({len(self.data)})")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct, what: str) -> Any:
        return fmt.unpack(self.take(fmt.size, what))[0]

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count that the bytes left could possibly hold (each item takes at least min_item_bytes)."""
        n = self.unpack(_U64, what)
        if n * min_item_bytes > len(self.data) - self.pos:
            raise self.fail(f"{what} is {n}, more than the {len(self.data) - self.pos} bytes left can hold")
        return n

    def string(self, what: str, limit: int | None = None) -> bytes:
        n = self.count(f"length of {what}", 1)
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit} accepted)")
        return self.take(n, what)

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.unpack(_U32, what)
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise self.fail(f"{what} has unknown value type {raw}") from None

    def value(self, kind: GGUFValueType, key: str) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], f"value of {key}")
        if kind == GGUFValueType.STRING:
            return self.string(f"value of {key}").decode("utf-8", errors="replace")
        item = self.value_type(f"array type of {key}")
        if item == GGUFValueType.ARRAY:
            raise self.fail(f"{key} is an array of arrays, which no llama.cpp model uses")
        item_bytes = _SCALARS[item].size if item in _SCALARS else 8
        n = self.count(f"length of array {key}", item_bytes)
        if item in _SCALARS:  # a numpy array: one byte of memory per byte of file (a list of ints took ~45)
            raw = self.take(n * item_bytes, f"array {key}")
            return np.frombuffer(raw, dtype=np.dtype(_SCALARS[item].format)).copy()
        return [self.string(f"element of {key}").decode("utf-8", errors="replace") for _ in range(n)]

    def parse(self) -> GGUFContents:
        if self.unpack(_U32, "magic") != GGUF_MAGIC:
            raise self.fail("no GGUF magic at the start")
        version = self.unpack(_U32, "version")
        if version not in SUPPORTED_VERSIONS:
            raise self.fail(f"GGUF version {version}, hubtrace reads versions {SUPPORTED_VERSIONS}")
        n_tensors = self.unpack(_U64, "tensor count")
        n_kv = self.count("metadata count", 8 + 4 + 1)  # each entry: key length, value type, a value byte at least
        metadata: dict[str, Any] = {}
        spans: dict[str, tuple[int, int]] = {}
        for _ in range(n_kv):
            start = self.pos
            key = self.string("metadata key", MAX_NAME_BYTES).decode("utf-8", errors="replace")
            if key in metadata:
                raise self.fail(f"metadata key {key!r} appears twice")
            metadata[key] = self.value(self.value_type(f"type of {key}"), key)
            spans[key] = (start, self.pos)
        if n_tensors * (8 + 4 + 8 + 4 + 8) > len(self.data) - self.pos:
            raise self.fail(f"tensor count is {n_tensors}, more than the rest of the file can describe")
        infos = [self.tensor_info() for _ in range(n_tensors)]
        alignment = metadata.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not (isinstance(alignment, int) and 0 < alignment <= 1 << 16 and alignment & (alignment - 1) == 0):
            raise self.fail(f"general.alignment {alignment!r} is not a power of two up to 65536")
        data_start = -(-self.pos // alignment) * alignment
        return GGUFContents(version, metadata, spans, self.place(infos, data_start, alignment))

    def tensor_info(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self.string("tensor name", MAX_NAME_BYTES).decode("utf-8", errors="replace")
        n_dims = self.unpack(_U32, f"dim count of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise self.fail(f"tensor {name} has {n_dims} dims (1..{MAX_DIMS} allowed)")
        dims = tuple(self.unpack(_U64, f"dims of {name}") for _ in range(n_dims))
        raw_type = self.unpack(_U32, f"type of {name}")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise self.fail(f"tensor {name} has unknown ggml type {raw_type}") from None
        if qtype not in GGML_QUANT_SIZES:
            raise self.fail(f"tensor {name} has ggml type {qtype.name}, which has no known block size")
        return name, dims, qtype, self.unpack(_U64, f"offset of {name}")

    def place(
        self, infos: list[tuple[str, tuple[int, ...], GGMLQuantizationType, int]], data_start: int, alignment: int
    ) -> dict[str, GGUFTensor]:
        tensors: dict[str, GGUFTensor] = {}
        for name, dims, qtype, offset in infos:
            block_size, type_size = GGML_QUANT_SIZES[qtype]
            if any(d < 1 for d in dims) or dims[0] % block_size:
                raise self.fail(f"tensor {name} has dims {list(dims)}, not whole {qtype.name} blocks of {block_size}")
            nbytes = math.prod(dims) // block_size * type_size
            start = data_start + offset
            if offset % alignment:
                raise self.fail(f"tensor {name} starts at data offset {offset}, not aligned to {alignment}")
            if start + nbytes > len(self.data):
                raise self.fail(
                    f"tensor {name} ({qtype.name} {list(dims)}) ends at byte {start + nbytes} but the file has "
                    f"{len(self.data)} (truncated?)"
                )
            if name in tensors:
                raise self.fail(f"tensor {name} appears twice")
            tensors[name] = GGUFTensor(name, qtype, dims, start, nbytes)
        spans = sorted((t.start, t.start + t.nbytes, t.name) for t in tensors.values())
        for (_, prev_end, prev), (begin, _, name) in zip(spans, spans[1:]):
            if begin < prev_end:
                raise self.fail(f"tensors {prev} and {name} overlap")
        return tensors
