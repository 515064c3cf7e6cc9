"""GGUF files and quantized safetensors read as checkpoints: exact round trips, dequantization error bounds,
verdicts against the float parent, and hostile files refused in one line.

Models are the zoo's (tiny Llamas); their GGUF and quantized copies are written here with hubtrace's own writer
and quantizers, and checked against the `gguf` package's and transformers' independent readers. Verdict
assertions use the zoo's margins: dependent pairs measure log10 p below -600 and the threshold is -20;
independent ones are asserted above -5, which a valid p-value crosses with probability 1e-5.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from typer.testing import CliRunner

from jobs.cli import app
from scanner.errors import CheckpointError, UnsupportedArchitectureError
from scanner.pairs.compare import compare_models
from scanner.reading.formats import open_model_checkpoint
from scanner.reading.formats.gguf import GGUFCheckpoint
from scanner.reading.formats.gguf_write import write_gguf
from scanner.reading.formats.quantized import AWQ_ORDER, pack_int4, unpack_int4
from scanner.reading.validate import validate_checkpoint
from scanner.zoo import Zoo
from tests.fixtures.quantize import write_quantized

BASE, CHAT, TWIN = "aurora-labs/aurora-base", "finch-nlp/aurora-chat", "tundra-research/tundra-64"
DEPENDENT_BELOW, INDEPENDENT_ABOVE = -20.0, -5.0


@pytest.fixture(scope="module")
def ggufs(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("gguf")
    source = open_model_checkpoint(zoo[CHAT].path)
    return {q.name: write_gguf(source, folder / f"chat.{q.name}.gguf", q)
            for q in (GGMLQuantizationType.F32, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0)}


def test_f32_gguf_round_trip_is_exact(zoo: Zoo, ggufs: dict[str, Path]) -> None:
    """Names, shapes and values come back bit for bit, so the Q/K row order is undone exactly."""
    source, back = open_model_checkpoint(zoo[CHAT].path), open_model_checkpoint(ggufs["F32"])
    assert isinstance(back, GGUFCheckpoint)
    assert back.tensor_names() == source.tensor_names()
    for name in source.tensor_names():
        assert torch.equal(back.get(name), source.get(name).float()), name
    assert torch.equal(back.get_rows("model.embed_tokens.weight", [7, 3, 4]),
                       source.get("model.embed_tokens.weight")[[7, 3, 4]].float())
    assert back.config["num_hidden_layers"] == 4
    assert back.config["tie_word_embeddings"] is not source.has("lm_head.weight")


def test_query_rows_are_stored_in_llama_cpp_order(zoo: Zoo, ggufs: dict[str, Path]) -> None:
    """Read with the gguf package's own reader, the stored query rows are permuted (so the inverse matters)."""
    source = open_model_checkpoint(zoo[CHAT].path).get("model.layers.0.self_attn.q_proj.weight").float().numpy()
    stored = {t.name: t for t in GGUFReader(ggufs["F32"]).tensors}["blk.0.attn_q.weight"]
    raw = np.asarray(stored.data).reshape(source.shape)
    assert not np.array_equal(raw, source)
    heads = 4  # the zoo's query heads
    expected = source.reshape(heads, 2, source.shape[0] // heads // 2, -1).swapaxes(1, 2).reshape(source.shape)
    assert np.array_equal(raw, expected)


def test_quantized_gguf_matches_transformers_reader(ggufs: dict[str, Path]) -> None:
    """transformers' GGUF loader (whole file at once) and hubtrace's lazy reader give identical tensors."""
    from transformers import AutoModelForCausalLM, LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours = open_model_checkpoint(ggufs["Q4_0"])
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(LlamaConfig(**ours.config))
    theirs = load_gguf_checkpoint(str(ggufs["Q4_0"]), return_tensors=True, model_to_load=model)["tensors"]
    assert set(theirs) == set(ours.tensor_names())
    for name, tensor in theirs.items():
        assert torch.equal(tensor.float(), ours.get(name)), name


def test_q8_gguf_dequantizes_within_one_quantization_step(zoo: Zoo, ggufs: dict[str, Path]) -> None:
    source, back = open_model_checkpoint(zoo[CHAT].path), open_model_checkpoint(ggufs["Q8_0"])
    for name in source.tensor_names():
        w, q = source.get(name).float(), back.get(name)
        step = w.abs().max() / 127  # Q8_0: one scale per 32 values, at most the tensor's max / 127
        # rounding costs half a step; the scale is stored in float16 (relative error 2^-11, times |q| <= 127)
        assert float((q - w).abs().max()) <= float(step) * (0.5 + 127 * 2**-11) + 1e-6, name


def test_gguf_copy_is_dependent_on_its_float_family_and_not_on_the_twin(
    zoo: Zoo, ggufs: dict[str, Path]
) -> None:
    dependent = compare_models(ggufs["Q4_0"], zoo[BASE].path)
    assert dependent.log10_p is not None and dependent.log10_p <= DEPENDENT_BELOW
    assert any("read from GGUF (F32, Q4_0)" in note for note in dependent.notes)
    independent = compare_models(ggufs["Q4_0"], zoo[TWIN].path)
    assert independent.log10_p is not None and independent.log10_p > INDEPENDENT_ABOVE


def test_cli_test_takes_a_gguf_file_or_a_folder_holding_one(
    zoo: Zoo, ggufs: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "llama-cpp-release"
    folder.mkdir()
    shutil.copy(ggufs["Q8_0"], folder / "model.Q8_0.gguf")  # a link out of the folder would be refused
    for side in (ggufs["Q8_0"], folder):
        result = CliRunner().invoke(app, ["test", str(side), str(zoo[BASE].path), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.output)["log10_p"] <= DEPENDENT_BELOW


def test_a_file_that_is_neither_gguf_nor_fingerprint_names_both(zoo: Zoo, tmp_path: Path) -> None:
    junk = tmp_path / "model.bin"
    junk.write_bytes(b"\xff" * 64)
    result = CliRunner().invoke(app, ["test", str(junk), str(zoo[BASE].path)])
    assert result.exit_code == 2
    assert "hubtrace: error:" in result.output and "GGUF" in result.output and "fingerprint" in result.output


def test_a_folder_with_two_gguf_files_is_refused(ggufs: dict[str, Path], tmp_path: Path) -> None:
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).symlink_to(ggufs["Q8_0"])
    with pytest.raises(CheckpointError, match="holds 2 GGUF files"):
        open_model_checkpoint(tmp_path)


def test_non_finite_gguf_weights_are_refused_by_the_value_pass(zoo: Zoo, tmp_path: Path) -> None:
    source = open_model_checkpoint(zoo[CHAT].path)
    poisoned = _Poisoned(source, "model.layers.2.mlp.down_proj.weight")
    file = write_gguf(poisoned, tmp_path / "nan.gguf", GGMLQuantizationType.F32)
    with pytest.raises(CheckpointError, match="down_proj.weight contains NaN"):
        validate_checkpoint(file)


class _Poisoned:
    """A checkpoint stand-in whose one tensor holds a NaN (only what write_gguf reads)."""

    def __init__(self, checkpoint, name: str) -> None:
        self.checkpoint, self.name = checkpoint, name
        self.config, self.path = checkpoint.config, checkpoint.path

    def tensor_names(self) -> list[str]:
        return self.checkpoint.tensor_names()

    def get(self, name: str) -> torch.Tensor:
        tensor = self.checkpoint.get(name).float().clone()
        if name == self.name:
            tensor[1, 2] = float("nan")
        return tensor


# -- hostile GGUF files: each refused in one line, without reading past the file or looping on its counts --------


def _header(kv: bytes, n_kv: int, tensors: bytes = b"", n_tensors: int = 0, version: int = 3) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + kv + tensors


def _string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def _kv_string(key: str, value: str) -> bytes:
    return _string(key) + struct.pack("<I", 8) + _string(value)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda good: b"GGUX" + good[4:], "no GGUF magic"),
        (lambda good: good[:4] + struct.pack("<I", 1) + good[8:], "GGUF version 1"),
        (lambda good: _header(b"", 1 << 60), "metadata count is 1152921504606846976"),
        (lambda good: _header(_string("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 50), 1), "length of value"),
        (lambda good: _header(_string("k") + struct.pack("<IIQ", 9, 4, 1 << 40), 1), "length of array k"),
        (lambda good: _header(_string("k") + struct.pack("<I", 99), 1), "unknown value type 99"),
        (lambda good: _header(_kv_string("general.architecture", "llama"), 1, n_tensors=1 << 40), "tensor count"),
        (lambda good: good[: len(good) - 100], "truncated"),
        (lambda good: _header(_kv_string("general.architecture", "llama"), 1,
                              _string("t.weight") + struct.pack("<IQIQ", 1, 32, 8, 0), 1), "ends at byte"),
        (lambda good: _header(_kv_string("general.architecture", "llama"), 1,
                              _string("t.weight") + struct.pack("<IQIQ", 1, 33, 8, 0), 1), "not whole Q8_0 blocks"),
        (lambda good: _header(_kv_string("general.architecture", "llama"), 1,
                              _string("t.weight") + struct.pack("<IQIQ", 9, 1, 0, 0), 1), "has 9 dims"),
        (lambda good: _header(_kv_string("general.architecture", "llama"), 1,
                              _string("t.weight") + struct.pack("<IQIQ", 1, 32, 12345, 0), 1), "unknown ggml type"),
    ],
)
def test_hostile_gguf_is_refused_in_one_line(ggufs: dict[str, Path], tmp_path: Path, make, reason: str) -> None:
    file = tmp_path / "hostile.gguf"
    file.write_bytes(make(ggufs["Q8_0"].read_bytes()))
    with pytest.raises(CheckpointError, match=reason) as caught:
        open_model_checkpoint(file)
    assert "\n" not in str(caught.value)


def test_gguf_metadata_arrays_take_the_memory_of_their_bytes(tmp_path: Path) -> None:
    """Issue 24: numeric arrays came back as lists of Python ints, ~45 bytes of memory per byte of file. They are
    numpy arrays now: a 16 MB uint8 array takes 16 MB."""
    from scanner.reading.formats.gguf_file import read_gguf_layout

    n = 16 << 20
    array = _string("x.big") + struct.pack("<IIQ", 9, 0, n) + bytes(range(256)) * (n // 256)
    file = tmp_path / "big-metadata.gguf"
    file.write_bytes(_header(_kv_string("general.architecture", "llama") + array, 2))
    big = read_gguf_layout(file).metadata["x.big"]
    assert isinstance(big, np.ndarray) and big.nbytes == n and int(big[255]) == 255


def test_a_gguf_architecture_that_is_an_array_is_refused_in_one_line(tmp_path: Path) -> None:
    file = tmp_path / "array-arch.gguf"
    array_of_one_string = _string("general.architecture") + struct.pack("<IIQ", 9, 8, 1) + _string("llama")
    file.write_bytes(_header(array_of_one_string, 1))
    with pytest.raises(UnsupportedArchitectureError, match=r"GGUF architecture \['llama'\] is not supported"):
        open_model_checkpoint(file)


@pytest.mark.parametrize("alias", ["blk.01.ffn_up.weight", "blk.\u00b9.ffn_up.weight", "blk.\u0661.ffn_up.weight"])
def test_a_second_spelling_of_a_block_number_is_refused(zoo: Zoo, tmp_path: Path, monkeypatch, alias: str) -> None:
    """Issue 24: blk.1. and blk.01. both loaded as block 1, the later winning (an exact copy with decoy blocks
    appended tested independent of its source); blk.\u00b9 (a superscript one, str.isdigit) raised from int().
    Only ASCII decimal without a leading zero names a block; any other spelling is a tensor hubtrace does not know."""
    from scanner.reading.formats import gguf_write

    source = open_model_checkpoint(zoo[CHAT].path)
    canonical = gguf_write._gguf_name
    decoy = "model.layers.1.mlp.up_proj.weight"
    monkeypatch.setattr(gguf_write, "_gguf_name", lambda name, checkpoint: alias if name == decoy + "#decoy"
                        else canonical(name, checkpoint))
    with_decoy = _Renamed(source, decoy)
    file = write_gguf(with_decoy, tmp_path / "decoy.gguf", GGMLQuantizationType.F32)
    with pytest.raises(CheckpointError, match="have no Hugging Face counterpart") as caught:
        open_model_checkpoint(file)
    assert "\n" not in str(caught.value)


class _Renamed:
    """A checkpoint stand-in with one extra tensor, a copy of ``name`` (the writer is told its GGUF name)."""

    def __init__(self, checkpoint, name: str) -> None:
        self.checkpoint, self.name = checkpoint, name
        self.config, self.path = checkpoint.config, checkpoint.path

    def tensor_names(self) -> list[str]:
        return [*self.checkpoint.tensor_names(), self.name + "#decoy"]

    def get(self, name: str) -> torch.Tensor:
        return self.checkpoint.get(name.removesuffix("#decoy"))


def test_unsupported_gguf_architecture_is_refused_by_name(tmp_path: Path) -> None:
    file = tmp_path / "gpt2.gguf"
    file.write_bytes(_header(_kv_string("general.architecture", "gpt2"), 1))
    with pytest.raises(UnsupportedArchitectureError, match="GGUF architecture 'gpt2' is not supported"):
        open_model_checkpoint(file)


# -- quantized safetensors ------------------------------------------------------------------------------------------


def test_int4_packing_matches_the_published_layouts() -> None:
    """GPTQ packs eight values per int32 lowest nibble first; AWQ interleaves them as (0, 2, 4, 6, 1, 3, 5, 7)."""
    values = torch.arange(8, dtype=torch.int32).reshape(1, 8)
    assert pack_int4(values, dim=1).item() == 0x76543210
    assert pack_int4(values, dim=1, order=AWQ_ORDER).item() == 0x75316420
    assert pack_int4(values.T.contiguous(), dim=0).item() == 0x76543210
    rows = torch.randint(0, 16, (16, 24), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    for dim in (0, 1):
        assert torch.equal(unpack_int4(pack_int4(rows, dim=dim), dim=dim), rows)
    assert torch.equal(unpack_int4(pack_int4(rows, dim=1, order=AWQ_ORDER), dim=1, order=AWQ_ORDER), rows)
    assert pack_int4(torch.full((1, 8), 15, dtype=torch.int32), dim=1).item() == -1  # all bits set


@pytest.mark.parametrize(
    ("scheme", "options", "bound"),
    [
        ("gptq", {}, "int4"),
        ("gptq", {"act_order": True}, "int4"),
        ("awq", {}, "int4"),
        ("fp8", {"block": (32, 32)}, "fp8"),
        ("fp8-tensor", {}, "fp8"),
    ],
)
def test_quantized_safetensors_dequantize_and_stay_dependent_on_the_parent(
    zoo: Zoo, tmp_path: Path, scheme: str, options: dict, bound: str
) -> None:
    folder = write_quantized(zoo[CHAT].path, tmp_path / scheme, scheme, **options)
    source, quantized = open_model_checkpoint(zoo[CHAT].path), open_model_checkpoint(folder)
    assert quantized.tensor_names() == source.tensor_names()
    assert "quantization_config" not in quantized.config
    for name in source.tensor_names():
        w, q = source.get(name).float(), quantized.get(name).float()
        if w.dim() == 1 or "embed" in name or "lm_head" in name:
            assert torch.equal(q, w), name  # left in float by the quantizer, read as stored
            continue
        if bound == "int4":
            # the quantizer's step is at most 1.5 x its group's range / 15 (it widens the scale by up to half a step
            # to keep zero points in 1..14), so at most the row's range / 10; rounding costs half a step, the float16
            # scale up to 15 x 2^-11 of one. A misplaced nibble is off by several steps.
            step = (w.amax(1, keepdim=True).clamp(min=0) - w.amin(1, keepdim=True).clamp(max=0)) / 10
            allowed = step * (0.5 + 15 * 2**-11)
        else:  # e4m3 keeps 3 mantissa bits: rounding within 2^-4 relative, subnormals within 2^-9 of the block max
            allowed = w.abs() * 2**-4 + w.abs().max() * 2**-9
        assert bool(((q - w).abs() <= allowed + 1e-7).all()), name
    result = compare_models(folder, zoo[BASE].path)
    assert result.log10_p is not None and result.log10_p <= DEPENDENT_BELOW
    assert any("dequantized to float32" in note for note in result.notes)


@pytest.mark.parametrize(
    ("quantization_config", "reason"),
    [
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "scheme 'bitsandbytes' is not supported"),
        ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, "format 'pack-quantized'"),
        ({"quant_method": "gptq", "bits": 8, "group_size": 32}, "gptq with 8 bits is not supported"),
        ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "AWQ version 'gemv'"),
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "no weight is stored as float8"),
    ],
)
def test_unsupported_quantization_is_refused_by_name(
    zoo: Zoo, tmp_path: Path, quantization_config: dict, reason: str
) -> None:
    folder = tmp_path / "quantized"
    folder.mkdir()
    config = json.loads((zoo[CHAT].path / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "quantization_config": quantization_config}))
    (folder / "model.safetensors").symlink_to(zoo[CHAT].path / "model.safetensors")
    with pytest.raises(CheckpointError, match=reason):
        open_model_checkpoint(folder)


