"""`hubtrace test` and `hubtrace localize` take fingerprints by object-store URL (a real S3-compatible server, moto's),
read through the fingerprint store and checked like local files: results equal to the local files', and every
bad object a one-line refusal with exit status 2."""

from __future__ import annotations

import json

import fsspec
import numpy as np
import pytest
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from scanner.fingerprints.fingerprint import Fingerprint, write_fingerprint
from scanner.fingerprints.inputs import InputSpec
from scanner.fingerprints.store import FingerprintStore
from tests.fixtures.synthetic import synthetic_pair
from tests.s3_support import environment, make_bucket
from tests.synthetic_fingerprints import template_fingerprint
from tests.tiny_models import FAMILIES, save_random

BUCKET = "fp-cli"
REVISION = "0123456789abcdef0123456789abcdef01234567"
DEPTH = 4
#: Block j of B derives from block j of A for j < 3; B's last block is independent.
PARENTS = {0: 0, 1: 1, 2: 2}

runner = CliRunner()


def hubtrace(*args: str):
    return runner.invoke(app, list(args))


@pytest.fixture(scope="module")
def sides(tmp_path_factory, s3_env):
    """The same synthetic dependent pair as local files and as objects in the S3 server."""
    folder = tmp_path_factory.mktemp("cli-s3")
    template = template_fingerprint(folder / "llama", 128)
    pair = synthetic_pair(template, DEPTH, 96, PARENTS, seed=11)
    make_bucket(BUCKET)
    store = FingerprintStore(f"s3://{BUCKET}/fps")
    local, remote = [], []
    for name, fp in zip(("org/a", "org/b"), pair, strict=True):
        local.append(str(folder / f"{name.replace('/', '-')}.safetensors"))
        write_fingerprint(fp, local[-1])
        remote.append(store.write(fp, name, REVISION)[0])
    return local, remote, pair


def _refused(*args: str) -> str:
    result = hubtrace(*args)
    assert result.exit_code == EXIT_REFUSED, (args, result.output, result.exception)
    assert result.stderr.startswith("hubtrace: error: ") and result.stderr.count("\n") == 1, result.stderr
    return result.stderr


def _put(key: str, fp: Fingerprint, tmp_path) -> str:
    """A fingerprint uploaded as is (no checks on the way): how a damaged or hostile object gets there."""
    path = tmp_path / "upload.safetensors"
    write_fingerprint(fp, path)
    fs, _ = fsspec.core.url_to_fs(f"s3://{BUCKET}")
    fs.put_file(str(path), f"{BUCKET}/{key}")
    return f"s3://{BUCKET}/{key}"


def test_test_on_urls_equals_test_on_files(sides):
    local, remote, _ = sides
    from_files = json.loads(hubtrace("test", *local, "--json").stdout)
    result = hubtrace("test", *remote, "--json")
    assert result.exit_code == 0, result.output
    from_urls = json.loads(result.stdout)
    assert from_urls["log10_p"] == from_files["log10_p"] and from_urls["log10_p"] <= -10
    assert [x["log10_p"] for x in from_urls["layers"]] == [x["log10_p"] for x in from_files["layers"]]
    mixed = json.loads(hubtrace("test", local[0], remote[1], "--json").stdout)
    assert mixed["log10_p"] == from_files["log10_p"]


@pytest.mark.usefixtures("sides")  # the bucket: this test once ran first on its worker and found none
def test_a_model_folder_is_fingerprinted_on_the_input_set_of_a_url_side(tmp_path, s3_env):
    folder = tmp_path / "model"
    save_random(FAMILIES["llama"].config(), folder)
    from scanner.fingerprints.fingerprint import fingerprint_model

    own = fingerprint_model(folder, inputs=InputSpec(seed=7, n_sequences=1, seq_len=48))
    url = FingerprintStore(f"s3://{BUCKET}/own").write(own, "org/model", REVISION)[0]
    result = hubtrace("test", "--fingerprint", str(folder), url, "--json")  # default inputs differ: the URL's win
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["inputs"] == own.meta.input_set and data["log10_p"] <= -10


def test_localize_maps_blocks_from_urls(sides):
    _, remote, _ = sides
    result = hubtrace("localize", *remote, "--json")
    assert result.exit_code == 0, result.output
    mapped = {(m["layer_a"], m["layer_b"]) for m in json.loads(result.stdout)["map"]}
    assert {(j, j) for j in PARENTS} <= mapped and (DEPTH - 1, DEPTH - 1) not in mapped
    assert "give both models as directories" in _refused("localize", *remote, "--replay")


def test_bad_objects_and_addresses_are_one_line_refusals(sides, tmp_path):
    local, remote, (fp_a, _) = sides
    missing = remote[0].replace("org/a", "org/nobody")
    assert f"fingerprint {missing} does not exist" in _refused("test", missing, remote[1])
    assert "does not exist" in _refused("localize", remote[0], missing)
    assert "cannot read fingerprint" in _refused("test", "nosuchprotocol://x/y.safetensors", remote[1])
    assert "needs the checkpoints" in _refused("test", *remote, "--stat", "l2")

    blocks = [list(experts) for experts in fp_a.blocks]
    gate = blocks[1][0].gate.copy()
    gate[3, 5] = np.nan
    blocks[1][0] = type(blocks[1][0])(gate=gate, up=blocks[1][0].up)
    nan_url = _put("bad/nan.safetensors", Fingerprint(fp_a.meta, blocks), tmp_path)
    assert "NaN or Inf" in _refused("test", nan_url, remote[1])

    short = [[type(e)(gate=e.gate[:, :-1], up=e.up[:, :-1]) for e in experts] for experts in fp_a.blocks]
    short_url = _put("bad/short.safetensors", Fingerprint(fp_a.meta, short), tmp_path)
    assert "malformed gate/up" in _refused("test", short_url, remote[1])

    fs, key = fsspec.core.url_to_fs(remote[1])
    data = bytearray(fs.cat(key))
    data[-3] ^= 0x40
    fs.pipe(f"{BUCKET}/bad/altered.safetensors", bytes(data))
    assert "sha256" in _refused("test", local[0], f"s3://{BUCKET}/bad/altered.safetensors")


def test_an_unreachable_endpoint_is_a_one_line_refusal(sides):
    from s3fs import S3FileSystem

    _, remote, _ = sides
    S3FileSystem.clear_instance_cache()  # a fresh client reads the endpoint below
    try:
        with environment({"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}):
            assert "Could not connect to the endpoint" in _refused("test", *remote)
    finally:
        S3FileSystem.clear_instance_cache()
