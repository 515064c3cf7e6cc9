"""`hubtrace fingerprint MODEL --out FILE`: one model's fingerprint file."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from jobs.cli.refusals import CommandError
from scanner.fingerprints.inputs import InputSpec
from scanner.text_safety import json_visible, terminal


def fingerprint_command(
    model: Annotated[Path, typer.Argument(help="A Hugging Face-format model directory.")],
    out: Annotated[Path, typer.Option("--out", help="Fingerprint file to write (safetensors).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    sequences: Annotated[int, typer.Option(help="Canonical input sequences.")] = InputSpec.n_sequences,
    seq_len: Annotated[int, typer.Option(help="Tokens per canonical sequence.")] = InputSpec.seq_len,
    seed: Annotated[int, typer.Option(help="Seed of the canonical inputs.")] = 0,
    token_range: Annotated[
        int | None,
        typer.Option(help="Draw ids from [0, N) instead of the model's own vocabulary (to match another model)."),
    ] = None,
    storage_dtype: Annotated[
        str, typer.Option("--dtype", help="Activation storage: float16 (default) or float32.")
    ] = "float16",
    device: Annotated[str, typer.Option(help="torch device for the forward passes, e.g. cpu or cuda.")] = "cpu",
    follow_links: Annotated[bool, typer.Option(
        "--follow-links", help="Follow links out of a model folder (your own linked downloads); off by default.")
    ] = False,
) -> None:
    """Read MODEL once, block by block, and write its fingerprint to --out."""
    from scanner.fingerprints.fingerprint import STORAGE_DTYPES, fingerprint_model, write_fingerprint

    if storage_dtype not in STORAGE_DTYPES:
        raise CommandError(f"--dtype must be one of {', '.join(STORAGE_DTYPES)}, got {storage_dtype!r}")
    if token_range is not None and token_range < 2:
        raise CommandError(f"--token-range must be at least 2, got {token_range}")
    start = time.perf_counter()
    fp = fingerprint_model(
        model,
        inputs=InputSpec(seed=seed, n_sequences=sequences, seq_len=seq_len),
        device=device,
        token_range=token_range,
        storage_dtype=storage_dtype,
        follow_links=follow_links,
    )
    try:
        sha256 = write_fingerprint(fp, out)
    except OSError as exc:
        raise CommandError(f"cannot write {out}: {exc.strerror or exc}") from exc
    summary = {
        "path": str(out),
        "sha256": sha256,
        "bytes": out.stat().st_size,
        "seconds": round(time.perf_counter() - start, 3),
        "model": fp.meta.model,
        "architecture": fp.meta.architecture,
        "n_layers": fp.meta.n_layers,
        "parameter_count": fp.meta.parameter_count,
        "input_set": fp.meta.input_set,
        "dtype": fp.meta.dtype,
        "hubtrace_version": fp.meta.hubtrace_version,
    }
    if as_json:
        typer.echo(json_visible(json.dumps(summary, indent=2)))
    else:
        typer.echo("\n".join(f"{key:<16}: {terminal(value)}" for key, value in summary.items()))