def test_an_fp8_block_larger_than_its_weights_reads_in_the_weights_size(zoo: Zoo, tmp_path: Path) -> None:
    """Issue 24: weight_block_size [2^26, 32] on a tiny model asked for 32 GB of repeated scales per weight. The
    per-block scales are now indexed to the weight's shape; the dequantized weights are those of a 32-row block."""
    from safetensors import safe_open

    huge = write_quantized(zoo[CHAT].path, tmp_path / "huge", "fp8", block=(1 << 26, 32))
    name = "model.layers.0.mlp.up_proj.weight"
    with safe_open(str(huge / "model.safetensors"), framework="pt") as stored:
        assert stored.get_slice(name + "_scale_inv").get_shape()[0] == 1  # one block of rows covers the weight
    w, q = open_model_checkpoint(zoo[CHAT].path).get(name).float(), open_model_checkpoint(huge).get(name).float()
    assert q.shape == w.shape
    assert bool(((q - w).abs() <= w.abs() * 2**-4 + w.abs().max() * 2**-9 + 1e-7).all())  # e4m3's rounding


def test_fp8_scale_of_the_wrong_shape_is_refused(zoo: Zoo, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = write_quantized(zoo[CHAT].path, tmp_path / "fp8", "fp8", block=(32, 32))
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight_scale_inv"] = torch.ones(3, 3)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match="weight_scale_inv has shape \\[3, 3\\]"):
        open_model_checkpoint(folder)


def test_a_local_scan_discovers_gguf_files_and_folders_and_fingerprints_them(
    ggufs: dict[str, Path], tmp_path: Path
) -> None:
    from jobs.actors import fingerprint_record
    from scanner.fingerprints.inputs import InputSpec
    from scanner.fingerprints.store import FingerprintStore
    from scanner.sources.local import discover_local

    org = tmp_path / "hub" / "llama-cpp"
    (org / "chat-release").mkdir(parents=True)
    shutil.copy(ggufs["Q8_0"], org / "chat.Q8_0.gguf")
    shutil.copy(ggufs["Q4_0"], org / "chat-release" / "chat.Q4_0.gguf")
    records = {r.model_id: r for r in discover_local(tmp_path / "hub")}
    assert set(records) == {"llama-cpp/chat.Q8_0.gguf", "llama-cpp/chat-release"}
    for record in records.values():
        store = FingerprintStore(tmp_path / "fingerprints")
        outcome = fingerprint_record(record, store, InputSpec(n_sequences=2, seq_len=16))
        assert outcome.error is None, outcome.error
        assert outcome.meta.n_layers == 4 and outcome.meta.model_type == "llama"
