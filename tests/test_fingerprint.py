"""Streaming, fingerprint files and fingerprint comparisons: the numbers must be those of the live model.

Streamed activations are checked against an independent reference, the whole model loaded by transformers with
forward pre-hooks on its MLPs, for every family the adapters support. Reads are spied on to show that streaming
holds one block at a time. Fingerprint files must round-trip exactly and refuse damage with one line, and a
comparison from two files must give the very numbers of a live `compare_models` and of `hubtrace test`.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import weakref
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from safetensors.torch import load_file
from safetensors.torch import save_file as save_torch_file
from typer.testing import CliRunner

from jobs.cli import EXIT_REFUSED, app
from scanner.errors import CheckpointError, FingerprintError, IncomparableError
from scanner.fingerprints.fingerprint import (
    FINGERPRINT_FORMAT,
    Fingerprint,
    fingerprint_model,
    read_fingerprint,
    read_fingerprint_meta,
    stored_activations,
    write_fingerprint,
)
from scanner.fingerprints.inputs import InputSpec, canonical_inputs
from scanner.pairs.compare import compare_models
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.activations import MLPActivations, glu_activations, load_causal_lm, mlp_inputs
from scanner.reading.architectures.families import ArchitectureAdapter, adapter_for
from scanner.reading.checkpoint import Checkpoint, open_checkpoint
from scanner.reading.streaming import stream_mlp_activations
from scanner.reading.validate import validate_checkpoint
from scanner.zoo import Zoo
from tests.tiny_models import FAMILIES, LAYERS, VOCAB, save_random, tiny_config

#: Small enough that every family streams in well under a second; 8 tokens outrun the sliding windows below.
SPEC = InputSpec(seed=0, n_sequences=3, seq_len=8)
ZOO_SPEC = InputSpec(seed=0, n_sequences=8, seq_len=32)
#: Windows shorter than SPEC.seq_len, so the sliding masks differ from the causal ones (Gemma 2 alternates both).
SLIDING: dict[str, Callable[[], Any]] = {
    "mistral-sliding": tiny_config("mistral", sliding_window=4),
    "gemma2-sliding": tiny_config("gemma2", head_dim=8, sliding_window=4),
}
#: Gated MLPs per block: Mixtral's 4 experts; Qwen2-MoE's 4 routed + 1 shared, then its dense mlp_only block.
EXPERTS = {"mixtral": [4, 4], "qwen2_moe": [5, 1]}

BASE = "aurora-labs/aurora-base"
CHAT = "finch-nlp/aurora-chat"
TWIN = "tundra-research/tundra-64"

runner = CliRunner()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """A family's tiny random model folder, saved once per module."""
    folders: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in folders:
            folders[name] = tmp_path_factory.mktemp(name)
            save_random(FAMILIES[name].config(), folders[name])
        return folders[name]

    return folder


def _ids() -> np.ndarray:
    return canonical_inputs(VOCAB, SPEC).ids


def _parts(fp: Fingerprint) -> list[tuple[str, np.ndarray]]:
    """Every stored activation matrix with its place, in order."""
    return [
        (f"{layer}.{expert}.{part}", getattr(acts, part))
        for layer, experts in enumerate(fp.blocks)
        for expert, acts in enumerate(experts)
        for part in ("gate", "up", "gate_scale", "up_scale")
    ]


# -- streaming equals the live forward pass ----------------------------------------------------------------------


def _live_activations(folder: Path, ids: np.ndarray) -> list[list[MLPActivations]]:
    """The reference: the whole model loaded by transformers, each MLP's input caught by a forward pre-hook."""
    checkpoint = open_checkpoint(folder)
    adapter = adapter_for(checkpoint)
    inputs = mlp_inputs(load_causal_lm(checkpoint), adapter, ids)
    return [glu_activations(x, adapter.mlp(layer), activation=adapter.shape.hidden_act)
            for layer, x in enumerate(inputs)]


