"""What the scan must know about the Ray cluster it runs on: before it starts work, and on nodes that join later."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import ray
from filelock import FileLock
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jobs.config import ConfigError
from scanner.errors import HubtraceError, one_line
from scanner.fingerprints.store import FingerprintStore

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


def check_store_from_every_node(location: str, timeout_s: float = PROBE_TIMEOUT_S) -> frozenset[str]:
    """Refuse to start unless every alive node can write to the object store at ``location``; returns the ids of
    the nodes probed (a `StoreProbe` lets nodes that join later probe themselves on first use).

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
    return frozenset(str(node["NodeID"]) for node in nodes)


class StoreUnreachableError(HubtraceError):
    """This node joined after the scan started and cannot write to the fingerprint store."""


@dataclass(frozen=True)
class StoreProbe:
    """The start-up store probe, again, on a node that was not there at start: once per node per scan.

    Every fingerprint actor and pair task calls `check` before it touches the store. On a node probed at start it
    returns at once; on a node that joined later the first caller writes and removes a probe object (as the start
    did), under a node-local file lock, and leaves the outcome in a node-local file named after the scan, so the
    node's other processes read the answer instead of probing again. A failure raises `StoreUnreachableError`,
    which the caller turns into an error row for the models or pairs it was given (stage ``store``).
    """

    location: str
    scan_id: str
    probed: frozenset[str]
    folder: str | None = None   # node-local; default <system temp>/hubtrace-scratch/store-probes

    def check(self, node_id: str | None = None) -> None:
        node_id = node_id or ray.get_runtime_context().get_node_id()
        if node_id in self.probed:
            return
        folder = Path(self.folder) if self.folder else Path(tempfile.gettempdir()) / "hubtrace-scratch" / "store-probes"
        folder.mkdir(parents=True, exist_ok=True)
        answer = folder / hashlib.sha256(f"{self.scan_id}\0{self.location}\0{node_id}".encode()).hexdigest()[:32]
        with FileLock(f"{answer}.lock"):
            if not answer.exists():
                why = _probe_here(self.location)
                temp = answer.with_name(f"{answer.name}.{os.getpid()}.tmp")
                temp.write_text(why or "")
                os.replace(temp, answer)
            why = answer.read_text()
        if why:
            raise StoreUnreachableError(
                f"node {node_id[:12]} joined after the scan started and cannot write to fingerprint_store "
                f"{self.location} (set the AWS_* variables before `ray start` on it): {why}")


@ray.remote(num_cpus=0, max_retries=0)
def _probe_store(location: str) -> str | None:
    """On the node this task is pinned to: None if it can write to the store, else why not (one line)."""
    return _probe_here(location)


def _probe_here(location: str) -> str | None:
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
