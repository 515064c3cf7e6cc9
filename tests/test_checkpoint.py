"""scanner.reading.checkpoint: lazy reads in the stored dtype, sharded folders, tokenizer identity, and every refusal;
the value pass over the stored values (scanner.reading.validate)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from scanner.errors import CheckpointError, UnsafeCheckpointError
from scanner.reading.checkpoint import Checkpoint, open_checkpoint
from scanner.reading.validate import check_values_and_hash

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}


def _folder(path: Path, tensors: dict[str, torch.Tensor] | None = None, config: object = CONFIG) -> Path:
    """A model folder with config.json and (when given) model.safetensors."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if tensors is not None:
        save_file(tensors, str(path / "model.safetensors"))
    return path


def _raw_safetensors(file: Path, header: dict, data: bytes, claimed_header_len: int | None = None) -> None:
    """Write a safetensors file by hand, so its header can lie."""
    raw = json.dumps(header).encode()
    length = len(raw) if claimed_header_len is None else claimed_header_len
    file.write_bytes(struct.pack("<Q", length) + raw + data)


@pytest.fixture
def mixed(tmp_path: Path) -> tuple[Checkpoint, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    tensors = {
        "w32": torch.randn(10, 4),
        "w16": torch.randn(12, 3).half(),
        "wbf": torch.randn(9, 5).bfloat16(),
        "cube": torch.randn(10, 3, 2).bfloat16(),
        "vec": torch.randn(7),
    }
    return open_checkpoint(_folder(tmp_path / "m", tensors)), tensors


def test_reads_names_shapes_and_stored_dtypes(mixed: tuple[Checkpoint, dict[str, torch.Tensor]]) -> None:
    ckpt, tensors = mixed
    assert ckpt.tensor_names() == sorted(tensors)
    assert ckpt.config == CONFIG
    assert ckpt.dtype("w32") == "float32" and ckpt.dtype("w16") == "float16" and ckpt.dtype("wbf") == "bfloat16"
    for name, tensor in tensors.items():
        assert ckpt.has(name)
        assert ckpt.shape(name) == tuple(tensor.shape)
        got = ckpt.get(name)
        assert got.dtype == tensor.dtype
        assert torch.equal(got, tensor)
    assert not ckpt.has("missing")


def test_unknown_tensor_is_a_checkpoint_error(mixed: tuple[Checkpoint, dict[str, torch.Tensor]]) -> None:
    ckpt, _ = mixed
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        ckpt.get("nope")
    with pytest.raises(CheckpointError, match="no tensor 'nope'"):
        ckpt.shape("nope")


@pytest.mark.parametrize(
    "rows",
    [[5, 2, 3, 4, 8], [0], [7, 7, 1], [], slice(3, 9, 2), slice(None), slice(2, 5)],
    ids=["runs-unsorted", "one", "duplicates", "empty", "step-slice", "all", "slice"],
)
@pytest.mark.parametrize("name", ["w32", "wbf", "cube"])
def test_get_rows_equals_indexing_the_full_tensor(
    mixed: tuple[Checkpoint, dict[str, torch.Tensor]], name: str, rows: list[int] | slice
) -> None:
    ckpt, tensors = mixed
    got = ckpt.get_rows(name, rows)
    expected = tensors[name][rows]
    assert got.dtype == tensors[name].dtype
    assert got.shape == expected.shape
    assert torch.equal(got, expected)


def test_get_rows_refuses_out_of_range_rows(mixed: tuple[Checkpoint, dict[str, torch.Tensor]]) -> None:
    ckpt, _ = mixed
    with pytest.raises(IndexError, match="out of range"):
        ckpt.get_rows("w32", [3, 10])
    with pytest.raises(IndexError, match="out of range"):
        ckpt.get_rows("w32", [-1])


def test_reads_after_close_reopen(mixed: tuple[Checkpoint, dict[str, torch.Tensor]]) -> None:
    ckpt, tensors = mixed
    with ckpt:
        first = ckpt.get("vec")
    assert torch.equal(first, ckpt.get("vec"))
    assert torch.equal(ckpt.get_rows("vec", [6, 0]), tensors["vec"][[6, 0]])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sharded_save_pretrained_reads_every_tensor(tmp_path: Path, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(dtype)
    model.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="20KB")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 2 and (tmp_path / "model.safetensors.index.json").exists()
    assert not (tmp_path / "model.safetensors").exists()

    ckpt = open_checkpoint(tmp_path)
    state = model.state_dict()
    assert set(ckpt.tensor_names()) == set(state)
    for name, tensor in state.items():
        assert ckpt.dtype(name) == str(dtype).removeprefix("torch.")
        assert torch.equal(ckpt.get(name), tensor)
    embed = "model.embed_tokens.weight"
    assert torch.equal(ckpt.get_rows(embed, [100, 3, 4]), state[embed][[100, 3, 4]])


# -- tokenizer identity ------------------------------------------------------------------------------------------


def _bpe_tokenizer(vocab_size: int, added: int) -> dict:
    vocab = {f"t{i}": i for i in range(vocab_size)}
    added_tokens = [{"id": vocab_size + i, "content": f"<extra{i}>", "special": True} for i in range(added)]
    return {"version": "1.0", "added_tokens": added_tokens, "model": {"type": "BPE", "vocab": vocab, "merges": []}}


def test_no_tokenizer_files_is_fine(mixed: tuple[Checkpoint, dict[str, torch.Tensor]]) -> None:
    ckpt, _ = mixed
    assert ckpt.tokenizer_hash() is None
    assert ckpt.tokenizer_base_vocab_size() is None


def test_base_vocab_excludes_added_tokens(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.zeros(2)})
    (folder / "tokenizer.json").write_text(json.dumps(_bpe_tokenizer(vocab_size=50, added=3)))
    assert open_checkpoint(folder).tokenizer_base_vocab_size() == 50


