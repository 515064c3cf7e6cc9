"""PEFT LoRA adapters read through their base: the low-rank update applied to each weight as it is read.

An adapter-only upload (`adapter_config.json` + `adapter_model.safetensors`, as PEFT's `save_pretrained` writes it)
holds, for each adapted linear map, two small matrices A (r, in) and B (out, r); the model it stands for has
W + s * B @ A in their place, s = lora_alpha / r (or / sqrt(r) with rsLoRA). `LoraCheckpoint` is the base
checkpoint seen through the adapter: every tensor the adapter changes is computed when it is read, one tensor at a
time, so fingerprinting streams the adapted model block by block and no merged copy is ever written. Besides the
low-rank pairs PEFT stores whole tensors that replace the base's (`modules_to_save`: a retrained head or embedding,
possibly of a resized vocabulary; trained biases; an adapted embedding's `base_layer`), which are read as stored.

Only LoRA is read; every other PEFT method, and the LoRA variants whose weights are not W + s * B @ A (DoRA,
activated LoRA, layer replication, trainable tokens, LoRA on parameters), is refused by name. The adapter's
tensors are checked like any safetensors file (`scanner.reading.checkpoint`), and nothing in the folder is executed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers.pytorch_utils import Conv1D

from scanner.errors import CheckpointError, UnsafeCheckpointError, UnsupportedAdapterError
from scanner.reading.architectures.config import transformers_config
from scanner.reading.architectures.module_tree import build_meta_model
from scanner.reading.checkpoint import TOKENIZER_FILES, Checkpoint, _read_header, _TensorEntry, read_json_file

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: PEFT's pickle weights (older PEFT, or `safe_serialization=False`): never unpickled.
ADAPTER_PICKLE = "adapter_model.bin"
#: Every tensor name in a saved PEFT model starts so (the PeftModel's `base_model.model`).
PEFT_PREFIX = "base_model.model."

#: adapter_config.json options whose adapted weights are not W + s * B @ A, each with what it does instead.
UNREAD_OPTIONS: dict[str, str] = {
    "use_dora": "DoRA rescales each adapted weight's columns by a learned magnitude",
    "layer_replication": "layer replication stacks copies of base layers that the adapter then adapts separately",
    "alora_invocation_tokens": "activated LoRA applies its update only after its invocation tokens",
    "target_parameters": "LoRA on parameters (MoE expert tensors) adapts nn.Parameter tensors, not linear maps",
    "trainable_token_indices": "trainable tokens replace single embedding rows by a separate delta",
    "use_qalora": "QA-LoRA pools the input before its low-rank update",
    "use_bdlora": "BD-LoRA's block-diagonal factors",
    "megatron_config": "Megatron-parallel LoRA layers",
}
#: The longest base name read: a Hub id is at most 96 characters, a path at most 4096 bytes (PATH_MAX on Linux).
MAX_BASE_NAME_CHARS = 4096
#: Characters that make a key of alpha_pattern a regular expression (PEFT matches its keys as regexes; hubtrace reads
#: module-name suffixes only, so a hostile pattern cannot cost exponential time).
_PATTERN_CHARS = set("^$*+?{}[]\\|()")


@dataclass(frozen=True)
class LoraSpec:
    """What adapter_config.json says about a LoRA adapter, checked."""

    base: str                        # base_model_name_or_path: a Hub id or a local path
    base_revision: str | None        # the base's revision it was trained on, when PEFT recorded one
    alpha: float
    rslora: bool                     # scale by alpha / sqrt(r) instead of alpha / r
    alpha_pattern: dict[str, float]  # module-name suffix -> its own alpha
    fan_in_fan_out: bool             # the adapted weights are stored (in, out), as GPT-2's Conv1D

    def scaling(self, module: str, rank: int) -> float:
        alpha = next((a for key, a in self.alpha_pattern.items() if module == key or module.endswith("." + key)),
                     self.alpha)
        return alpha / (math.sqrt(rank) if self.rslora else rank)


@dataclass(frozen=True)
class _Update:
    """How one base tensor changes: s * B @ A added to a weight (``transposed``: to a weight stored (in, out), or
    an embedding's (vocab, d)), or s * b_B added to a bias."""

    kind: Literal["matrix", "bias"]
    a: str | None
    b: str
    scaling: float
    transposed: bool = False


def is_adapter_folder(path: Path) -> bool:
    """A PEFT adapter-only folder: adapter_config.json and no config.json of its own."""
    return path.is_dir() and os.path.lexists(path / ADAPTER_CONFIG) and not os.path.lexists(path / "config.json")


def read_adapter_config(folder: Path) -> LoraSpec:
    """The adapter's config, or a one-line refusal naming what hubtrace does not read (another PEFT method, a LoRA
    variant, a config without a base)."""
    data = read_json_file(folder / ADAPTER_CONFIG)
    where = folder / ADAPTER_CONFIG
    if not isinstance(data, dict):
        raise CheckpointError(f"{where} must hold a JSON object, not {type(data).__name__}")
    peft_type = data.get("peft_type")
    if peft_type != "LORA":
        raise UnsupportedAdapterError(f"{where}: PEFT method {str(peft_type)[:40]!r} is not supported; hubtrace reads "
                                      "LoRA adapters (peft_type LORA)")
    for option, what in UNREAD_OPTIONS.items():
        if data.get(option):
            raise UnsupportedAdapterError(f"{where}: {option} is set, and {what}; hubtrace reads plain LoRA "
                                          "(W + s * B @ A) only")
    base = data.get("base_model_name_or_path")
    if not isinstance(base, str) or not base.strip():
        raise CheckpointError(f"{where} names no base model (base_model_name_or_path is empty), so there is nothing "
                              "to apply the adapter to")
    if len(base) > MAX_BASE_NAME_CHARS:
        raise CheckpointError(f"{where}: base_model_name_or_path is {len(base):,} characters long, longer than any "
                              f"model id or path ({MAX_BASE_NAME_CHARS:,} at most): {base[:60]!r}...")
    alpha = data.get("lora_alpha", 8)
    patterns = data.get("alpha_pattern") or {}
    if not _is_number(alpha) or not isinstance(patterns, dict) or not all(
            isinstance(k, str) and _is_number(v) for k, v in patterns.items()):
        raise CheckpointError(f"{where}: lora_alpha and alpha_pattern must be numbers")
    regexes = sorted(k for k in patterns if _PATTERN_CHARS & set(k))
    if regexes:
        raise UnsupportedAdapterError(f"{where}: alpha_pattern key {regexes[0][:60]!r} is a regular expression; "
                                      "hubtrace reads module-name keys only")
    revision = data.get("revision")
    return LoraSpec(base=base.strip(), base_revision=revision if isinstance(revision, str) and revision else None,
                    alpha=float(alpha), rslora=bool(data.get("use_rslora")),
                    alpha_pattern={k: float(v) for k, v in patterns.items()},
                    fan_in_fan_out=bool(data.get("fan_in_fan_out")))


class LoraCheckpoint(Checkpoint):
    """A base checkpoint seen through a LoRA adapter: the tensors the adapter changes are float32, computed when
    read; every other tensor is the base's, as stored. ``path`` is the adapter folder, ``base_path`` the base's."""

    def __init__(self, folder: Path, base: Checkpoint, adapter: Checkpoint, spec: LoraSpec,
                 updates: dict[str, list[_Update]], replaced: dict[str, str], config: dict[str, Any],
                 unstored: Sequence[str] = ()) -> None:
        entries = dict(base._entries)
        for name in {*updates, *replaced}:
            shape = adapter.shape(replaced[name]) if name in replaced else base.shape(name)
            entries[name] = _TensorEntry(folder, torch.float32, tuple(shape))
        ranks = sorted({adapter.shape(u.a)[0] for ups in updates.values() for u in ups if u.a is not None})
        note = (f"a PEFT LoRA adapter (rank {'/'.join(map(str, ranks)) or 'none'}, {len(updates)} tensors updated, "
                f"{len(replaced)} replaced) applied to its base {spec.base} ({base.path}) as each block was read; "
                "no merged copy was written")
        listed = ", ".join(unstored[:3]) + (", ..." if len(unstored) > 3 else "")
        ignored = (f"the adapter also changes {len(unstored)} tensors its base does not store ({listed}): ignored, "
                   "no fingerprint reads them",) if unstored else ()
        super().__init__(folder, config, entries, (*base.notes, note, *ignored))
        self.spec = spec
        self.base_path = base.path
        self._base, self._adapter = base, adapter
        self._updates, self._replaced = updates, replaced

    def get(self, name: str) -> torch.Tensor:
        self._entry(name)
        if name not in self._updates and name not in self._replaced:
            return self._base.get(name)
        tensor = self._source(name).get(self._replaced.get(name, name)).float()
        for update in self._updates.get(name, ()):
            tensor = tensor + self._delta(update)
        if self.read_observer is not None:
            self.read_observer(name, tensor)
        return tensor

    def get_rows(self, name: str, rows: Sequence[int] | slice) -> torch.Tensor:
        """Rows of a tensor, the adapter's change computed for those rows only (an adapted embedding never costs
        its whole table)."""
        if name not in self._updates and name not in self._replaced:
            return self._base.get_rows(name, rows)
        out = self._source(name).get_rows(self._replaced.get(name, name), rows).float()
        wanted = list(range(*rows.indices(self.shape(name)[0]))) if isinstance(rows, slice) else [int(r) for r in rows]
        for update in self._updates.get(name, ()):
            out = out + self._delta(update, wanted)
        return out

    def _source(self, name: str) -> Checkpoint:
        return self._adapter if name in self._replaced else self._base

    def _delta(self, update: _Update, rows: list[int] | None = None) -> torch.Tensor:
        """s * B @ A (or its rows), in the stored tensor's layout; s * b for a bias."""
        b = self._adapter.get(update.b).float()
        if update.kind == "bias":
            return update.scaling * (b if rows is None else b[rows])
        a = self._adapter.get(update.a).float()
        if update.transposed:  # stored (in, out): row i is column i of B @ A
            return update.scaling * ((a if rows is None else a[:, rows]).T @ b.T)
        return update.scaling * ((b if rows is None else b[rows]) @ a)

    def _stored_bytes(self, name: str, chunk_bytes: int) -> Iterator[memoryview]:
        """The adapted float32 values of a tensor the adapter changes (one tensor in memory), the base's stored
        bytes otherwise: what the value pass hashes and checks."""
        if name not in self._updates and name not in self._replaced:
            yield from self._base._stored_bytes(name, chunk_bytes)
            return
        flat = memoryview(self.get(name).contiguous().numpy()).cast("B")
        for start in range(0, len(flat), chunk_bytes):
            yield flat[start : start + chunk_bytes]

    def tokenizer_hash(self) -> str | None:
        """The adapter folder's tokenizer when it ships one (a fine-tune that added tokens), else the base's."""
        return super().tokenizer_hash() if self._has_tokenizer() else self._base.tokenizer_hash()

    def tokenizer_base_vocab_size(self) -> int | None:
        return super().tokenizer_base_vocab_size() if self._has_tokenizer() else self._base.tokenizer_base_vocab_size()

    def _has_tokenizer(self) -> bool:
        return any(os.path.lexists(self.path / name) for name in TOKENIZER_FILES)

    def close(self) -> None:
        self._base.close()
        self._adapter.close()
        super().close()


def open_lora(folder: Path, base: Checkpoint) -> LoraCheckpoint:
    """The base seen through the adapter in ``folder``; CheckpointError (one line) for an adapter whose tensors do
    not fit its base, UnsupportedAdapterError for what hubtrace does not read."""
    spec = read_adapter_config(folder)
    if isinstance(base, LoraCheckpoint):
        raise UnsupportedAdapterError(f"{folder}: its base {spec.base} is itself a LoRA adapter; hubtrace reads one "
                                      "adapter on a full model")
    weights = folder / ADAPTER_WEIGHTS
    if not os.path.lexists(weights):
        if os.path.lexists(folder / ADAPTER_PICKLE):
            raise UnsafeCheckpointError(f"{folder} has only pickle adapter weights ({ADAPTER_PICKLE}); hubtrace never "
                                        "unpickles, convert them to safetensors first")
        raise CheckpointError(f"{folder} has {ADAPTER_CONFIG} but no {ADAPTER_WEIGHTS}")
    adapter = Checkpoint(folder, {}, _read_header(weights))
    updates, replaced, unstored = _plan(folder, spec, base, adapter)
    if not updates and not replaced:
        raise CheckpointError(f"{folder}: the adapter changes no tensor its base {base.path} stores "
                              f"({', '.join(unstored[:3]) or 'it holds none'})")
    config = _config_for(base, adapter, replaced)
    return LoraCheckpoint(folder, base, adapter, spec, updates, replaced, config, unstored)


def _plan(folder: Path, spec: LoraSpec, base: Checkpoint, adapter: Checkpoint
          ) -> tuple[dict[str, list[_Update]], dict[str, str], list[str]]:
    """Which base tensor each adapter tensor changes, and how (base tensor -> updates; base tensor -> the adapter
    tensor that replaces it), and the tensors it changes that the base does not store (a pooler or task head the
    adapter's model class had and the base checkpoint lacks: no fingerprint reads them)."""
    pairs: dict[str, dict[str, str]] = {}
    replaced: dict[str, str] = {}
    unstored: list[str] = []
    for name in adapter.tensor_names():
        if not name.startswith(PEFT_PREFIX):
            raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: tensor {name!r} is not a PEFT adapter tensor (no "
                                  f"{PEFT_PREFIX} prefix)")
        rest = name.removeprefix(PEFT_PREFIX)
        module, part = _lora_part(rest)
        if part is not None:
            pairs.setdefault(module, {})[part] = name
            if ".lora_embedding_" in rest:
                pairs[module]["embedding"] = name
        elif ".lora_" in rest or ".token_adapter." in rest:
            raise UnsupportedAdapterError(f"{folder / ADAPTER_WEIGHTS}: tensor {name!r} is a LoRA variant hubtrace "
                                          "does not read (plain LoRA A/B pairs only)")
        else:
            target = _base_tensor(base, rest.replace(".base_layer.", "."))
            if target is None:
                unstored.append(rest)
            else:
                replaced[target] = name
    updates: dict[str, list[_Update]] = {}
    conv1d = _Conv1DModules(base)
    for module, parts in sorted(pairs.items()):
        a, b = parts.get("A"), parts.get("B")
        if a is None or b is None:
            have, lacks = ("A", "B") if a is not None else ("B", "A")
            raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: {module} has lora_{have} without lora_{lacks}")
        target = _base_tensor(base, f"{module}.weight")
        if target is None:
            unstored.append(f"{module}.weight")
            continue
        stored = tuple(adapter.shape(replaced[target]) if target in replaced else base.shape(target))
        (rank, fan_in), (fan_out, rank_b) = _matrix(adapter, a), _matrix(adapter, b)
        if rank != rank_b:
            raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: {module}'s lora_A has rank {rank}, lora_B {rank_b}")
        if rank == 0:  # its scaling, alpha / r, has no value
            raise CheckpointError(f"{folder / ADAPTER_WEIGHTS}: {module}'s lora_A and lora_B have rank 0, so the "
                                  "adapter's scaling (lora_alpha / r) is undefined")
        if stored != (fan_out, fan_in) and stored != (fan_in, fan_out):
            raise CheckpointError(f"{folder}: the LoRA update of {module} is {[fan_out, fan_in]} but the base weight "
                                  f"is {list(stored)}")
        # (in, out) storage: an embedding's (vocab, d) table (A is (r, vocab)), GPT-2's Conv1D; a square weight's
        # layout is the model's, a rectangular one's its shape
        transposed = ("embedding" in parts or spec.fan_in_fan_out or conv1d.holds(module)
                      if fan_in == fan_out else stored == (fan_in, fan_out))
        updates.setdefault(target, []).append(_Update("matrix", a, b, spec.scaling(module, rank), transposed))
        if "bias" in parts:
            bias = _base_tensor(base, f"{module}.bias")
            if bias is None:
                raise CheckpointError(f"{folder}: the adapter's lora_B of {module} has a bias, and its base stores "
                                      f"no bias for {module}")
            updates.setdefault(bias, []).append(_Update("bias", None, parts["bias"], spec.scaling(module, rank)))
    return updates, replaced, unstored


def _lora_part(name: str) -> tuple[str, str | None]:
    """(module, which LoRA tensor) for a LoRA pair's tensor name, (name, None) for anything else."""
    for suffix, part in ((".lora_A.weight", "A"), (".lora_B.weight", "B"), (".lora_B.bias", "bias"),
                         (".lora_embedding_A", "A"), (".lora_embedding_B", "B")):
        if name.endswith(suffix):
            return name.removesuffix(suffix), part
    return name, None


def _base_tensor(base: Checkpoint, name: str) -> str | None:
    """The base's stored name for a module path of the adapter: the same name, or the one stored under another
    prefix (an adapter of BertModel on a checkpoint saved as BertForMaskedLM, and the reverse); None when the base
    stores no such tensor."""
    parts = name.split(".")
    for start in range(len(parts) - 1):
        candidate = ".".join(parts[start:])
        if base.has(candidate):
            return candidate
        matches = [n for n in base.tensor_names() if n.endswith("." + candidate)]
        if len(matches) == 1:
            return matches[0]
    return None


def _matrix(adapter: Checkpoint, name: str) -> tuple[int, int]:
    shape = adapter.shape(name)
    if len(shape) != 2:
        raise CheckpointError(f"{adapter.path}: LoRA tensor {name} has shape {list(shape)}, not a matrix")
    return int(shape[0]), int(shape[1])


class _Conv1DModules:
    """Which modules of the base model are transformers Conv1D layers (weight stored (in, out)), asked of the model
    built on the meta device once, and only if a square weight leaves the layout open."""

    def __init__(self, base: Checkpoint) -> None:
        self._base = base
        self._model: torch.nn.Module | None = None

    def holds(self, module: str) -> bool:
        if self._model is None:
            self._model = build_meta_model(self._base, transformers_config(self._base))
        parts = module.split(".")
        for start in range(len(parts)):  # the adapter's path may carry a prefix the model class lacks
            try:
                return isinstance(self._model.get_submodule(".".join(parts[start:])), Conv1D)
            except AttributeError:
                continue
        return False


def _config_for(base: Checkpoint, adapter: Checkpoint, replaced: dict[str, str]) -> dict[str, Any]:
    """The base's config, with the vocabulary a replaced embedding or head resized (a fine-tune that added tokens
    saves both whole)."""
    config = dict(base.config)
    vocab = config.get("vocab_size")
    for target, name in replaced.items():
        old, new = base.shape(target), adapter.shape(name)
        if old == new:
            continue
        if not (isinstance(vocab, int) and old[0] == vocab and old[1:] == new[1:]):
            raise CheckpointError(f"{adapter.path}: the adapter replaces {target} {list(old)} with a tensor of shape "
                                  f"{list(new)}")
        config["vocab_size"] = int(new[0])
    return config


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
