"""Running work on Ray with a bounded number of requests in flight (backpressure), and the fingerprint actor pool.

The window keeps every actor's next task already queued at the actor (no idle round trip) while never
holding more than ``max_in_flight`` results in the object store, however many models a hub lists.
"""

from __future__ import annotations

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


class FingerprintPool:
    """``shape.actors`` FingerprintWorkers that restart after a crash and retry the task they were running."""

    def __init__(self, shape: PoolShape, config: ScanConfig, store_location: str, token: str | None,
                 probe: StoreProbe | None = None) -> None:
        self.shape = shape
        self._options = dict(num_cpus=shape.num_cpus, num_gpus=shape.num_gpus,
                             max_restarts=config.ray.max_restarts, max_task_retries=config.ray.max_task_retries)
        download = next((s.download_dir for s in config.sources if getattr(s, "download_dir", None)), None)
        self._args = (store_location, asdict(config.inputs.spec()), max(1, int(shape.num_cpus)),
                      str(download) if download else None, token, probe, bool(config.pairs.extra_stats))
        self.actors = [self._new_actor() for _ in range(shape.actors)]
        self._load = [0] * len(self.actors)
        self._where: dict[ray.ObjectRef, tuple[int, object]] = {}
        self._node_losses: dict[tuple[str, str], int] = {}

    def _new_actor(self):
        return FingerprintWorker.options(**self._options).remote(*self._args)

    def submit(self, record) -> ray.ObjectRef:
        slot = min(range(len(self.actors)), key=self._load.__getitem__)
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
                self.actors[slot] = self._new_actor()
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
