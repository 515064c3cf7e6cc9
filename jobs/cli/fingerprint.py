"""`hubtrace fingerprint MODEL --out FILE`, and `hubtrace test --fingerprint` (either side a directory or a file)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer

from scanner.errors import HubtraceError
from scanner.inputs import InputSpec
from scanner.results import PairTestResult


def fingerprint_command(
    model: Annotated[Path, typer.Argument(help="A Hugging Face-format model directory.")],
    out: Annotated[Path, typer.Option("--out", help="Fingerprint file to write (safetensors).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of text.")] = False,
    sequences: Annotated[int, typer.Option(help="Canonical input sequences.")] = InputSpec.n_sequences,
    seq_len: Annotated[int, typer.Option(help="Tokens per canonical sequence.")] = InputSpec.seq_len,
    seed: Annotated[int, typer.Option(help="Seed of the canonical inputs.")] = 0,
    token_range: Annotated[
        int | None, typer.Option(help="Draw ids from [0, N) instead of the model's own vocabulary (to match another model).")
    ] = None,
    storage_dtype: Annotated[str, typer.Option("--dtype", help="Activation storage: float16 (default) or float32.")] = "float16",
    device: Annotated[str, typer.Option(help="torch device for the forward passes, e.g. cpu or cuda.")] = "cpu",
) -> None:
    """Read MODEL once, block by block, and write its fingerprint to --out."""
    from scanner.cli import _fail
    from scanner.fingerprint import fingerprint_model, write_fingerprint

    start = time.perf_counter()
    try:
        fp = fingerprint_model(
            model,
            inputs=InputSpec(seed=seed, n_sequences=sequences, seq_len=seq_len),
            device=device,
            token_range=token_range,
            storage_dtype=storage_dtype,
        )
        sha256 = write_fingerprint(fp, out)
    except (HubtraceError, ValueError) as exc:
        _fail(str(exc))
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
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo("\n".join(f"{key:<16}: {value}" for key, value in summary.items()))


def compare_sides(path_a: Path, path_b: Path, statistic: str, spec: InputSpec, device: str) -> PairTestResult:
    """`hubtrace test --fingerprint`: phi_MATCH or phi_H from fingerprints, computing any side given as a folder."""
    from scanner.errors import IncomparableError
    from scanner.fingerprint import fingerprint_pair
    from scanner.fingerprint_compare import FINGERPRINT_STATISTICS, compare_fingerprints

    if statistic not in FINGERPRINT_STATISTICS:
        raise IncomparableError(
            f"--stat {statistic} needs the checkpoints; fingerprints carry activations for {', '.join(FINGERPRINT_STATISTICS)}"
        )
    return compare_fingerprints(*fingerprint_pair(path_a, path_b, inputs=spec, device=device), statistic, device=device)