def test_base_vocab_of_a_unigram_tokenizer(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.zeros(2)})
    unigram = {"added_tokens": [], "model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["a", -1.0], ["b", -2.0]]}}
    (folder / "tokenizer.json").write_text(json.dumps(unigram))
    assert open_checkpoint(folder).tokenizer_base_vocab_size() == 3


def test_tokenizer_hash_tracks_file_contents(tmp_path: Path) -> None:
    def folder_with(name: str, files: dict[str, str]) -> Checkpoint:
        folder = _folder(tmp_path / name, {"w": torch.zeros(2)})
        for file, text in files.items():
            (folder / file).write_text(text)
        return open_checkpoint(folder)

    same_a = folder_with("a", {"tokenizer.json": "{}", "tokenizer_config.json": '{"x": 1}'})
    same_b = folder_with("b", {"tokenizer.json": "{}", "tokenizer_config.json": '{"x": 1}'})
    changed = folder_with("c", {"tokenizer.json": "{}", "tokenizer_config.json": '{"x": 2}'})
    spm_only = folder_with("d", {"tokenizer.model": "\x00spm"})
    assert same_a.tokenizer_hash() == same_b.tokenizer_hash()
    assert len(same_a.tokenizer_hash() or "") == 64
    assert changed.tokenizer_hash() != same_a.tokenizer_hash()
    assert spm_only.tokenizer_hash() is not None
    assert spm_only.tokenizer_base_vocab_size() is None


def test_invalid_tokenizer_json_is_a_checkpoint_error(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.zeros(2)})
    (folder / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is not valid JSON"):
        open_checkpoint(folder).tokenizer_base_vocab_size()


# -- refusals ----------------------------------------------------------------------------------------------------


def test_pickle_only_folder_is_unsafe(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "pytorch_model.bin").write_bytes(b"not really a pickle, and never read")
    with pytest.raises(UnsafeCheckpointError, match=r"only pickle weights \(pytorch_model\.bin\).*never unpickles"):
        open_checkpoint(folder)


def test_sharded_pickle_and_pt_files_are_unsafe(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "pytorch_model-00001-of-00002.bin").write_bytes(b"x")
    (folder / "consolidated.pth").write_bytes(b"x")
    with pytest.raises(UnsafeCheckpointError, match=r"consolidated\.pth, pytorch_model-00001-of-00002\.bin"):
        open_checkpoint(folder)


def test_pickle_beside_safetensors_is_ignored(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.ones(3)})
    (folder / "pytorch_model.bin").write_bytes(b"never read")
    assert open_checkpoint(folder).tensor_names() == ["w"]


