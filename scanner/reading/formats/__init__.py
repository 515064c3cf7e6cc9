"""Checkpoint formats beyond a plain float safetensors folder, behind the one `Checkpoint` interface.

`open_model_checkpoint` is the single door: a Hugging Face folder (float or quantized safetensors), a GGUF file,
a folder that holds exactly one GGUF file and no config.json (how llama.cpp builds are usually published), or a
PEFT LoRA adapter folder, read through its base (`scanner.reading.formats.lora`).
"""

from __future__ import annotations

import os
from pathlib import Path

from scanner.errors import CheckpointError, UnsupportedAdapterError
from scanner.reading.checkpoint import Checkpoint, open_checkpoint
from scanner.reading.formats.gguf import GGUF_SUFFIX, open_gguf
from scanner.reading.formats.gguf_file import is_gguf_file
from scanner.reading.formats.lora import is_adapter_folder, open_lora, read_adapter_config
from scanner.reading.formats.lora_base import BaseLocator, locate_base
from scanner.reading.formats.quantized import dequantizing


def open_model_checkpoint(path: str | Path, *, base: Path | None = None) -> Checkpoint:
    """Lazy, validated access to a model in any format hubtrace reads; one-line CheckpointError otherwise.

    base: for a LoRA adapter folder, its base model's folder (found by `locate_base`); None looks for it around the
    adapter (`BaseLocator.around`)."""
    folder = Path(path)
    if is_adapter_folder(folder):
        if base is None:
            base = locate_base(folder, read_adapter_config(folder), BaseLocator.around(folder))
        if is_adapter_folder(base):
            raise UnsupportedAdapterError(f"{folder}: its base {base} is itself a LoRA adapter; hubtrace reads one "
                                          "adapter on a full model")
        return open_lora(folder, open_model_checkpoint(base))
    gguf = gguf_weights(folder)
    if gguf is not None:
        return open_gguf(gguf)
    return dequantizing(open_checkpoint(folder))


def gguf_weights(path: Path) -> Path | None:
    """The GGUF file a path stands for: the path itself, or the single .gguf of a folder without config.json.

    A file that is neither GGUF nor a folder is refused here, naming what was tried, so that nobody reads
    "not a directory" about a model file.
    """
    if path.is_file():
        if is_gguf_file(path):
            return path
        raise CheckpointError(
            f"{path} is a file but not a GGUF model (no GGUF magic); a safetensors model is a folder with config.json"
        )
    if not path.is_dir() or os.path.lexists(path / "config.json"):
        return None
    found = sorted(p for p in path.iterdir() if p.name.endswith(GGUF_SUFFIX))
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:4])
        raise CheckpointError(f"{path} holds {len(found)} GGUF files ({names}); give hubtrace one of them")
    return found[0] if found else None
