"""Parts of a fingerprint in an object store, fetched by byte range instead of downloading the whole file.

A fingerprint is a safetensors file: an 8-byte little-endian header length, a JSON header (tensor dtypes,
shapes and byte offsets, and hubtrace's metadata under ``__metadata__``), then the tensors. Reading the metadata
therefore needs only the object's size and its first bytes (one HEAD and usually one ranged GET), and one block
needs only that block's tensors (one ranged GET each, sent together). A 7B-shaped fingerprint is ~360 MB and
its header ~52 KB, so a node that only needs tensor hashes or summaries (shared-tensor pairs, direction votes)
no longer pulls the activations over the network.

Nothing in the header is trusted: its length is bounded and checked against the object's size, and every tensor
a block read fetches is checked for dtype, shape, byte extent and finite values
(`scanner.fingerprints.fingerprint.checked_block`). What a range read cannot check is the sha256 over every tensor: a
whole-file read (`read_fingerprint_at`) does.

The header and each block are one *part* each, fetched through an optional part reader, so a node-local disk
cache (scanner.fingerprints.cache) can serve them to every process of the node.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from fsspec import AbstractFileSystem

from scanner.errors import FingerprintError
from scanner.fingerprints.cache import PartReader
from scanner.fingerprints.fingerprint import FingerprintMeta, block_tensor_prefix, checked_block, parse_fingerprint_meta
from scanner.reading.activations import MLPActivations
from scanner.reading.checkpoint import MAX_HEADER_BYTES

#: Bytes asked for with the header length, so one request usually brings the whole header (a 7B fingerprint's is
#: ~52 KB: per-tensor sha256 hashes of the checkpoint and per-block summaries).
HEADER_PREFETCH = 1 << 16
#: The dtypes fingerprints store their parts in: activations in float16 (float32 where float16 cannot hold a value),
#: the write view in int8 steps (scanner.reading.activations.WRITE_STEPS).
_DTYPES = {"F16": np.dtype("<f2"), "F32": np.dtype("<f4"), "I8": np.dtype("i1")}


class RangedFingerprint:
    """One fingerprint object whose header has been fetched and checked; blocks are fetched on demand."""

    def __init__(self, fs: AbstractFileSystem, key: str, address: str, parts: PartReader | None = None) -> None:
        self.fs, self.key, self.address = fs, key, address
        self._parts: PartReader = parts or (lambda _part, fetch: fetch())
        header_part = self._parts("header", self._fetch_header)
        self.size = int.from_bytes(header_part[:8], "little")
        head = header_part[8:]
        header_len = int.from_bytes(head[:8], "little")
        if len(head) < 8 or 8 + header_len > len(head):
            raise FingerprintError(f"{address}: header part is shorter than the header it claims")
        self.data_start = 8 + header_len
        try:
            header = json.loads(head[8:self.data_start])
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise FingerprintError(f"{address}: safetensors header is not valid JSON ({exc})") from exc
        if not isinstance(header, dict):
            raise FingerprintError(f"{address}: safetensors header is not a JSON object")
        metadata = header.pop("__metadata__", None)
        if metadata is not None and not (isinstance(metadata, dict)
                                         and all(isinstance(v, str) for v in metadata.values())):
            raise FingerprintError(f"{address}: safetensors __metadata__ is not a map of strings")
        self.meta: FingerprintMeta = parse_fingerprint_meta(address, metadata)
        self._entries = header

    def _fetch_header(self) -> bytes:
        """The object's size (8 bytes, little-endian) and its first bytes up to the end of its JSON header."""
        size = int(self.fs.size(self.key))
        head = self.fs.cat_file(self.key, start=0, end=min(size, 8 + HEADER_PREFETCH)) if size >= 8 else b""
        if len(head) < 8:
            raise FingerprintError(f"{self.address} has {size} bytes, too few to be a fingerprint (safetensors) file")
        header_len = int.from_bytes(head[:8], "little")
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise FingerprintError(f"{self.address}: header claims {header_len} bytes, but the object has {size} "
                                   f"(at most {MAX_HEADER_BYTES} accepted): not a readable fingerprint")
        if len(head) < 8 + header_len:
            head += self.fs.cat_file(self.key, start=len(head), end=8 + header_len)
        return size.to_bytes(8, "little") + head[:8 + header_len]

    def block(self, layer: int) -> list[MLPActivations]:
        """Block ``layer``'s activations (per expert), fetching only its tensors' bytes."""
        if not 0 <= layer < self.meta.n_layers:
            raise FingerprintError(f"{self.address}: no block {layer} (the fingerprint has {self.meta.n_layers})")
        prefix = block_tensor_prefix(layer)
        spans = {name: self._span(name, info) for name, info in self._entries.items() if name.startswith(prefix)}
        names = sorted(spans)
        data = self._parts(f"block-{layer:05d}", lambda: self._fetch(names, spans))
        if len(data) != sum(spans[n][3] - spans[n][2] for n in names):
            raise FingerprintError(f"{self.address}: block {layer} came back with {len(data)} bytes, not the "
                                   "header's (object changed or truncated)")
        tensors, at = {}, 0
        for name in names:
            dtype, shape, begin, end = spans[name]
            chunk = bytearray(memoryview(data)[at:at + end - begin])  # writable, like a file's
            at += end - begin
            tensors[name] = np.frombuffer(chunk, dtype=dtype).reshape(shape)
        experts = checked_block(self.address, self.meta, layer, tensors)
        if tensors:
            raise FingerprintError(f"{self.address}: unexpected tensors {sorted(tensors)[:3]} in block {layer}")
        return experts

    def _fetch(self, names: list[str], spans: dict[str, tuple[np.dtype, tuple[int, ...], int, int]]) -> bytes:
        """The named tensors' bytes, one ranged GET each (sent together), joined in name order."""
        chunks = self.fs.cat_ranges([self.key] * len(names), [spans[n][2] for n in names],
                                    [spans[n][3] for n in names], on_error="raise")
        for name, chunk in zip(names, chunks, strict=True):
            if len(chunk) != spans[name][3] - spans[name][2]:
                raise FingerprintError(f"{self.address}: tensor {name} came back with {len(chunk)} of "
                                       f"{spans[name][3] - spans[name][2]} bytes (object changed or truncated)")
        return b"".join(chunks)

    def _span(self, name: str, info: Any) -> tuple[np.dtype, tuple[int, ...], int, int]:
        """dtype, shape and absolute [begin, end) byte range of one tensor, checked against the object."""
        stored = info.get("dtype") if isinstance(info, dict) else None
        dtype = _DTYPES.get(stored) if isinstance(stored, str) else None
        shape, offsets = (info.get("shape"), info.get("data_offsets")) if isinstance(info, dict) else (None, None)
        if (
            dtype is None
            or not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape)
            or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(n) is int for n in offsets)
            or not 0 <= offsets[0] <= offsets[1]
            or offsets[1] - offsets[0] != dtype.itemsize * math.prod(shape)
            or self.data_start + offsets[1] > self.size
        ):
            raise FingerprintError(f"{self.address}: header entry of tensor {name} is malformed or lies beyond the "
                                   f"object's {self.size} bytes")
        return dtype, tuple(shape), self.data_start + offsets[0], self.data_start + offsets[1]