@pytest.mark.parametrize("name", sorted(FAMILIES) + sorted(SLIDING))
def test_streamed_activations_equal_the_live_forward_pass(name: str, tmp_path: Path) -> None:
    """Block 1's inputs are block 0's outputs, so they also check that block 0 ran with its real weights (experts
    fused the way transformers holds them), the right mask (sliding or causal) and the right positions."""
    save_random((FAMILIES[name].config if name in FAMILIES else SLIDING[name])(), tmp_path)
    ids = _ids()
    checkpoint = open_checkpoint(tmp_path)
    streamed = list(stream_mlp_activations(checkpoint, adapter_for(checkpoint), ids))
    live = _live_activations(tmp_path, ids)
    assert [layer for layer, _ in streamed] == list(range(LAYERS))
    assert [len(experts) for _, experts in streamed] == EXPERTS.get(name, [1] * LAYERS)
    for (layer, experts), expected in zip(streamed, live, strict=True):
        for expert, (got, want) in enumerate(zip(experts, expected, strict=True)):
            for part in ("gate", "up"):
                g, w = getattr(got, part), getattr(want, part)
                assert g.dtype == np.float32 and g.shape == w.shape and g.shape[1] == ids.size
                scale = np.abs(w).max()
                np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale, err_msg=f"{layer}.{expert}.{part}")


#: Every torch device this machine has: the CPU always, CUDA where present (a GPU machine runs both).
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "gemma2", "mixtral"])
def test_streaming_on_a_device_matches_the_cpu(name: str, device: str, tiny: Callable[[str], Path]) -> None:
    """float32 on any device gives the CPU's activations (TF32 stays off); the device's default dtype (bfloat16 on
    CUDA) stays within its rounding of them."""
    checkpoint = open_checkpoint(tiny(name))
    adapter, ids = adapter_for(checkpoint), _ids()
    reference = [experts for _, experts in stream_mlp_activations(checkpoint, adapter, ids)]
    for dtype, tolerance in ((torch.float32, 1e-4), (None, 3e-2)):
        got = [experts for _, experts in stream_mlp_activations(checkpoint, adapter, ids, device=device, dtype=dtype)]
        for layer, (experts, expected) in enumerate(zip(got, reference, strict=True)):
            for g, w in zip(experts, expected, strict=True):
                for part in ("gate", "up"):
                    want = getattr(w, part)
                    np.testing.assert_allclose(getattr(g, part), want, rtol=0, atol=tolerance * np.abs(want).max(),
                                               err_msg=f"{device} {dtype} block {layer} {part}")


# -- one block at a time -----------------------------------------------------------------------------------------


@dataclass
class _ReadSpy:
    """Wraps a Checkpoint's reads: what was read since the last `take`, and whether earlier blocks were freed.

    When a tensor of block k is read, the memory of every tensor handed out for an earlier block must already be
    freed: a weak reference to each returned tensor's storage tells, whatever holds it (a module parameter, a
    view, a list). CPU float32 weights are used in place, never copied, so their storage is the block's memory.
    """

    checkpoint: Checkpoint
    adapter: ArchitectureAdapter
    whole: set[str] = field(default_factory=set)
    rows: dict[str, list[int]] = field(default_factory=dict)
    handed_out: list[tuple[int | None, str, weakref.ref]] = field(default_factory=list)
    alive_at_read: list[str] = field(default_factory=list)

    def attach(self, monkeypatch: pytest.MonkeyPatch) -> None:
        get, get_rows = self.checkpoint.get, self.checkpoint.get_rows
        monkeypatch.setattr(self.checkpoint, "get", lambda name: self._record(name, get(name)))
        monkeypatch.setattr(
            self.checkpoint, "get_rows", lambda name, rows: self._record(name, get_rows(name, rows), rows)
        )

    def take(self) -> tuple[set[str], dict[str, list[int]]]:
        taken = self.whole, self.rows
        self.whole, self.rows = set(), {}
        return taken

    def _block(self, name: str) -> int | None:
        layers = range(self.adapter.shape.n_layers)
        return next((k for k in layers if name.startswith(self.adapter.block_prefix(k))), None)

    def _record(self, name: str, tensor: torch.Tensor, rows: Sequence[int] | None = None) -> torch.Tensor:
        block = self._block(name)
        if block is not None:
            self.alive_at_read += [
                f"{old} alive when reading {name}"
                for old_block, old, ref in self.handed_out
                if old_block is not None and old_block < block and ref() is not None
            ]
        if rows is None:
            self.whole.add(name)
        else:
            self.rows[name] = [int(r) for r in rows]
        self.handed_out.append((block, name, weakref.ref(tensor.untyped_storage())))
        return tensor


