"""A corpus of broken model folders, cut from one good model, each with the reason hubtrace must give for it.

Used by the validation tests and by the scan tests (one ``scan_errors`` row per entry). Each entry is a real file
layout of the kind found on a hub: a truncated or lying safetensors file, pickle-only weights, remote code,
non-finite weights, a config that disagrees with its tensors, link loops and links out of the folder. The pickle
and the remote-code files are live: unpickling the one or importing the other creates the file that
`code_marker(root)` names, so a test can assert that hubtrace never ran them.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

ORG = "broken"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
#: Hidden, so that discovery (which skips dot-files) never mistakes it for a model.
CODE_MARKER = ".hubtrace-code-ran"
#: Five gibibytes: what the lying header claims for itself.
HUGE_HEADER = 5 << 30


def code_marker(root: Path) -> Path:
    """The file that appears if anything ever unpickles or imports code from the corpus under `root`."""
    return Path(root).resolve() / CODE_MARKER


@dataclass(frozen=True)
class BrokenModel:
    """One corpus entry: its folder name under `ORG`, the fragment its refusal must contain, and how to build it."""

    name: str
    reason: str
    unsafe: bool  # refused as UnsafeCheckpointError (running code, leaving the folder), not as merely broken
    build: Callable[[Path, Path, Path], None]  # (folder, good model folder, code marker)

    @property
    def model_id(self) -> str:
        return f"{ORG}/{self.name}"


def build_broken_corpus(root: Path, good_model: Path) -> dict[str, str]:
    """Write every `CORPUS` entry as ``root/broken/<name>/`` from `good_model`; model id -> expected reason fragment.

    Rebuilds entries that already exist, so calling it twice on one root gives the same corpus.
    """
    root, good_model = Path(root).resolve(), Path(good_model).resolve()
    for entry in CORPUS:
        folder = root / entry.model_id
        if os.path.lexists(folder):
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        entry.build(folder, good_model, code_marker(root))
    return {entry.model_id: entry.reason for entry in CORPUS}


# -- builders ----------------------------------------------------------------------------------------------------


def _copy(folder: Path, good: Path) -> None:
    for name in (CONFIG, WEIGHTS):
        shutil.copyfile(good / name, folder / name)


def _edit_config(folder: Path, good: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    _copy(folder, good)
    config = json.loads((good / CONFIG).read_text())
    edit(config)
    (folder / CONFIG).write_text(json.dumps(config, indent=2))


def _edit_tensor(folder: Path, good: Path, name: str, index: tuple[int, int], value: float) -> None:
    _copy(folder, good)
    tensors = load_file(str(good / WEIGHTS))
    tensors[name][index] = value
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})


def _split_safetensors(file: Path) -> tuple[bytes, dict[str, Any], bytes]:
    """(8-byte length prefix, header, data section) of a safetensors file."""
    raw = file.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    return raw[:8], json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _truncated(folder: Path, good: Path, _marker: Path) -> None:
    _copy(folder, good)
    raw = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(raw[:-100])


def _lying_offsets(folder: Path, good: Path, _marker: Path) -> None:
    """Two same-sized tensors whose headers point at the same bytes: every size checks out, the layout does not."""
    _copy(folder, good)
    _, header, data = _split_safetensors(folder / WEIGHTS)
    first, second = "model.layers.0.mlp.up_proj.weight", "model.layers.1.mlp.up_proj.weight"
    header[second]["data_offsets"] = list(header[first]["data_offsets"])
    raw_header = json.dumps(header).encode()
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", len(raw_header)) + raw_header + data)


def _huge_header(folder: Path, good: Path, _marker: Path) -> None:
    _copy(folder, good)
    raw = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(struct.pack("<Q", HUGE_HEADER) + raw[8:])


class _CreatesMarker:
    """Pickles to "call open(marker, 'a')": harmless, but it leaves a file behind if anyone ever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return open, (str(self.marker), "a")


def _pickle_only(folder: Path, good: Path, marker: Path) -> None:
    shutil.copyfile(good / CONFIG, folder / CONFIG)
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"state_dict": _CreatesMarker(marker)}))


