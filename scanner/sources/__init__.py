"""Where models come from: a local ``org/name`` folder tree, a local Hugging Face cache, or the Hub.

Each source yields `ModelRecord`s (one model at one revision, with the lineage its card declares) or
`SourceFailure`s (what it could not describe, and why); `materialize` turns a record into a local folder holding
only what fingerprints read.
"""

from scanner.sources.hf_cache import discover_hf_cache
from scanner.sources.hub import discover_hub, hub_record, materialize
from scanner.sources.local import discover_local
from scanner.sources.records import SOURCE_KINDS, WHOLE_SOURCE, ModelRecord, SourceFailure, SourceFetchError, SourceKind
from scanner.sources.retry import RetryPolicy

__all__ = [
    "SOURCE_KINDS",
    "WHOLE_SOURCE",
    "ModelRecord",
    "RetryPolicy",
    "SourceFailure",
    "SourceFetchError",
    "SourceKind",
    "discover_hf_cache",
    "discover_hub",
    "discover_local",
    "hub_record",
    "materialize",
]
