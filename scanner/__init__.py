"""hubtrace's core library, one package per stage, in pipeline order: `reading` a model (and `declared`, what its
folder claims), `sources` where models come from, `fingerprints`, `pairs` tested, `store`, `retrieval` of the pairs
to test; `stats` holds the pure statistics every stage uses. The stages import only downwards (pyproject.toml)."""

__version__ = "0.1.0"