def _remote_code(folder: Path, good: Path, marker: Path) -> None:
    """A model_type transformers does not ship, defined by Python files that leave the marker when imported."""

    def edit(config: dict[str, Any]) -> None:
        config["model_type"] = "hubtrace_custom"
        config["architectures"] = ["CustomForCausalLM"]
        config["auto_map"] = {
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModelForCausalLM": "modeling_custom.CustomForCausalLM",
        }

    _edit_config(folder, good, edit)
    code = f"from pathlib import Path\nPath({str(marker)!r}).touch()\n"
    for module in ("configuration_custom.py", "modeling_custom.py"):
        (folder / module).write_text(code)


def _nan_weights(folder: Path, good: Path, _marker: Path) -> None:
    _edit_tensor(folder, good, "model.layers.2.mlp.up_proj.weight", (5, 7), float("nan"))


def _inf_weights(folder: Path, good: Path, _marker: Path) -> None:
    _edit_tensor(folder, good, "model.layers.1.self_attn.o_proj.weight", (0, 3), float("-inf"))


def _config_dims(folder: Path, good: Path, _marker: Path) -> None:
    _edit_config(folder, good, lambda config: config.update(intermediate_size=2 * config["intermediate_size"]))


def _config_depth(folder: Path, good: Path, _marker: Path) -> None:
    _edit_config(folder, good, lambda config: config.update(num_hidden_layers=config["num_hidden_layers"] + 2))


def _unknown_architecture(folder: Path, good: Path, _marker: Path) -> None:
    _edit_config(
        folder, good, lambda config: config.update(model_type="perceiver_lm", architectures=["PerceiverLMForCausalLM"])
    )


def _empty(folder: Path, good: Path, _marker: Path) -> None:
    """Nothing: the folder was created empty."""


def _symlink_loop(folder: Path, good: Path, _marker: Path) -> None:
    shutil.copyfile(good / CONFIG, folder / CONFIG)
    os.symlink("loop.safetensors", folder / WEIGHTS)
    os.symlink(WEIGHTS, folder / "loop.safetensors")


def _symlink_escape(folder: Path, good: Path, _marker: Path) -> None:
    """Real, valid weights, but reached through a link that leaves the model folder."""
    shutil.copyfile(good / CONFIG, folder / CONFIG)
    os.symlink(good / WEIGHTS, folder / WEIGHTS)


def _missing_shard(folder: Path, good: Path, _marker: Path) -> None:
    shutil.copyfile(good / CONFIG, folder / CONFIG)
    tensors = load_file(str(good / WEIGHTS))
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    first = "model-00001-of-00002.safetensors"
    save_file({name: tensors[name] for name in shards[first]}, str(folder / first), metadata={"format": "pt"})
    weight_map = {name: shard for shard, members in shards.items() for name in members}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _invalid_json_config(folder: Path, good: Path, _marker: Path) -> None:
    _copy(folder, good)
    text = (good / CONFIG).read_text()
    (folder / CONFIG).write_text(text[: len(text) // 2])


CORPUS: tuple[BrokenModel, ...] = (
    BrokenModel("truncated-safetensors", "is truncated", False, _truncated),
    BrokenModel("lying-offsets", "overlap in the data section", False, _lying_offsets),
    BrokenModel("huge-header", f"header claims {HUGE_HEADER} bytes", False, _huge_header),
    BrokenModel("pickle-only", "only pickle weights", True, _pickle_only),
    BrokenModel("remote-code", "needs remote code", True, _remote_code),
    BrokenModel("nan-weights", "contains NaN", False, _nan_weights),
    BrokenModel("inf-weights", "contains Inf", False, _inf_weights),
    BrokenModel("config-dims", "but config.json implies", False, _config_dims),
    BrokenModel("config-depth", "config.json says num_hidden_layers", False, _config_depth),
    BrokenModel("unknown-architecture", "is not supported", False, _unknown_architecture),
    BrokenModel("empty-folder", "is empty", False, _empty),
    BrokenModel("symlink-loop", "symlink loop", False, _symlink_loop),
    BrokenModel("symlink-escape", "points outside the model", True, _symlink_escape),
    BrokenModel("missing-shard", "which is missing", False, _missing_shard),
    BrokenModel("invalid-json-config", "is not valid JSON", False, _invalid_json_config),
)
