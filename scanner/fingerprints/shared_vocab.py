"""Canonical inputs for two models with different tokenizers: token strings both vocabularies hold.

A model whose embedding rows were remapped to another tokenizer (vocabulary swapped, blocks kept) reads the
same id as a different string, so the plain canonical ids feed its blocks other inputs than its parent's and
the activation tests lose it. When both models ship a tokenizer.json, the inputs are drawn instead from the
sorted list of token strings the two base vocabularies share (each string below both models' embedding rows),
and every model gets the ids its own tokenizer gives those strings: both see the same text.

The draw is the canonical one (`scanner.fingerprints.inputs.canonical_inputs`, SHAKE-256 of the versioned seed) over
indices into the shared list, and the input set is named after the list: ``v1-seed0-4x64-shared<N>-<sha>``
with the first 12 hex digits of the sha256 of the list, so two fingerprints on such inputs are comparable
exactly when they used the same strings in the same places. tokenizer.json is read as JSON data (size-limited),
never executed; token strings are never interpreted.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scanner.errors import CheckpointError
from scanner.fingerprints.inputs import InputSet, InputSpec, canonical_inputs

MAX_TOKENIZER_BYTES = 64 << 20
"""tokenizer.json files larger than this are not read (the largest real ones are a few tens of MB)."""
MIN_SHARED_STRINGS = 64
"""Fewer shared strings than this: the plain canonical ids are used (too little text in common to draw from)."""


@dataclass(frozen=True)
class SharedStringInputSet(InputSet):
    """Canonical inputs drawn from shared token strings: ``ids`` are this model's ids for them."""

    strings_sha256: str = ""

    @property
    def id(self) -> str:
        s = self.spec
        return (
            f"v{s.version}-seed{s.seed}-{s.n_sequences}x{s.seq_len}-shared{self.token_range}-{self.strings_sha256[:12]}"
        )


def base_vocab(model_dir: str | Path, embedding_rows: int) -> dict[str, int] | None:
    """token string -> id of tokenizer.json's base vocabulary (special added tokens and ids beyond the embedding
    rows left out), or None when there is no readable tokenizer.json with a vocabulary."""
    file = Path(model_dir) / "tokenizer.json"
    try:
        if not file.is_file() or file.stat().st_size > MAX_TOKENIZER_BYTES:
            return None
        data = json.loads(file.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return None
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [[token, score], ...], the id is the position
        vocab = {
            entry[0]: i
            for i, entry in enumerate(vocab)
            if isinstance(entry, list) and entry and isinstance(entry[0], str)
        }
    if not isinstance(vocab, dict):
        return None
    special = {t.get("content") for t in data.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")}
    return {
        token: i
        for token, i in vocab.items()
        if isinstance(token, str) and type(i) is int and 0 <= i < embedding_rows and token not in special
    }


def same_meaning(vocab_a: dict[str, int], vocab_b: dict[str, int], id_range: int) -> bool:
    """Whether ids below id_range name the same strings in both vocabularies (then the plain ids serve)."""
    by_id_a = {i: t for t, i in vocab_a.items() if i < id_range}
    by_id_b = {i: t for t, i in vocab_b.items() if i < id_range}
    return by_id_a == by_id_b


def shared_string_inputs(
    vocab_a: dict[str, int], vocab_b: dict[str, int], spec: InputSpec = InputSpec()
) -> tuple[SharedStringInputSet, SharedStringInputSet]:
    """The two models' ids for the same canonical draw from their shared token strings (see the module docstring)."""
    shared = sorted(set(vocab_a) & set(vocab_b))
    if len(shared) < MIN_SHARED_STRINGS:
        raise CheckpointError(
            f"the two tokenizers share only {len(shared)} token strings, fewer than {MIN_SHARED_STRINGS}"
        )
    digest = hashlib.sha256(json.dumps(shared, ensure_ascii=True).encode()).hexdigest()
    draw = canonical_inputs(len(shared), spec).ids
    return tuple(  # type: ignore[return-value]
        SharedStringInputSet(
            spec=spec,
            token_range=len(shared),
            ids=np.asarray([vocab[s] for s in shared], np.int64)[draw],
            strings_sha256=digest,
        )
        for vocab in (vocab_a, vocab_b)
    )


def pair_input_sets(
    dir_a: str | Path, dir_b: str | Path, rows_a: int, rows_b: int, spec: InputSpec = InputSpec()
) -> tuple[SharedStringInputSet, SharedStringInputSet] | None:
    """Shared-string inputs when both models ship a tokenizer.json whose vocabularies give the shared id range
    different meanings (and share enough strings); None when the plain canonical ids serve or cannot be bettered."""
    vocab_a, vocab_b = base_vocab(dir_a, rows_a), base_vocab(dir_b, rows_b)
    if not vocab_a or not vocab_b or same_meaning(vocab_a, vocab_b, min(rows_a, rows_b)):
        return None
    if len(set(vocab_a) & set(vocab_b)) < MIN_SHARED_STRINGS:
        return None
    return shared_string_inputs(vocab_a, vocab_b, spec)


def is_shared_string_input_set(input_set_id: str) -> bool:
    """Whether an input set id names shared-string inputs (`SharedStringInputSet.id`)."""
    return "-shared" in input_set_id


def shared_inputs_note(input_set_id: str, n_strings: int) -> str:
    return (
        f"the vocabularies differ: inputs were drawn from the {n_strings} token strings both tokenizers share, "
        f"each model reading its own ids for them (input set {input_set_id})"
    )
