"""Model-card parsing on honest and hostile cards: a claim when there is one, an empty claim and a note otherwise."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scanner.declared.cards import MAX_CARD_BYTES, card_from_metadata, declared_by_tags, parse_card, read_card


def test_front_matter_claim_with_list_and_string_forms() -> None:
    card = parse_card("---\nlicense: mit\nbase_model:\n- a/x\n- b/y\nbase_model_relation: merge\n"
                      "tags: [from-scratch, chat]\n---\n# Title\n")
    assert card.base_model == ("a/x", "b/y") and card.base_model_relation == "merge"
    assert card.license == "mit" and card.tags == ("from-scratch", "chat") and card.claims_from_scratch
    assert card.notes == ()
    single = parse_card("\ufeff---\r\nbase_model: a/x\r\ntags: chat\r\n---\r\nbody")
    assert single.base_model == ("a/x",) and single.tags == ("chat",) and not single.claims_from_scratch


@pytest.mark.parametrize(
    ("text", "note"),
    [
        ("# A card with prose only\nbase_model: a/x\n", "no YAML front matter"),
        ("---\nbase_model: [unclosed\n---\n", "not valid YAML"),
        ("---\n- a\n- b\n---\n", "is a list, not a mapping"),
        ("---\n!!python/object:os.system {}\n---\n", "not valid YAML"),  # safe_load refuses object tags
    ],
)
def test_unreadable_front_matter_gives_empty_claim_and_note(text: str, note: str) -> None:
    card = parse_card(text)
    assert card.base_model == () and card.license is None and card.tags == ()
    assert len(card.notes) == 1 and note in card.notes[0]


def test_fields_of_the_wrong_type_are_dropped_one_by_one() -> None:
    card = card_from_metadata({"license": ["mit"], "base_model": ["ok/model", 7, None, ""],
                               "base_model_relation": "stolen", "tags": {"a": 1}})
    assert card.base_model == ("ok/model",)
    assert card.license is None and card.base_model_relation is None and card.tags == ()
    assert len(card.notes) == 4
    assert card_from_metadata({"base_model": 42}).base_model == ()
    assert card_from_metadata(None).notes == () and card_from_metadata("text").notes


def test_base_model_tags_name_bases_and_relations_and_an_empty_id_claims_nothing() -> None:
    """PEFT tags an adapter of a base built in memory ``base_model:adapter:`` with no id: that names no base."""
    tags = ("base_model:adapter:", "base_model:finetune:org/a", "base_model:org/b", "text-generation")
    assert declared_by_tags(tags) == (("org/a", "org/b"), "finetune")
    assert declared_by_tags(("base_model:adapter:",)) == ((), None)


def test_read_card_files(tmp_path: Path) -> None:
    assert "no README.md" in read_card(tmp_path).notes[0]
    (tmp_path / "README.md").write_text("---\nbase_model: a/x\n---\n" + "x" * (2 * MAX_CARD_BYTES))
    assert read_card(tmp_path).base_model == ("a/x",)  # a huge card is read only as far as needed
    fifo_dir = tmp_path / "fifo"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "README.md")  # opening a FIFO for reading would block forever
    assert "not a regular file" in read_card(fifo_dir).notes[0]
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "README.md").write_bytes(b"---\nlicense: \xff\xfe\n---\n")
    assert read_card(tmp_path / "bin").license == "\ufffd\ufffd"