@pytest.mark.parametrize("name", ["llama", "mixtral", "gemma3"])
def test_streaming_reads_one_block_at_a_time_and_frees_it_before_the_next(
    name: str, tiny: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between two yields only that block's tensors are read, and the previous block's are no longer referenced;
    the embedding is read as the rows the ids use, nothing else outside the blocks (no lm_head, no vision tower)."""
    checkpoint = open_checkpoint(tiny(name))
    adapter = adapter_for(checkpoint)
    spy = _ReadSpy(checkpoint, adapter)
    spy.attach(monkeypatch)
    ids = _ids()
    between_yields = [spy.take() for _ in stream_mlp_activations(checkpoint, adapter, ids)]
    assert len(between_yields) == LAYERS
    names = checkpoint.tensor_names()
    for layer, (whole, rows) in enumerate(between_yields):
        assert whole == {n for n in names if n.startswith(adapter.block_prefix(layer))}
        if layer == 0:
            assert list(rows) == [n for n in names if n.endswith("embed_tokens.weight")]
            assert sorted(next(iter(rows.values()))) == np.unique(ids).tolist()
        else:
            assert rows == {}
    assert spy.alive_at_read == []


# -- fingerprint files -------------------------------------------------------------------------------------------


def test_fingerprint_round_trip_is_exact(tiny: Callable[[str], Path], tmp_path: Path) -> None:
    """An MoE model (5 MLPs in block 0, 1 in block 1): what is read back is what was computed, bit for bit."""
    folder = tiny("qwen2_moe")
    fp = fingerprint_model(folder, inputs=SPEC)
    file = tmp_path / "nested" / "qwen2_moe.safetensors"
    digest = write_fingerprint(fp, file)
    assert digest == hashlib.sha256(file.read_bytes()).hexdigest()
    assert list(file.parent.iterdir()) == [file]  # no temporary file left behind

    back = read_fingerprint(file)
    assert back.meta == fp.meta == read_fingerprint_meta(file)
    assert [len(experts) for experts in back.blocks] == EXPERTS["qwen2_moe"]
    for (place, got), (_, want) in zip(_parts(back), _parts(fp), strict=True):
        dtype = np.float32 if place.endswith("scale") else np.float16
        assert got.dtype == want.dtype == dtype and np.array_equal(got, want), place

    checkpoint = open_checkpoint(folder)
    stream = stream_mlp_activations(checkpoint, adapter_for(checkpoint), _ids())
    streamed = [acts for _, block in stream for acts in block]
    stored = [acts for experts in back.blocks for acts in experts]
    for s, a in zip(stored, streamed, strict=True):
        computed = stored_activations(a, "float16")
        assert all(np.array_equal(getattr(s, part), getattr(computed, part))
                   for part in ("gate", "up", "gate_scale", "up_scale"))
        assert np.allclose(s.values("gate"), a.gate, rtol=1e-3, atol=1e-3 * np.abs(a.gate).max())
    meta = back.meta
    assert (meta.input_set, meta.input_spec) == (canonical_inputs(VOCAB, SPEC).id, asdict(SPEC))
    assert (meta.n_layers, meta.n_experts, meta.intermediate_size) == (LAYERS, 4, 16)
    assert meta.format_version == FINGERPRINT_FORMAT
    assert set(meta.tensor_hashes) == set(checkpoint.tensor_names())
    assert meta.parameter_count == sum(p.numel() for p in load_file(folder / "model.safetensors").values())


def test_the_validation_pass_hashes_exactly_what_the_fingerprint_would(tiny: Callable[[str], Path]) -> None:
    """A scan hashes while it checks values, and hands the hashes to the fingerprint to spare a second read."""
    folder = tiny("llama")
    valid = validate_checkpoint(folder, chunk_bytes=4096)  # several chunks per tensor
    assert valid.tensor_hashes == fingerprint_model(folder, inputs=SPEC).meta.tensor_hashes
    rehashed = fingerprint_model(folder, inputs=SPEC, tensor_hashes=valid.tensor_hashes)
    assert rehashed.meta.tensor_hashes == valid.tensor_hashes
    with pytest.raises(ValueError, match="not those of this checkpoint"):
        fingerprint_model(folder, inputs=SPEC, tensor_hashes={"model.norm.weight": "0" * 64})


def test_the_fingerprint_command_reads_each_tensor_once(tiny: Callable[[str], Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Given no hashes, the value check rides on the forward pass's reads: a spy on the checkpoint's two ways of
    reading a whole tensor (the value pass's chunked file read, the forward pass's get) sees no tensor read by both,
    and every tensor read by one of them (hashed and checked all the same)."""
    folder, out = tiny("llama"), tmp_path / "llama.fp"
    reads: Counter[tuple[str, str]] = Counter()
    real_get, real_stored = Checkpoint.get, Checkpoint._stored_bytes

    def get(self: Checkpoint, name: str) -> torch.Tensor:
        reads[name, "forward"] += 1
        return real_get(self, name)

    def stored_bytes(self: Checkpoint, name: str, chunk_bytes: int):
        reads[name, "value pass"] += 1
        yield from real_stored(self, name, chunk_bytes)

    monkeypatch.setattr(Checkpoint, "get", get)
    monkeypatch.setattr(Checkpoint, "_stored_bytes", stored_bytes)
    result = runner.invoke(app, ["fingerprint", str(folder), "--out", str(out)])
    assert result.exit_code == 0, result.output
    monkeypatch.undo()
    forward = {name for name, kind in reads if kind == "forward"}
    checked = {name for name, kind in reads if kind == "value pass"}
    names = set(open_checkpoint(folder).tensor_names())
    assert forward & checked == set() and forward | checked == names
    assert any(".layers." in n for n in forward) and {"model.embed_tokens.weight", "model.norm.weight"} <= checked
    assert all(reads[name, "value pass"] == 1 for name in checked)
    assert read_fingerprint(out).meta.tensor_hashes == validate_checkpoint(folder).tensor_hashes


@pytest.mark.parametrize("tensor", ["model.layers.1.mlp.down_proj.weight", "model.embed_tokens.weight"])
def test_the_one_pass_value_check_refuses_a_nan_as_the_value_pass_does(tiny: Callable[[str], Path], tmp_path: Path,
                                                                       tensor: str) -> None:
    """A NaN in a block (found as the forward pass reads it) or outside the blocks (checked before): the same
    refusal as the separate value pass gives, and no fingerprint file."""
    folder = tmp_path / "nan"
    shutil.copytree(tiny("llama"), folder)
    weights = load_file(folder / "model.safetensors")
    weights[tensor].view(-1)[5] = float("nan")
    save_torch_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as separate:
        validate_checkpoint(folder)
    result = runner.invoke(app, ["fingerprint", str(folder), "--out", str(tmp_path / "x.fp")])
    assert result.exit_code == EXIT_REFUSED and not (tmp_path / "x.fp").exists()
    assert f"tensor {tensor} contains NaN (first at flat index 5 " in str(separate.value)
    assert str(separate.value).split(": ", 1)[1] in " ".join(result.output.split())


@pytest.fixture(scope="module")
def llama_fingerprint(tiny: Callable[[str], Path]) -> Fingerprint:
    return fingerprint_model(tiny("llama"), inputs=SPEC)


def _flip_a_data_byte(file: Path) -> None:
    data = bytearray(file.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 11] ^= 0x40
    file.write_bytes(bytes(data))


def _truncate(file: Path) -> None:
    data = file.read_bytes()
    file.write_bytes(data[: len(data) - 64])


def _other_format(file: Path) -> None:
    fp = read_fingerprint(file)
    write_fingerprint(replace(fp, meta=replace(fp.meta, format_version=FINGERPRINT_FORMAT + 1)), file)


def _plain_safetensors(file: Path) -> None:
    save_file({"weight": np.zeros((2, 2), dtype=np.float32)}, str(file))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_flip_a_data_byte, "the activations do not match their recorded sha256"),
        (_truncate, "is not a readable fingerprint"),
        (_other_format, f"format {FINGERPRINT_FORMAT + 1}, but this hubtrace .* reads format {FINGERPRINT_FORMAT}; "
                        "re-fingerprint"),
        (_plain_safetensors, "is a safetensors file but not a hubtrace fingerprint"),
    ],
)
def test_damaged_or_foreign_files_are_refused_in_one_line(
    llama_fingerprint: Fingerprint, tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    file = tmp_path / "fp.safetensors"
    write_fingerprint(llama_fingerprint, file)
    damage(file)
    with pytest.raises(FingerprintError, match=message) as caught:
        read_fingerprint(file)
    assert "\n" not in str(caught.value) and str(file) in str(caught.value)


def test_a_unit_of_any_scale_keeps_its_direction_in_float16_storage(tiny: Callable[[str], Path],
                                                                      tmp_path: Path) -> None:
    """Block 1's gate weights scaled by 1e6 give gate outputs beyond float16's 65504, and one up row scaled by 1e-10
    (its output column by 1e10) gives outputs below its smallest subnormal (6e-8): each unit is stored as its row over
    its peak (float16) and the
    peak (float32), so neither overflows nor flushes to zero; the directions are those of float32 storage to float16's
    precision, and `values` gives the activations back."""
    folder = tmp_path / "loud"
    folder.mkdir()
    (folder / "config.json").write_text((tiny("llama") / "config.json").read_text())
    weights = load_file(tiny("llama") / "model.safetensors")
    weights["model.layers.1.mlp.gate_proj.weight"] *= 1e6
    weights["model.layers.0.mlp.up_proj.weight"][3] *= 1e-10
    weights["model.layers.0.mlp.down_proj.weight"][:, 3] *= 1e10  # the outputs as they were: a rescaled unit
    save_torch_file(weights, str(folder / "model.safetensors"))

    half = fingerprint_model(folder, inputs=SPEC)
    full = fingerprint_model(folder, inputs=SPEC, storage_dtype="float32")
    write_fingerprint(half, tmp_path / "loud.safetensors")
    back = read_fingerprint(tmp_path / "loud.safetensors")
    loud, quiet = back.blocks[1][0], back.blocks[0][0]
    assert loud.gate.dtype == quiet.up.dtype == np.float16 and loud.gate_scale.dtype == np.float32
    assert np.abs(loud.gate).max() == 1.0 and loud.gate_scale.max() > np.finfo(np.float16).max
    assert np.abs(quiet.up[3]).max() == 1.0 and 0 < quiet.up_scale[3] < 1e-7
    for a, b in ((loud.gate, full.blocks[1][0].gate), (quiet.up, full.blocks[0][0].up)):
        assert np.abs(a.astype(np.float32) - b).max() <= 1e-3
    assert np.isfinite(loud.values("gate")).all() and np.abs(loud.values("gate")).max() > 1e5


# -- comparability -----------------------------------------------------------------------------------------------


def test_comparable_only_on_the_same_input_set(tiny: Callable[[str], Path], llama_fingerprint: Fingerprint) -> None:
    folder = tiny("llama")
    assert llama_fingerprint.comparable_with(fingerprint_model(folder, inputs=SPEC)) is None
    for other in (replace(SPEC, seed=1), replace(SPEC, n_sequences=4), replace(SPEC, seq_len=9)):
        reason = llama_fingerprint.comparable_with(fingerprint_model(folder, inputs=other))
        assert reason is not None and "different input sets" in reason
        assert canonical_inputs(VOCAB, other).id in reason and llama_fingerprint.meta.input_set in reason
    narrow = fingerprint_model(folder, inputs=SPEC, token_range=100)
    reason = llama_fingerprint.comparable_with(narrow)
    assert reason is not None and "different ranges" in reason and "with token range 100" in reason
    assert "with token range 100" in (narrow.comparable_with(llama_fingerprint) or "")
    with pytest.raises(IncomparableError, match="token range 100"):
        compare_fingerprints(llama_fingerprint, narrow)


# -- comparisons from files equal live comparisons ---------------------------------------------------------------


@pytest.fixture(scope="module")
def zoo_files(zoo: Zoo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("zoo-fingerprints")
    files = {model: folder / f"{model.replace('/', '--')}.safetensors" for model in (BASE, CHAT, TWIN)}
    for model, file in files.items():
        write_fingerprint(fingerprint_model(zoo[model].path, inputs=ZOO_SPEC), file)
    return files


@pytest.mark.parametrize("statistic", ["match", "hidden"])
@pytest.mark.parametrize("other", [CHAT, TWIN])
def test_fingerprint_files_give_the_live_comparison(
    zoo: Zoo, zoo_files: dict[str, Path], other: str, statistic: str
) -> None:
    live = compare_models(zoo[BASE].path, zoo[other].path, statistic, inputs=ZOO_SPEC)
    from_files = compare_fingerprints(read_fingerprint(zoo_files[BASE]), read_fingerprint(zoo_files[other]), statistic)
    assert from_files.log10_p == live.log10_p
    assert from_files.layers == live.layers and len(live.layers) == 4
    assert (from_files.inputs, from_files.notes) == (live.inputs, live.notes)
    assert (live.log10_p < -10) == (other == CHAT)  # the fine-tune is found, the independent twin is not


@pytest.mark.parametrize("device", DEVICES)
def test_comparison_on_a_device_gives_the_numpy_result(zoo_files: dict[str, Path], device: str) -> None:
    """Cosine matrices on the device (and candidate selection there) lead to the same matchings, hence the same
    p-values, as the numpy path."""
    base = read_fingerprint(zoo_files[BASE])
    for other in (CHAT, TWIN):
        fp = read_fingerprint(zoo_files[other])
        on_device = compare_fingerprints(base, fp, device=device)
        on_cpu = compare_fingerprints(base, fp)
        assert [layer.rho for layer in on_device.layers] == [layer.rho for layer in on_cpu.layers]
        assert on_device.log10_p == compare_fingerprints(base, fp).log10_p


# -- the command line --------------------------------------------------------------------------------------------


def test_cli_fingerprint_writes_a_readable_file_and_reports_it(zoo: Zoo, tmp_path: Path) -> None:
    file = tmp_path / "chat.safetensors"
    args = ["fingerprint", str(zoo[CHAT].path), "--out", str(file), "--json", "--sequences", "8", "--seq-len", "32"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    meta = read_fingerprint(file).meta
    assert summary["path"] == str(file) and summary["bytes"] == file.stat().st_size
    assert summary["sha256"] == hashlib.sha256(file.read_bytes()).hexdigest()
    assert summary["input_set"] == meta.input_set == canonical_inputs(256, ZOO_SPEC).id
    assert (summary["n_layers"], summary["dtype"], summary["parameter_count"]) == (4, "float16", meta.parameter_count)


def test_cli_test_with_a_fingerprint_side_equals_the_live_test(zoo: Zoo, zoo_files: dict[str, Path]) -> None:
    """The file fixes the input set, so the folder side is fingerprinted on it without repeating the options."""
    options = ["--json", "--sequences", "8", "--seq-len", "32"]
    live = runner.invoke(app, ["test", str(zoo[BASE].path), str(zoo[CHAT].path), *options])
    mixed = runner.invoke(app, ["test", str(zoo[BASE].path), str(zoo_files[CHAT]), "--json"])
    assert live.exit_code == mixed.exit_code == 0, live.output + mixed.output
    live_data, mixed_data = json.loads(live.stdout), json.loads(mixed.stdout)
    assert mixed_data["log10_p"] == live_data["log10_p"] < -10
    assert mixed_data["layers"] == live_data["layers"] and mixed_data["inputs"] == live_data["inputs"]


def test_cli_refuses_a_corrupt_fingerprint_in_one_line(zoo: Zoo, zoo_files: dict[str, Path], tmp_path: Path) -> None:
    corrupt = tmp_path / "chat.safetensors"
    corrupt.write_bytes(zoo_files[CHAT].read_bytes())
    _flip_a_data_byte(corrupt)
    result = runner.invoke(app, ["test", str(zoo[BASE].path), str(corrupt)])
    assert result.exit_code == EXIT_REFUSED
    assert "Traceback" not in result.output and result.stdout == ""
    assert result.stderr.startswith("hubtrace: error: ") and result.stderr.count("\n") == 1
    assert "recorded sha256" in result.stderr
