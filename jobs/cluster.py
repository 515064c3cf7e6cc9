"""What the scan must know about the Ray cluster it runs on before it starts work."""

from __future__ import annotations

import ray

from jobs.config import ConfigError
from scanner.fingerprint_store import FingerprintStore


def alive_nodes() -> int:
    """Nodes of the cluster that are up now (the head included)."""
    return sum(1 for node in ray.nodes() if node.get("Alive"))


def check_fingerprint_store(store: FingerprintStore, nodes: int, shared: bool) -> None:
    """Refuse a local fingerprint store on a multi-node cluster unless the config says every node mounts it.

    hubtrace cannot tell a shared mount from a folder that exists on each node by accident (both look the same
    from every node), so the operator says so with ``fingerprint_store_shared: true``; otherwise the fingerprints
    an actor writes on one node would be missing for a pair task on another.
    """
    if store.is_local and nodes > 1 and not shared:
        raise ConfigError(
            f"fingerprint_store {store.location} is a local path, but the Ray cluster has {nodes} nodes and a "
            "fingerprint written on one node cannot be read on another: set fingerprint_store to an object store "
            "URL (s3://bucket/prefix), or, if every node mounts this path, set fingerprint_store_shared: true")
