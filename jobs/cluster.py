"""What the scan must know about the Ray cluster it runs on before it starts work."""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jobs.config import ConfigError
from scanner.errors import HubtraceError, one_line
from scanner.fingerprint_store import FingerprintStore

#: How long the store probe may take on every node (a node that cannot start a task by then is reported).
PROBE_TIMEOUT_S = 300.0


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


def check_store_from_every_node(location: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse to start unless every alive node can write to the object store at ``location``.

    Each node runs `FingerprintStore.prepare` (a probe object written and removed) in a zero-CPU task pinned to it,
    so a node started without the AWS variables, or one that cannot reach the endpoint, is one message naming the
    node before any work, instead of a `scan_errors` row for every model that lands on it.
    """
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    refs = {
        _probe_store.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
        .remote(location): node
        for node in nodes
    }
    done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    failures = [f"node {_name(refs[ref])}: {why}" for ref in done if (why := _outcome(ref)) is not None]
    failures += [f"node {_name(refs[ref])}: no answer within {timeout_s:.0f} s" for ref in pending]
    for ref in pending:
        ray.cancel(ref, force=True)
    if failures:
        raise ConfigError(f"fingerprint_store {location} is not writable from {len(failures)} of {len(nodes)} "
                          f"nodes (set the AWS_* variables on every node before `ray start`): " + "; ".join(failures))


@ray.remote(num_cpus=0, max_retries=0)
def _probe_store(location: str) -> str | None:
    """On the node this task is pinned to: None if it can write to the store, else why not (one line)."""
    try:
        FingerprintStore(location).prepare()
    except HubtraceError as e:
        return one_line(e)
    return None


def _outcome(ref: ray.ObjectRef) -> str | None:
    try:
        return ray.get(ref)
    except Exception as e:  # noqa: BLE001 - a node that cannot run the probe at all (hubtrace missing, node lost)
        return one_line(e)


def _name(node: dict) -> str:
    return f"{node.get('NodeManagerAddress', '?')} ({str(node.get('NodeID', '?'))[:12]})"