def test_auto_map_with_a_custom_model_type_is_unsafe(tmp_path: Path) -> None:
    config = {"model_type": "evil", "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    folder = _folder(tmp_path / "m", {"w": torch.ones(3)}, config=config)
    with pytest.raises(UnsafeCheckpointError, match="'evil' is not built into transformers.*auto_map.*never runs"):
        open_checkpoint(folder)


def test_auto_map_with_a_built_in_model_type_is_dropped_and_noted(tmp_path: Path) -> None:
    """Hub Llamas often carry an auto_map left over from their training code: transformers' own classes read them."""
    config = {**CONFIG, "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}
    folder = _folder(tmp_path / "m", {"w": torch.ones(3)}, config=config)
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    checkpoint = open_checkpoint(folder)
    assert "auto_map" not in checkpoint.config
    assert len(checkpoint.notes) == 1 and "did not run it" in checkpoint.notes[0]


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="cannot open checkpoint folder .*nowhere"):
        open_checkpoint(tmp_path / "nowhere")


def test_path_that_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(CheckpointError, match="is not a directory"):
        open_checkpoint(file)


def test_empty_folder_has_no_config(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="has no config.json") as info:
        open_checkpoint(tmp_path)
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_invalid_config_json(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.ones(3)})
    (folder / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        open_checkpoint(folder)


def test_config_that_is_not_an_object(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"w": torch.ones(3)}, config=["llama"])
    with pytest.raises(CheckpointError, match="must hold a JSON object"):
        open_checkpoint(folder)


def test_unreadable_config_is_a_checkpoint_error(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "config.json").mkdir(parents=True)  # reading a directory fails like an unreadable file
    with pytest.raises(CheckpointError, match=r"cannot read .*config\.json"):
        open_checkpoint(folder)


def test_no_weights(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "training_args.bin").write_bytes(b"x")  # not weights, so not a reason to say "pickle only"
    with pytest.raises(CheckpointError, match="has no weights") as info:
        open_checkpoint(folder)
    assert not isinstance(info.value, UnsafeCheckpointError)


def test_folder_symlink_loop(tmp_path: Path) -> None:
    os.symlink(tmp_path / "b", tmp_path / "a")
    os.symlink(tmp_path / "a", tmp_path / "b")
    with pytest.raises(CheckpointError, match="cannot open checkpoint folder .*symbolic links"):
        open_checkpoint(tmp_path / "a")


def test_config_symlink_loop(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    os.symlink(folder / "config.json", folder / "config.json")
    with pytest.raises(CheckpointError, match=r"cannot read .*config\.json: Too many levels of symbolic links"):
        open_checkpoint(folder)


def test_weights_symlink_loop(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    os.symlink(folder / "model.safetensors", folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"cannot read .*model\.safetensors"):
        open_checkpoint(folder)


def test_truncated_safetensors(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m", {"a": torch.ones(4, 4), "b": torch.ones(8)})
    file = folder / "model.safetensors"
    file.write_bytes(file.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"model\.safetensors is truncated: tensor \w+ ends at data byte"):
        open_checkpoint(folder)


def test_header_claiming_gigabytes(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 5 * 1024**3) + b"{}")
    with pytest.raises(CheckpointError, match=f"header claims {5 * 1024**3} bytes, over the"):
        open_checkpoint(folder)


def test_header_longer_than_file(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    _raw_safetensors(folder / "model.safetensors", {}, b"", claimed_header_len=1000)
    with pytest.raises(CheckpointError, match="header claims 1000 bytes but the file has only 10"):
        open_checkpoint(folder)


def test_file_too_short_for_a_header(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(CheckpointError, match="2 bytes, too few"):
        open_checkpoint(folder)


def test_header_that_is_not_json(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 4) + b"{{{{")
    with pytest.raises(CheckpointError, match="header is not valid JSON"):
        open_checkpoint(folder)


def test_byte_length_inconsistent_with_dtype_and_shape(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    header = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}
    _raw_safetensors(folder / "model.safetensors", header, bytes(12))
    with pytest.raises(CheckpointError, match=r"tensor w is \[2, 2\] F32 = 16 bytes but its data_offsets span 12"):
        open_checkpoint(folder)


def test_overlapping_tensors(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
    }
    _raw_safetensors(folder / "model.safetensors", header, bytes(24))
    with pytest.raises(CheckpointError, match="tensors a and b overlap"):
        open_checkpoint(folder)


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"dtype": "Q4_K", "shape": [1], "data_offsets": [0, 1]}, "dtype 'Q4_K'"),
        ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "invalid shape"),
        ({"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}, "invalid data_offsets"),
        ("not an object", "is not an object"),
    ],
)
def test_malformed_header_entries(tmp_path: Path, entry: object, reason: str) -> None:
    folder = _folder(tmp_path / "m")
    _raw_safetensors(folder / "model.safetensors", {"w": entry}, bytes(4))
    with pytest.raises(CheckpointError, match=reason):
        open_checkpoint(folder)


