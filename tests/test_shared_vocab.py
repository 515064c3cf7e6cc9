"""Tokenizer transplants: a model whose embedding rows were remapped to another tokenizer is detected against
its parent on inputs drawn from the token strings the two tokenizers share.

Tiny random Llamas with hand-written WordLevel tokenizer.json files and fixed seeds: deterministic. The
dependent assertion sits far past its threshold (a copied MLP on identical inputs); the independent control
asserts log10 p > -2 (false-failure rate 1% for an exactly valid test, fixed here by the seed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from jobs.cli import app
from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.fingerprints.shared_vocab import MAX_TOKENIZER_BYTES, base_vocab, pair_input_sets
from scanner.pairs.compare import compare_models
from scanner.pairs.fingerprint_compare import compare_fingerprints
from tests.tiny_models import FAMILIES, VOCAB

N_SHARED = 100


def _write_tokenizer(folder: Path, tokens: list[str]) -> None:
    """A WordLevel tokenizer.json (the simplest real format): token i of the list has id i."""
    data = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(tokens)}, "unk_token": tokens[0]},
    }
    (folder / "tokenizer.json").write_text(json.dumps(data))
    assert Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(tokens[5]) == 5  # a tokenizer it can load


def _random_llama(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILIES["llama"].config())
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vocab")
    rng = np.random.default_rng(0)
    parent_tokens = [f"word{k}" for k in range(VOCAB)]
    kept = rng.choice(VOCAB, N_SHARED, replace=False)  # parent ids whose strings the new tokenizer keeps
    child_tokens = [parent_tokens[k] for k in kept] + [f"fresh{k}" for k in range(VOCAB - N_SHARED)]
    order = rng.permutation(VOCAB)
    child_tokens = [child_tokens[k] for k in order]

    parent = _random_llama(0)
    child = _random_llama(1)  # fresh rows for the new strings; everything else is the parent's (plus a little noise)
    with torch.no_grad():
        for (name, p), c in zip(parent.state_dict().items(), child.state_dict().values()):
            if "embed_tokens" in name or "lm_head" in name:
                for child_id, token in enumerate(child_tokens):
                    if token in parent_tokens:
                        c[child_id] = p[parent_tokens.index(token)]
            else:
                c.copy_(p + 0.01 * torch.randn_like(p))
    other = _random_llama(2)
    paths = {}
    for name, model, tokens in (
        ("parent", parent, parent_tokens),
        ("child", child, child_tokens),
        ("other", other, child_tokens),
    ):
        paths[name] = root / name
        model.save_pretrained(paths[name], safe_serialization=True)
        _write_tokenizer(paths[name], tokens)
    return paths


def test_transplanted_vocabulary_is_detected_on_shared_strings(models: dict[str, Path]) -> None:
    result = compare_models(models["parent"], models["child"])
    assert result.inputs.startswith(f"v1-seed0-4x64-shared{N_SHARED}-")
    assert any("token strings both tokenizers share" in note for note in result.notes)
    assert result.log10_p < -100
    # the plain canonical ids read other strings in each model: the same pair then shows little or nothing
    plain = compare_fingerprints(fingerprint_model(models["parent"]), fingerprint_model(models["child"]))
    assert plain.inputs == f"v1-seed0-4x64-ids<{VOCAB}" and plain.log10_p > -5


def test_an_independent_model_with_the_new_tokenizer_stays_independent(models: dict[str, Path]) -> None:
    result = compare_models(models["parent"], models["other"])
    assert result.inputs.startswith(f"v1-seed0-4x64-shared{N_SHARED}-") and result.log10_p > -2


def test_both_models_read_the_same_strings_and_the_input_set_names_the_list(models: dict[str, Path]) -> None:
    a, b = pair_input_sets(models["parent"], models["child"], VOCAB, VOCAB)
    assert a.id == b.id
    strings = [{i: t for t, i in base_vocab(models[m], VOCAB).items()} for m in ("parent", "child")]
    assert [strings[0][i] for i in a.ids.ravel()] == [strings[1][i] for i in b.ids.ravel()]
    assert not np.array_equal(a.ids, b.ids)
    assert pair_input_sets(models["child"], models["other"], VOCAB, VOCAB) is None  # same vocabulary: plain ids


def test_cli_test_says_which_input_set_it_used(models: dict[str, Path]) -> None:
    out = CliRunner().invoke(app, ["test", str(models["parent"]), str(models["child"]), "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["inputs"].startswith(f"v1-seed0-4x64-shared{N_SHARED}-")


def test_unreadable_or_oversized_tokenizers_fall_back_to_plain_ids(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    assert base_vocab(tmp_path, VOCAB) is None
    (tmp_path / "tokenizer.json").write_bytes(b" " * (MAX_TOKENIZER_BYTES + 1))
    assert base_vocab(tmp_path, VOCAB) is None
    (tmp_path / "tokenizer.json").write_text(
        json.dumps(
            {"model": {"vocab": {"a": 0, "b": 500, "c": "x"}}, "added_tokens": [{"content": "a", "special": True}]}
        )
    )
    assert base_vocab(tmp_path, VOCAB) == {}
