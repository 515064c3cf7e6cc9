"""The merge a ``mergekit_config.yml`` declares: its method, its base model, and every model it takes blocks from, with
their block ranges.

mergekit writes this file beside a merge's weights (the YAML it was given: ``models:`` with per-model parameters,
or ``slices:`` of ``sources:`` with ``layer_range``, or the ``modules:`` form it normalises to), and people upload it
with the merge. It names a merge's parents more completely than most cards do, so a scan keeps it as declared
evidence for the lineage, like a card's ``base_model``. Like a card it is written by strangers: a file that does not
parse, or fields of the wrong type, give what could be read and a note, never an exception. Models are named by Hub
id (``org/name``, perhaps ``@revision``) or by a local path (``./org/name``, ``/models/org/name``), whose last two
parts are taken as the id in a hub laid out as ``org/name``; ``model+lora`` names a model with a LoRA applied (both
count as sources).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from scanner.declared.fields import YamlTooLarge, first_line, load_yaml, optional_string
from scanner.files import NotRegularFileError, open_regular_file

MERGE_CONFIG = "mergekit_config.yml"
MAX_CONFIG_BYTES = 1 << 20
"""A merge config is a few hundred bytes; reading more of a huge file would only cost memory."""
MAX_SOURCES = 1024
"""More model references than this are ignored (a hostile file cannot make a record huge)."""
BASE_METHODS = frozenset({"task_arithmetic", "ties", "dare_ties", "dare_linear", "breadcrumbs", "breadcrumbs_ties",
                          "della", "della_linear", "model_stock", "sce", "nuslerp", "slerp", "karcher"})
"""Methods whose ``base_model`` the merged models' changes are taken against (or, for SLERP, the first endpoint)."""


@dataclass(frozen=True)
class MergeSource:
    """One model a merge takes weights from, with the blocks [start, end) it takes when the config says."""

    model: str
    layers: tuple[int, int] | None = None