def _sharded(folder: Path, weight_map: dict[str, str], shards: dict[str, dict[str, torch.Tensor]]) -> Path:
    _folder(folder)
    for shard, tensors in shards.items():
        save_file(tensors, str(folder / shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    folder = _sharded(
        tmp_path / "m",
        {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"},
        {"model-00001-of-00002.safetensors": {"a": torch.ones(2)}},
    )
    with pytest.raises(CheckpointError, match=r"names shard model-00002-of-00002\.safetensors, which is missing"):
        open_checkpoint(folder)


def test_index_mapping_a_tensor_its_shard_lacks(tmp_path: Path) -> None:
    folder = _sharded(
        tmp_path / "m",
        {"a": "model-00001-of-00001.safetensors", "ghost": "model-00001-of-00001.safetensors"},
        {"model-00001-of-00001.safetensors": {"a": torch.ones(2)}},
    )
    with pytest.raises(CheckpointError, match="maps tensor ghost to model-00001-of-00001.safetensors, but"):
        open_checkpoint(folder)


def test_index_naming_a_shard_outside_the_folder(tmp_path: Path) -> None:
    save_file({"a": torch.ones(2)}, str(tmp_path / "outside.safetensors"))
    folder = _sharded(tmp_path / "m", {"a": "../outside.safetensors"}, {})
    with pytest.raises(CheckpointError, match="not a file name inside"):
        open_checkpoint(folder)


def test_index_without_weight_map(tmp_path: Path) -> None:
    folder = _folder(tmp_path / "m")
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="has no weight_map"):
        open_checkpoint(folder)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.float8_e4m3fn])
def test_the_value_pass_names_the_first_value_that_is_not_finite(tmp_path: Path, dtype: torch.dtype) -> None:
    """Every position and kind of non-finite value is found, in chunks of 64 bytes (so across chunk boundaries),
    with its first flat index; the largest finite values pass, and hashes are the stored bytes'."""

    torch.manual_seed(0)
    clean = torch.randn(5, 40).to(dtype)
    largest = torch.finfo(dtype).max
    clean.view(-1)[[3, 150]] = torch.tensor([largest, -largest], dtype=torch.float64).to(dtype)
    kinds = {"NaN": float("nan")} | ({} if dtype == torch.float8_e4m3fn else {"Inf": float("inf")})  # e4m3: no Inf
    planted: dict[str, tuple[int, str]] = {}
    tensors = {"clean": clean}
    for position in (0, 17, 131, 199):
        for kind, value in kinds.items():
            tensor = clean.clone()
            tensor.view(-1)[position] = value
            tensor.view(-1)[min(position + 9, 199)] = value   # a later one must not be reported first
            name = f"t{position}_{kind}"
            tensors[name], planted[name] = tensor, (position, kind)
    checkpoint = open_checkpoint(_folder(tmp_path / "m", tensors))
    for name, (position, kind) in planted.items():
        with pytest.raises(CheckpointError, match=rf"tensor {name} contains {kind} \(first at flat index {position} "):
            check_values_and_hash(checkpoint, chunk_bytes=64, names=[name])
    digest = check_values_and_hash(checkpoint, chunk_bytes=64, names=["clean"])["clean"]
    assert digest == checkpoint.tensor_sha256("clean")
