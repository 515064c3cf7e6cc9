"""The template fingerprint synthetic pairs (tests.fixtures.synthetic) start from: a tiny Llama's, so the
metadata is real."""

from __future__ import annotations

from pathlib import Path

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.fingerprints.inputs import InputSpec
from tests.tiny_models import FAMILIES, save_random


def template_fingerprint(folder: Path, tokens: int) -> Fingerprint:
    """A tiny Llama's fingerprint on one sequence of ``tokens``."""
    save_random(FAMILIES["llama"].config(), folder)
    return fingerprint_model(folder, inputs=InputSpec(n_sequences=1, seq_len=tokens))
