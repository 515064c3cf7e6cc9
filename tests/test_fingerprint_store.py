"""Fingerprint storage as a location: a local path or an object store URL (a real S3-compatible server, moto's,
started by the test), node-local download scratch, and the refusal of an unshared local store on a cluster."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import fsspec
import numpy as np
import pytest

from jobs.cluster import check_fingerprint_store
from jobs.config import ConfigError, ScanConfig
from jobs.scratch import PREFIX, download_folder, remove_orphans
from scanner.errors import FingerprintError
from scanner.fingerprints.store import FingerprintStore, read_fingerprint_at, read_fingerprint_meta_at
from tests.fixtures.synthetic import synthetic_pair
from tests.s3_support import make_bucket
from tests.synthetic_fingerprints import template_fingerprint

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def fingerprint(tmp_path_factory):
    template = template_fingerprint(tmp_path_factory.mktemp("llama"), 16)
    return synthetic_pair(template, 2, 24, {}, seed=3)[0]


def assert_same(a, b) -> None:
    assert a.meta == b.meta
    for block_a, block_b in zip(a.blocks, b.blocks, strict=True):
        for x, y in zip(block_a, block_b, strict=True):
            np.testing.assert_array_equal(x.gate, y.gate)
            np.testing.assert_array_equal(x.up, y.up)


def test_a_local_store_writes_absolute_paths_and_lists_them(fingerprint, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = FingerprintStore("fps")
    assert store.is_local and store.location == str(tmp_path / "fps")
    address, sha = store.write(fingerprint, "org/model", REVISION)
    assert address == store.address("org/model", REVISION, fingerprint.meta.input_set)
    assert address == str(tmp_path / "fps" / "org/model" / REVISION / f"{fingerprint.meta.input_set}.safetensors")
    assert store.existing() == {address} and len(sha) == 64
    assert_same(read_fingerprint_at(address), fingerprint)
    assert read_fingerprint_meta_at(address) == fingerprint.meta
    assert FingerprintStore(tmp_path / "nowhere").existing() == set()


def test_an_s3_store_round_trips_through_a_real_server(fingerprint, s3_env, tmp_path):
    make_bucket("fp-roundtrip")
    store = FingerprintStore("s3://fp-roundtrip/scans/nightly/")
    assert not store.is_local and store.location == "s3://fp-roundtrip/scans/nightly"
    assert store.existing() == set()
    address, sha = store.write(fingerprint, "org/model", REVISION, scratch=tmp_path / "scratch")
    assert address == f"s3://fp-roundtrip/scans/nightly/org/model/{REVISION}/{fingerprint.meta.input_set}.safetensors"
    assert store.existing() == {address}
    assert list((tmp_path / "scratch").iterdir()) == []  # the upload's temporary file is gone
    assert_same(read_fingerprint_at(address, scratch=tmp_path / "scratch"), fingerprint)
    assert read_fingerprint_meta_at(address) == fingerprint.meta
    fs, key = fsspec.core.url_to_fs(address)
    assert hashlib.sha256(fs.cat(key)).hexdigest() == sha


def test_a_damaged_or_missing_object_is_a_one_line_fingerprint_error(fingerprint, s3_env, tmp_path):
    make_bucket("fp-damaged")
    store = FingerprintStore("s3://fp-damaged")
    address, _ = store.write(fingerprint, "org/model", REVISION)
    fs, key = fsspec.core.url_to_fs(address)
    data = bytearray(fs.cat(key))
    data[-5] ^= 0xFF
    fs.pipe(key, bytes(data))
    with pytest.raises(FingerprintError, match="sha256") as damaged:
        read_fingerprint_at(address)
    assert address in str(damaged.value) and "\n" not in str(damaged.value)
    with pytest.raises(FingerprintError, match="does not exist"):
        read_fingerprint_at(address.replace("org/model", "org/other"))


def test_an_s3_store_is_checked_writable_at_start(s3_env):
    make_bucket("fp-prepare")
    store = FingerprintStore("s3://fp-prepare/nightly")
    store.prepare()
    store.fs.invalidate_cache()
    assert store.fs.find("fp-prepare") == []  # the probe object is gone
    with pytest.raises(FingerprintError, match="no-such-bucket/nightly cannot be written from this node") as refused:
        FingerprintStore("s3://no-such-bucket/nightly").prepare()
    assert "\n" not in str(refused.value) and "bucket" in str(refused.value)


def test_a_local_store_is_refused_on_a_multi_node_cluster_unless_declared_shared(s3_env, tmp_path):
    local = FingerprintStore(tmp_path / "fps")
    check_fingerprint_store(local, nodes=1, shared=False)
    check_fingerprint_store(local, nodes=3, shared=True)
    check_fingerprint_store(FingerprintStore("s3://any-bucket/prefix"), nodes=8, shared=False)
    with pytest.raises(ConfigError) as refused:
        check_fingerprint_store(local, nodes=3, shared=False)
    message = str(refused.value)
    assert str(tmp_path / "fps") in message and "3 nodes" in message
    assert "s3://" in message and "fingerprint_store_shared: true" in message


def test_the_store_defaults_to_the_output_folder_and_takes_a_url():
    config = ScanConfig.model_validate({"sources": [{"kind": "hf_cache"}], "output_dir": "/srv/out"})
    assert config.fingerprint_location == "/srv/out/fingerprints" and not config.fingerprint_store_shared
    config = ScanConfig.model_validate({"sources": [{"kind": "hf_cache"}], "fingerprint_store": "s3://b/p"})
    assert config.fingerprint_location == "s3://b/p"


def test_download_scratch_is_deleted_after_use_and_orphans_of_dead_workers_are_removed(tmp_path):
    with download_folder(tmp_path) as folder:
        (folder / "model.safetensors").write_bytes(b"x" * 1000)
        assert folder.parent == tmp_path and folder.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert list(tmp_path.iterdir()) == []

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{PREFIX}{dead.pid}-abc"
    (orphan / "sub").mkdir(parents=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = tmp_path / f"{PREFIX}{live.pid}-def"
        busy.mkdir()
        assert remove_orphans(tmp_path) == [orphan]
        assert not orphan.exists() and busy.exists()
    finally:
        live.kill()
        live.wait()
