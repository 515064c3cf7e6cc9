"""What a source says about one model before anything is downloaded, and how a source reports a model it
could not describe."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, get_args

from scanner.declared.cards import Card
from scanner.declared.merge_config import MergeDeclaration
from scanner.errors import HubtraceError

SourceKind = Literal["local", "hf_cache", "hub"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)

#: ``SourceFailure.model_id`` when a whole source failed (unreadable root, listing that errored) rather than one model.
WHOLE_SOURCE = "*"


@dataclass(frozen=True)
class ModelRecord:
    """One model at one revision, as a source lists it, with the lineage its card declares."""

    model_id: str                 # "org/name"
    revision: str                 # hub commit sha; local: sha256 over (relative path, size, mtime_ns) of its files
    source: SourceKind
    location: str                 # local folder, or "<endpoint>/<model_id>" before download
    base_models: tuple[str, ...]  # declared: card base_model, the Hub's baseModels / base_model: tags, merge config
    base_model_relation: str | None
    claims_from_scratch: bool
    license: str | None
    tags: tuple[str, ...]
    created_at: datetime | None
    last_modified: datetime | None
    notes: tuple[str, ...] = ()   # what could not be read (e.g. a card without front matter)
    follow_links: bool = False    # links out of the model folder are followed (a local source that opted in)
    merge: MergeDeclaration | None = None  # what the folder's mergekit_config.yml declares (method, sources, blocks)


@dataclass(frozen=True)
class SourceFailure:
    """A model (or, with model_id == WHOLE_SOURCE, a whole source) that discovery could not turn into a record."""

    model_id: str
    location: str
    reason: str


class SourceFetchError(HubtraceError):
    """A model's files could not be fetched (Hub errors that outlasted the retries, a revision that vanished)."""


def record_from_card(model_id: str, revision: str, source: str, location: str, card: Card, *,
                     created_at: datetime | None = None, last_modified: datetime | None = None,
                     merge: MergeDeclaration | None = None) -> ModelRecord:
    """A record whose lineage claim is what ``card`` declares (local folders, cached snapshots), with the models a
    merge config names added to the card's bases (relation "merge" when the card names none)."""
    merged_from = tuple(p for p in (merge.parents if merge else ()) if p not in card.base_model and p != model_id)
    return ModelRecord(
        model_id=model_id,
        revision=revision,
        source=source,
        location=location,
        base_models=card.base_model + merged_from,
        base_model_relation=card.base_model_relation or ("merge" if merge and merge.parents else None),
        claims_from_scratch=card.claims_from_scratch,
        license=card.license,
        tags=card.tags,
        created_at=created_at,
        last_modified=last_modified,
        notes=card.notes + (merge.notes if merge else ()),
        merge=merge,
    )