@dataclass(frozen=True)
class MergeDeclaration:
    """What a merge config declares; ``notes`` say what could not be read."""

    method: str | None = None
    base_model: str | None = None
    sources: tuple[MergeSource, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def parents(self) -> tuple[str, ...]:
        """Every model the merge names, in the config's order, the base model last when it is not a source."""
        seen = list(dict.fromkeys(s.model for s in self.sources))
        if self.base_model and self.base_model not in seen:
            seen.append(self.base_model)
        return tuple(seen)

    @property
    def stacked_blocks(self) -> int | None:
        """The block count a passthrough config stacks (None for other methods or when a range is missing)."""
        if self.method != "passthrough" or not self.sources or any(s.layers is None for s in self.sources):
            return None
        return sum(s.layers[1] - s.layers[0] for s in self.sources if s.layers is not None)

    def to_json(self) -> str:
        return json.dumps({"method": self.method, "base_model": self.base_model,
                           "sources": [{"model": s.model, "layers": list(s.layers) if s.layers else None}
                                       for s in self.sources], "notes": list(self.notes)})

    @classmethod
    def from_json(cls, text: str | None) -> MergeDeclaration | None:
        """The declaration a store row holds (None for none, or for a row the store cannot read back)."""
        if not text:
            return None
        try:
            data = json.loads(text)
            return cls(data.get("method"), data.get("base_model"),
                       tuple(MergeSource(s["model"], tuple(s["layers"]) if s.get("layers") else None)
                             for s in data.get("sources", ())), tuple(data.get("notes", ())))
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def read_merge_config(model_dir: Path) -> MergeDeclaration | None:
    """The declaration in ``model_dir/mergekit_config.yml``; None when there is no such file."""
    path = Path(model_dir) / MERGE_CONFIG
    try:
        with open_regular_file(path) as f:
            raw = f.read(MAX_CONFIG_BYTES)
    except FileNotFoundError:
        return None
    except NotRegularFileError:
        return MergeDeclaration(notes=(f"{MERGE_CONFIG} is not a regular file",))
    except OSError as e:
        return MergeDeclaration(notes=(f"{MERGE_CONFIG} unreadable: {e.strerror or e}",))
    return parse_merge_config(raw.decode("utf-8-sig", errors="replace"))


def parse_merge_config(text: str) -> MergeDeclaration:
    """The declaration in a merge config's text; what is malformed is left out with a note."""
    try:
        data = load_yaml(text)
    except YamlTooLarge as e:
        return MergeDeclaration(notes=(f"{MERGE_CONFIG} refused: {e}",))
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        return MergeDeclaration(notes=(f"{MERGE_CONFIG} is not valid YAML: {first_line(e)}",))
    if not isinstance(data, dict):
        return MergeDeclaration(notes=(f"{MERGE_CONFIG} holds a {type(data).__name__}, not a mapping",))
    notes: list[str] = []
    method = optional_string(data.get("merge_method"), "merge_method", notes)
    base = _reference(data.get("base_model"), "base_model", notes)
    sources: list[MergeSource] = []
    for entry in _entries(data.get("models"), "models", notes):
        sources += _sources(entry, None, notes)
    slice_lists = [data.get("slices")]
    modules = data.get("modules")
    if isinstance(modules, dict):
        slice_lists += [m.get("slices") for m in modules.values() if isinstance(m, dict)]
    for slice_list in slice_lists:
        for piece in _entries(slice_list, "slices", notes):
            for source in _entries(piece.get("sources"), "sources", notes):
                sources += _sources(source, _layer_range(source.get("layer_range"), notes), notes)
    if len(sources) > MAX_SOURCES:
        notes.append(f"{len(sources)} model references; the first {MAX_SOURCES} kept")
        sources = sources[:MAX_SOURCES]
    return MergeDeclaration(method.strip() or None if method else None, base, tuple(sources), tuple(notes))


def model_id_of(reference: str) -> str | None:
    """The hub id a config's model reference names: a Hub id as it is (without ``@revision``), a local path by its
    last two parts; None for something that names no model."""
    text = reference.strip().split("@", 1)[0].rstrip("/")
    parts = [p for p in text.split("/") if p not in ("", ".")]
    if len(parts) < 2 or ".." in parts[-2:]:
        return None
    return "/".join(parts[-2:])


def _entries(value: Any, field: str, notes: list[str]) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list):
        notes.append(f"{field} is a {type(value).__name__}, not a list; ignored")
        return []
    kept = [v for v in value if isinstance(v, dict)]
    if len(kept) != len(value):
        notes.append(f"{field}: {len(value) - len(kept)} entries that are not mappings ignored")
    return kept


def _reference(value: Any, field: str, notes: list[str]) -> str | None:
    """The model id of a ``model:`` or ``base_model:`` value (the model part of ``model+lora``)."""
    value = optional_string(value, field, notes)
    if value is None:
        return None
    found = model_id_of(value.split("+", 1)[0])
    if found is None:
        notes.append(f"{field} {value[:80]!r} names no model; ignored")
    return found


def _sources(entry: dict, layers: tuple[int, int] | None, notes: list[str]) -> list[MergeSource]:
    """The model of one ``models:`` or ``sources:`` entry, and its LoRA when it names one (``model+lora``)."""
    value = entry.get("model")
    if not isinstance(value, str):
        notes.append(f"a model entry without a model name ({type(value).__name__}); ignored")
        return []
    out = []
    for part in value.split("+", 1):
        found = model_id_of(part)
        if found is None:
            notes.append(f"model {part[:80]!r} names no model; ignored")
        else:
            out.append(MergeSource(found, layers))
    return out


def _layer_range(value: Any, notes: list[str]) -> tuple[int, int] | None:
    if value is None:
        return None
    if (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                            for v in value) and 0 <= value[0] <= value[1]):
        return value[0], value[1]
    notes.append(f"layer_range {str(value)[:40]} is not [start, end]; ignored")
    return None
