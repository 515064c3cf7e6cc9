"""Model cards for the zoo: which lineage claim each model's card makes, and writing it out.

A card is honest, silent or false about lineage; comparing its claim (read back with `scanner.declared.cards`) with the
true parents gives the card's class, which the zoo's ground truth records and the tests re-derive.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import yaml

from scanner.declared.cards import FROM_SCRATCH_TAG, Card

CardClass = Literal["honest", "silent", "false"]
HUB_RELATIONS = {"finetune": "finetune", "merge": "merge"}
"""Zoo relations that have a Hugging Face ``base_model_relation`` value; other derivations declare none."""


def make_card(
    policy: CardClass, parents: Sequence[str], relation: str, license_id: str, false_base: str | None = None
) -> Card:
    """The card a model of this lineage gets under ``policy``.

    honest: declares the true parents (or, for a base, the from-scratch tag); silent: declares
    nothing; false: declares ``false_base`` as its fine-tuning base, or else claims from scratch.
    """
    if policy == "honest":
        if not parents:
            return Card(license_id, tags=(FROM_SCRATCH_TAG,))
        return Card(license_id, tuple(parents), HUB_RELATIONS.get(relation))
    if policy == "silent":
        return Card(license_id)
    if false_base is not None:
        return Card(license_id, (false_base,), "finetune")
    return Card(license_id, tags=(FROM_SCRATCH_TAG,))


def classify_card(card: Card, parents: Sequence[str]) -> CardClass:
    """Honest if the claim matches the true parents, silent if a derivative says nothing, false otherwise."""
    if card.base_model:
        return "honest" if set(card.base_model) == set(parents) and not card.claims_from_scratch else "false"
    if not parents:
        return "honest"
    return "false" if card.claims_from_scratch else "silent"


def describe(card: Card) -> str:
    """A one-line prose summary that says the same as the front matter (true or not)."""
    if card.base_model:
        verb = {"finetune": "Fine-tuned", "merge": "Merged"}.get(card.base_model_relation or "", "Derived")
        return f"{verb} from {', '.join(card.base_model)}."
    return "A small language model trained from scratch." if card.claims_from_scratch else "A small language model."


def write_card(model_dir: Path, model_id: str, card: Card) -> None:
    """Write ``README.md``: YAML front matter, then a title and a one-line description."""
    meta: dict[str, object] = {"license": card.license}
    if card.base_model:
        meta["base_model"] = card.base_model[0] if len(card.base_model) == 1 else list(card.base_model)
    if card.base_model_relation is not None:
        meta["base_model_relation"] = card.base_model_relation
    if card.tags:
        meta["tags"] = list(card.tags)
    front = yaml.safe_dump(meta, sort_keys=False)
    (model_dir / "README.md").write_text(f"---\n{front}---\n\n# {model_id}\n\n{describe(card)}\n", encoding="utf-8")

