"""Running work on Ray with a bounded number of requests in flight (backpressure), and the fingerprint actor pool.

The window keeps every actor's next task already queued at the actor (no idle round trip) while never
holding more than ``max_in_flight`` results in the object store, however many models a hub lists.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TypeVar

import ray
from ray.exceptions import ActorUnavailableError, RayActorError

from jobs.actors import FingerprintOutcome, FingerprintWorker, WorkFailure
from jobs.cluster import StoreProbe
from jobs.config import ScanConfig
from scanner.errors import HubtraceError, one_line

T = TypeVar("T")


class NoGpuError(HubtraceError):
    """``devices.mode: gpu`` on a cluster without GPUs: an actor asking for one would wait forever."""


def windowed(items: Iterable[T], submit: Callable[[T], ray.ObjectRef], max_in_flight: int
             ) -> Iterator[tuple[T, ray.ObjectRef]]:
    """Submit ``items`` lazily, at most ``max_in_flight`` at a time; yield (item, ref) as each finishes."""
    pending: dict[ray.ObjectRef, T] = {}
    source = iter(items)
    exhausted = False
    while True:
        while not exhausted and len(pending) < max_in_flight:
            item = next(source, _END)
            if item is _END:
                exhausted = True
            else:
                pending[submit(item)] = item
        if not pending:
            return
        ready, _ = ray.wait(list(pending), num_returns=1)
        yield pending.pop(ready[0]), ready[0]


_END = object()


@dataclass(frozen=True)
class PoolShape:
    """How many actors, what each asks Ray for, and the device kind they will use."""

    actors: int
    num_cpus: float
    num_gpus: float
    max_in_flight: int

    @property
    def device(self) -> str:
        return "gpu" if self.num_gpus else "cpu"


def pool_shape(config: ScanConfig, cluster: dict[str, float]) -> PoolShape:
    """Actors per the config and the cluster: GPUs only when the cluster has them (else pending forever)."""
    gpus = cluster.get("GPU", 0.0)
    mode = config.devices.mode
    if mode == "gpu" and gpus <= 0:
        raise NoGpuError("devices.mode is 'gpu' but the Ray cluster reports no GPUs")
    use_gpu = mode != "cpu" and gpus > 0
    num_gpus = config.devices.gpus_per_actor if use_gpu else 0.0
    if config.ray.actors != "auto":
        actors = config.ray.actors
    elif use_gpu:
        actors = max(1, int(gpus // num_gpus))
    else:
        actors = max(1, int(cluster.get("CPU", 1.0) // config.ray.cpus_per_actor))
    return PoolShape(actors, config.ray.cpus_per_actor, num_gpus, config.ray.max_in_flight or 2 * actors)


NODE_LOSS_RETRIES = 2
"""Times a model is sent to a fresh actor after its actor was unreachable through every retry (a lost node)."""

START_GRACE_S = 5.0
"""Least time the other actors get to start once the first has (they are given as long as the first took)."""


def _free(resources: dict[str, float]) -> str:
    """CPUs and GPUs of a Ray resource dict, for a message."""
    return ", ".join(f"{resources.get(kind, 0.0):g} {kind}" for kind in ("CPU", "GPU"))


class WorkersNotStartedError(HubtraceError):
    """No fingerprint actor started within ``ray.actor_start_timeout_s``: the cluster has no room for one."""


class FingerprintPool:
    """``shape.actors`` FingerprintWorkers that restart after a crash and retry the task they were running.

    The actors are made at the first model (a scan with nothing new starts none), and a model goes only to an
    actor that has started: one the cluster has no room for (its CPUs held by something else, a node that never
    comes) would hold the models queued on it, and the scan with them, for ever. One that starts late joins then.
    """

    def __init__(self, shape: PoolShape, config: ScanConfig, store_location: str, token: str | None,
                 probe: StoreProbe | None = None) -> None:
        self.shape = shape
        self._options = dict(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus,
                             max_restarts=config.ray.max_restarts, max_task_retries=config.ray.max_task_retries)
        self._start_timeout = config.ray.actor_start_timeout_s
        download = next((s.download_dir for s in config.sources if getattr(s, "download_dir", None)), None)
        self._args = (store_location, asdict(config.inputs.spec()), max(1, int(shape.num_cpus)),
                      str(download) if download else None, token, probe, bool(config.pairs.extra_stats))
        self.actors: list = []
        self._load: list[int] = []
        self._starting: dict[int, ray.ObjectRef] = {}  # slot -> its actor's readiness, until it has started
        self._where: dict[ray.ObjectRef, tuple[int, object]] = {}
        self._node_losses: dict[tuple[str, str], int] = {}

    def _new_actor(self, slot: int):
        actor = FingerprintWorker.options(**self._options).remote(*self._args)
        self._starting[slot] = actor.__ray_ready__.remote()
        return actor

    def _start(self) -> None:
        """Every actor, then a wait for the first to start and for the others about as long again (those still
        starting then join when they have started)."""
        self.actors = [self._new_actor(slot) for slot in range(self.shape.actors)]
        self._load = [0] * self.shape.actors
        began = time.monotonic()
        self._wait_for_started(1, self._start_timeout)
        first = time.monotonic() - began
        self._wait_for_started(len(self._starting), max(START_GRACE_S, first))

    def _wait_for_started(self, count: int, timeout: float) -> None:
        """Up to ``timeout`` seconds for ``count`` of the starting actors to start (0: only look)."""
        if not self._starting:
            return
        slot_of = {ref: slot for slot, ref in self._starting.items()}
        ready, _ = ray.wait(list(slot_of), num_returns=min(count, len(slot_of)), timeout=timeout)
        for ref in ready:  # an actor that died while starting counts too: its task fails and it is replaced
            del self._starting[slot_of[ref]]

    def _started_slots(self) -> list[int]:
        if not self.actors:
            self._start()
        self._wait_for_started(len(self._starting), 0)
        started = [slot for slot in range(len(self.actors)) if slot not in self._starting]
        if not started:  # every actor was replaced, or none has started yet
            self._wait_for_started(1, self._start_timeout)
            started = [slot for slot in range(len(self.actors)) if slot not in self._starting]
        if not started:
            raise WorkersNotStartedError(
                f"none of the {len(self.actors)} fingerprint actors started within {self._start_timeout:g} s "
                f"(ray.actor_start_timeout_s), each asking for {self.shape.num_cpus:g} CPU(s)"
                + (f" and {self.shape.num_gpus:g} GPU(s)" if self.shape.num_gpus else "")
                + f"; the cluster has {_free(ray.available_resources())} free of {_free(ray.cluster_resources())}")
        return started

    @property
    def not_started(self) -> int:
        """Actors made but not started by now: the cluster had no room for them."""
        self._wait_for_started(len(self._starting), 0)
        return len(self._starting)

    def submit(self, record) -> ray.ObjectRef:
        slot = min(self._started_slots(), key=self._load.__getitem__)
        actor = self.actors[slot]
        ref = actor.fingerprint.remote(record)
        self._load[slot] += 1
        self._where[ref] = (slot, actor)
        return ref

    def result(self, record, ref: ray.ObjectRef) -> FingerprintOutcome:
        """The outcome; a worker that died beyond its restarts becomes an error value and is replaced."""
        slot, actor = self._where.pop(ref)
        self._load[slot] -= 1
        try:
            return ray.get(ref)
        except RayActorError as e:
            if self.actors[slot] is actor:  # the first of its lost tasks replaces it; the others only report
                ray.kill(actor, no_restart=True)
                self.actors[slot] = self._new_actor(slot)
            key = (record.model_id, record.revision)
            if isinstance(e, ActorUnavailableError) and self._node_losses.get(key, 0) < NODE_LOSS_RETRIES:
                # every retry found the actor unreachable (its node was lost, it is restarting elsewhere): the
                # model did not kill it, so it runs again on a fresh actor instead of being marked failed
                self._node_losses[key] = self._node_losses.get(key, 0) + 1
                return self.result(record, self.submit(record))
            reason = f"worker process died {self._options['max_task_retries'] + 1} times on this model: {e}"
            return FingerprintOutcome(record, error=WorkFailure("worker", type(e).__name__, one_line(reason)))

    def shutdown(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        self._starting.clear()
