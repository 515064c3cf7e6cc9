"""The lineage claim in a Hugging Face model card (README.md with YAML front matter).

A scan compares what a card declares with what the weights say, so this reads only the declaration: the
``base_model`` (one id or a list), ``base_model_relation``, ``license`` and ``tags`` (``from-scratch`` among
them; ``base_model:<id>`` and ``base_model:<relation>:<id>``, the tags PEFT, mergekit and the Hub write, name bases
and a relation too, read the same from a local card as from the Hub). Cards are written by strangers: a missing
README, a card without front matter, YAML that does not parse or fields of the wrong type give an empty claim and a
note saying why, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub.repocard import REGEX_YAML_BLOCK

from scanner.declared.fields import YamlTooLarge, first_line, load_yaml, optional_string
from scanner.files import NotRegularFileError, open_regular_file

FROM_SCRATCH_TAG = "from-scratch"
# The relations the Hub's model tree knows (its base_model:<relation>:<id> tags use the same words).
HUB_RELATION_VALUES = frozenset({"adapter", "finetune", "merge", "quantized"})
# Front matter sits at the top; reading more of a huge README would only cost memory.
MAX_CARD_BYTES = 1 << 20
#: Declared bases a model keeps (a merge names a handful; more only makes its page long and its plan wide).
MAX_DECLARED_BASES = 100
#: Tags a model keeps (Hub models carry a few dozen).
MAX_TAGS = 1000


@dataclass(frozen=True)
class Card:
    """The lineage-relevant content of a model card; ``notes`` say what could not be read and why."""

    license: str | None = None
    base_model: tuple[str, ...] = ()
    base_model_relation: str | None = None
    tags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def claims_from_scratch(self) -> bool:
        return FROM_SCRATCH_TAG in self.tags


def read_card(model_dir: Path) -> Card:
    """The claim in ``model_dir/README.md``; an empty claim with a note if there is none or it is unreadable."""
    readme = Path(model_dir) / "README.md"
    try:  # opened first, then checked on the descriptor: a FIFO or device swapped in cannot block the read
        with open_regular_file(readme) as f:
            raw = f.read(MAX_CARD_BYTES)
    except FileNotFoundError:
        return Card(notes=("no README.md (model card)",))
    except NotRegularFileError:
        return Card(notes=("README.md is not a regular file",))
    except OSError as e:
        return Card(notes=(f"README.md unreadable: {e.strerror or e}",))
    return parse_card(raw.decode("utf-8-sig", errors="replace"))


def parse_card(text: str) -> Card:
    """The claim in a card's text (front matter delimited by ``---`` lines, as the Hub reads it)."""
    match = REGEX_YAML_BLOCK.search(text.removeprefix("\ufeff"))
    if match is None:
        return Card(notes=("model card has no YAML front matter",))
    try:
        meta = load_yaml(match.group(2))
    except YamlTooLarge as e:
        return Card(notes=(f"model card front matter refused: {e}",))
    except (yaml.YAMLError, RecursionError, ValueError) as e:
        return Card(notes=(f"model card front matter is not valid YAML: {first_line(e)}",))
    return card_from_metadata(meta)


def card_from_metadata(meta: Any) -> Card:
    """The claim in already-parsed card metadata (front matter, or the Hub's ``cardData``), checked field by field."""
    if meta is None:
        return Card()
    if not isinstance(meta, dict):
        return Card(notes=(f"model card metadata is a {type(meta).__name__}, not a mapping",))
    notes: list[str] = []
    license_id = optional_string(meta.get("license"), "license", notes)
    relation = meta.get("base_model_relation")
    if relation is not None and not (isinstance(relation, str) and relation in HUB_RELATION_VALUES):
        notes.append(f"base_model_relation {str(relation)[:80]!r} is not one of {sorted(HUB_RELATION_VALUES)}; ignored")
        relation = None
    tags = _strings(meta.get("tags"), "tags", notes)
    tag_bases, tag_relation = declared_by_tags(tags)
    tags = kept_tags(tags, notes)
    return Card(
        license=license_id,
        base_model=kept_bases(_strings(meta.get("base_model"), "base_model", notes) or tag_bases, notes),
        base_model_relation=relation or tag_relation,
        tags=tags,
        notes=tuple(notes),
    )


def adapter_card(card: Card, base: str) -> Card:
    """The claim of a PEFT adapter folder: its adapter_config.json names the base it was trained on, so the base is
    declared (unless the card names bases itself) and the relation is `adapter` (unless the card says otherwise)."""
    return replace(card, base_model=card.base_model or (base,),
                   base_model_relation=card.base_model_relation or "adapter")


def declared_by_tags(tags: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """Bases and relation from ``base_model:<id>`` and ``base_model:<relation>:<id>`` tags (the first relation
    named wins; ids in the order the tags give them, each once: linear in the tags, however many repeat)."""
    bases: dict[str, None] = {}
    relation = None
    for tag in tags:
        if not tag.startswith("base_model:"):
            continue
        rest = tag.removeprefix("base_model:")
        kind, named, model = rest.partition(":")
        if not (named and kind in HUB_RELATION_VALUES):
            model = rest
        elif not model:  # PEFT tags an adapter of an unnamed in-memory base "base_model:adapter:": no claim
            continue
        else:
            relation = relation or kind
        if model:
            bases[model] = None
    return tuple(bases), relation


def kept_bases(bases: tuple[str, ...], notes: list[str]) -> tuple[str, ...]:
    """At most `MAX_DECLARED_BASES` declared bases, saying so when more were named (a card can list thousands, and
    every one becomes a row to show and a pair to plan)."""
    if len(bases) <= MAX_DECLARED_BASES:
        return bases
    notes.append(f"{len(bases):,} base models declared; the first {MAX_DECLARED_BASES} kept")
    return bases[:MAX_DECLARED_BASES]


def kept_tags(tags: tuple[str, ...], notes: list[str]) -> tuple[str, ...]:
    """At most `MAX_TAGS` tags (the from-scratch claim kept wherever it stood), saying so when there were more."""
    if len(tags) <= MAX_TAGS:
        return tags
    notes.append(f"{len(tags):,} tags; the first {MAX_TAGS} kept")
    kept = tags[:MAX_TAGS]
    return kept + (FROM_SCRATCH_TAG,) if FROM_SCRATCH_TAG in tags and FROM_SCRATCH_TAG not in kept else kept


def _strings(value: Any, field: str, notes: list[str]) -> tuple[str, ...]:
    """A YAML field that may be one string or a list of strings; anything else is dropped with a note."""
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if not isinstance(value, list):
        notes.append(f"{field} is a {type(value).__name__}, not a string or a list; ignored")
        return ()
    kept = tuple(v for v in value if isinstance(v, str) and v.strip())
    if len(kept) != len(value):
        notes.append(f"{field}: {len(value) - len(kept)} entries that are not non-empty strings ignored")
    return kept
