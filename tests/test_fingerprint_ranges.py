"""Remote fingerprint reads fetch only what they need: the header (metadata) or one block of a fingerprint in a real
S3-compatible server (moto's), the bytes the server sent counted by a relay between it and the client; and a
hostile header is refused in one line, not trusted."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pytest

from scanner.errors import FingerprintError
from scanner.fingerprints.fingerprint import read_fingerprint_block
from scanner.fingerprints.ranges import HEADER_PREFETCH
from scanner.fingerprints.store import (
    FingerprintStore,
    read_fingerprint_at,
    read_fingerprint_block_at,
    read_fingerprint_meta_at,
)
from tests.fixtures.synthetic import synthetic_pair
from tests.s3_support import counting_relay, make_bucket
from tests.synthetic_fingerprints import template_fingerprint

REVISION = "0123456789abcdef0123456789abcdef01234567"
BUCKET = "fp-ranges"
DEPTH, UNITS, TOKENS = 8, 512, 128
#: Bytes of one block: gate and up, UNITS x TOKENS float16 each, and a float32 scale per unit of each.
BLOCK_BYTES = 2 * UNITS * (TOKENS * 2 + 4)
#: HTTP response headers and listing/HEAD answers: generous, and far below one block.
HTTP_OVERHEAD = 16 << 10


@pytest.fixture(scope="module")
def stored(tmp_path_factory, s3_env):
    """A 2 MB fingerprint (8 blocks of 260 KB) in the S3 server, and the fingerprint itself."""
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), TOKENS)
    fingerprint = synthetic_pair(template, DEPTH, UNITS, {}, seed=5)[0]
    make_bucket(BUCKET)
    address, _ = FingerprintStore(f"s3://{BUCKET}/fps").write(fingerprint, "org/model", REVISION)
    return address, fingerprint


def object_size(address: str) -> int:
    fs, key = fsspec.core.url_to_fs(address)
    return int(fs.size(key))


def test_the_header_alone_is_fetched_for_the_metadata(stored):
    address, fingerprint = stored
    size = object_size(address)
    assert size > DEPTH * BLOCK_BYTES
    with counting_relay() as relay:
        meta = read_fingerprint_meta_at(address)
    assert meta == fingerprint.meta
    assert 0 < relay.downloaded <= 8 + HEADER_PREFETCH + HTTP_OVERHEAD
    assert relay.downloaded < size / 20


def test_one_block_fetches_that_block_and_the_header_only(stored):
    address, fingerprint = stored
    with counting_relay() as relay:
        meta, experts = read_fingerprint_block_at(address, 5)
    assert meta == fingerprint.meta and len(experts) == 1
    np.testing.assert_array_equal(experts[0].gate, fingerprint.blocks[5][0].gate)
    np.testing.assert_array_equal(experts[0].up, fingerprint.blocks[5][0].up)
    assert BLOCK_BYTES <= relay.downloaded <= BLOCK_BYTES + 8 + HEADER_PREFETCH + HTTP_OVERHEAD
    experts[0].gate[0, 0] += 1.0  # writable, as arrays read from a file are


def test_the_counter_sees_a_whole_download(stored, tmp_path):
    """The control: a whole read through the same relay is counted in full, so the bounds above could fail."""
    address, fingerprint = stored
    with counting_relay() as relay:
        read_fingerprint_at(address, scratch=tmp_path)
    assert relay.downloaded >= object_size(address)


def test_a_local_block_read_equals_the_remote_one(stored, tmp_path):
    address, fingerprint = stored
    local = FingerprintStore(tmp_path).write(fingerprint, "org/model", REVISION)[0]
    meta, experts = read_fingerprint_block(local, 2)
    assert meta == read_fingerprint_block_at(address, 2)[0]
    np.testing.assert_array_equal(experts[0].up, read_fingerprint_block_at(address, 2)[1][0].up)
    with pytest.raises(FingerprintError, match="no block 8"):
        read_fingerprint_block_at(local, DEPTH)


def test_every_stored_part_of_a_model_fingerprint_reads_back_by_range(stored, tmp_path):
    """A model's fingerprint holds more than activations (the write view, int8 steps and their float32 scales): every
    part a block has in a file comes back from a ranged read, bit for bit (a dtype the ranged reader did not know
    once failed every pair of a scan whose fingerprints lived in S3)."""
    fingerprint = template_fingerprint(tmp_path / "llama", 16)
    address, _ = FingerprintStore(f"s3://{BUCKET}/model").write(fingerprint, "org/model", REVISION)
    local = FingerprintStore(tmp_path / "local").write(fingerprint, "org/model", REVISION)[0]
    for layer in range(fingerprint.meta.n_layers):
        (remote,), (on_disk,) = read_fingerprint_block_at(address, layer)[1], read_fingerprint_block(local, layer)[1]
        assert remote.write is not None and remote.write.dtype == np.int8
        for part in ("gate", "up", "gate_scale", "up_scale", "write", "write_scale"):
            np.testing.assert_array_equal(getattr(remote, part), getattr(on_disk, part), err_msg=part)


def _put(key: str, data: bytes) -> str:
    fs, _ = fsspec.core.url_to_fs(f"s3://{BUCKET}")
    fs.pipe(f"{BUCKET}/{key}", data)
    return f"s3://{BUCKET}/{key}"


def _header(stored_address: str) -> tuple[dict, bytes]:
    fs, key = fsspec.core.url_to_fs(stored_address)
    data = fs.cat(key)
    length = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + length]), data[8 + length:]


def _with_header(header: dict, body: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + body


def test_hostile_headers_are_refused_in_one_line_before_any_block_is_fetched(stored):
    address, _ = stored
    header, body = _header(address)
    beyond = dict(header)
    name = "blocks.1.0.gate"
    beyond[name] = {**header[name], "data_offsets": [len(body), len(body) + (header[name]["data_offsets"][1]
                                                                              - header[name]["data_offsets"][0])]}
    bad_dtype = {**header, name: {**header[name], "dtype": ["F32"]}}
    nan_body = bytearray(body)
    begin = header["blocks.3.0.up"]["data_offsets"][0]
    nan_body[begin:begin + 4] = np.array([np.nan], dtype="<f4").tobytes()
    cases = {
        "huge": (1 << 40).to_bytes(8, "little") + b"{}",
        "short": b"\x01\x02",
        "not-json": (4).to_bytes(8, "little") + b"{{{{" + body[:16],
        "not-fingerprint": _with_header({"x": header[name]}, body),
    }
    for key, data in cases.items():
        with pytest.raises(FingerprintError) as refused:
            read_fingerprint_meta_at(_put(f"hostile/{key}", data))
        assert "\n" not in str(refused.value) and f"hostile/{key}" in str(refused.value)
    for key, data, layer, why in (("beyond", _with_header(beyond, body), 1, "beyond the object"),
                                  ("dtype", _with_header(bad_dtype, body), 1, "malformed"),
                                  ("nan", _with_header(header, bytes(nan_body)), 3, "NaN or Inf")):
        hostile = _put(f"hostile/{key}", data)
        read_fingerprint_meta_at(hostile)  # the header itself is well formed
        with pytest.raises(FingerprintError, match=why):
            read_fingerprint_block_at(hostile, layer)
    with pytest.raises(FingerprintError, match="does not exist"):
        read_fingerprint_meta_at(f"s3://{BUCKET}/nothing/here.safetensors")
    with pytest.raises(FingerprintError, match="cannot read fingerprint"):
        read_fingerprint_meta_at("nosuchprotocol://bucket/x.safetensors")
