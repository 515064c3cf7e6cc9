"""Fingerprints: the canonical inputs, a model's activations on them kept in one small file, and where those files
live (a location, a node's cache of them, byte ranges of them in an object store)."""
