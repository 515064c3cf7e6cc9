"""Checkpoint formats beyond a plain float safetensors folder, behind the one `Checkpoint` interface.

`open_model_checkpoint` is the single door: a Hugging Face folder (float or quantized safetensors), a GGUF file,
or a folder that holds exactly one GGUF file and no config.json (how llama.cpp builds are usually published).
"""

from __future__ import annotations

import os
from pathlib import Path

from scanner.checkpoint import Checkpoint, open_checkpoint
from scanner.errors import CheckpointError
from scanner.formats.gguf import GGUF_SUFFIX, open_gguf
from scanner.formats.gguf_file import is_gguf_file
from scanner.formats.quantized import dequantizing


def open_model_checkpoint(path: str | Path) -> Checkpoint:
    """Lazy, validated access to a model in any format hubtrace reads; one-line CheckpointError otherwise."""
    gguf = gguf_weights(Path(path))
    if gguf is not None:
        return open_gguf(gguf)
    return dequantizing(open_checkpoint(path))


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
