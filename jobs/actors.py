"""The scan's Ray workers: fingerprinting actors and pair-comparison tasks.

Failures come back as values (`WorkFailure`: stage, exception type, one-line reason), never as exceptions into
the driver, so one broken checkpoint costs one ``scan_errors`` row and nothing else. Only a dying process (OOM,
SIGKILL) escapes that; Ray restarts the actor and retries its task (on another node if its node died), which is
safe because a fingerprint is written atomically to an address fixed by model, revision and input set.

Fingerprints go to a `FingerprintStore` (a shared path or an object store URL), so a pair task on any node reads
what an actor on any other node wrote. Hub downloads live in node-local scratch only while their model is
being fingerprinted (jobs.scratch).
"""

from __future__ import annotations

import functools
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from jobs.cluster import StoreProbe, StoreUnreachableError
from jobs.scratch import default_scratch, download_folder, remove_orphans
from scanner.errors import one_line
from scanner.fingerprints.cache import FingerprintCache
from scanner.fingerprints.inputs import InputSpec
from scanner.fingerprints.store import FingerprintStore
from scanner.pairs.results import PairTestResult
from scanner.stats.weight_statistics import WeightProfile

REASON_CHARS = 4000
"""A scan_errors reason is cut (and says so) only beyond this: real messages are a few hundred characters."""


if TYPE_CHECKING:
    from scanner.fingerprints.fingerprint import FingerprintMeta
    from scanner.pairs.block_map import BlockMap
    from scanner.pairs.worker import PairWorker
    from scanner.sources import ModelRecord
    from scanner.stats.matching import MatchingRule
    from scanner.stats.sequential import SequentialDesign

@dataclass(frozen=True)
class WorkFailure:
    """Why one model (or pair) failed: the stage it reached, the exception type and a one-line reason."""

    # "fetch" | "validate" | "fingerprint" | "write" | "compare" | "block_map" | "worker" | "discover" | "store"
    stage: str
    error_type: str
    reason: str


@dataclass(frozen=True)
class FingerprintOutcome:
    """A model's stored fingerprint (address, sha256, metadata), or the error that stopped it."""

    record: ModelRecord
    meta: FingerprintMeta | None = None
    path: str | None = None
    file_sha256: str | None = None
    n_tokens: int | None = None
    device: str | None = None
    seconds: float = 0.0
    error: WorkFailure | None = None
    profile: WeightProfile | None = None   # when the scan records weight fingerprints and the family has one


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker is doing now; answered from its own thread even mid-fingerprint."""

    pid: int
    node_id: str          # the Ray node it runs on
    device: str
    current: str | None   # model id being fingerprinted, if any
    done: int


@dataclass(frozen=True)
class PairJob:
    """One pair to test, ``model_a < model_b``, with the fingerprint addresses of both at their revisions."""

    model_a: str
    revision_a: str
    path_a: str
    model_b: str
    revision_b: str
    path_b: str
    input_set: str
    reason: str       # "comparable" | "declared_base"
    block_map: tuple[tuple[int, int], ...] = ()   # retrieval's block pairs, used when the depths differ
    sha256_a: str | None = None   # the fingerprint files' recorded sha256 (the node disk cache's key)
    sha256_b: str | None = None


@dataclass(frozen=True)
class PairOutcome:
    """A pair's test (or the error that stopped it) and, for a related pair whose depths differ, its block map (or
    the error that stopped the map alone: the test stands)."""

    job: PairJob
    result: PairTestResult | None = None
    error: WorkFailure | None = None
    block_map: BlockMap | None = None
    map_error: WorkFailure | None = None


def _failed(record: ModelRecord, stage: str, error: BaseException, started: float) -> FingerprintOutcome:
    return FingerprintOutcome(record, seconds=time.perf_counter() - started,
                              error=WorkFailure(stage, type(error).__name__, one_line(error, REASON_CHARS)))


def fingerprint_record(record: ModelRecord, store: FingerprintStore, inputs: InputSpec, *, device: str = "cpu",
                       scratch: Path | None = None, token: str | None = None,
                       profile: bool = False) -> FingerprintOutcome:
    """Fetch (Hub records, into a scratch folder deleted afterwards), validate, fingerprint and store one model;
    every failure is returned, not raised. ``profile``: also read its weight profile (scanner.reading.weight_profiles),
    where its family has the roles for one."""
    scratch = scratch or default_scratch()
    started = time.perf_counter()
    if record.source != "hub":  # already a folder on a disk the workers read
        return _fingerprint(record, store, inputs, device, scratch, token, scratch, started, profile)
    with download_folder(scratch) as download:
        return _fingerprint(record, store, inputs, device, scratch, token, download, started, profile)


def _fingerprint(record: ModelRecord, store: FingerprintStore, inputs: InputSpec, device: str, scratch: Path,
                 token: str | None, download: Path, started: float, profile: bool) -> FingerprintOutcome:
    from scanner.fingerprints.fingerprint import fingerprint_model
    from scanner.reading.validate import validate_checkpoint
    from scanner.sources import materialize

    stage = "fetch"
    try:
        folder = materialize(record, download, token=token)
        stage = "validate"
        valid = validate_checkpoint(folder, follow_links=record.follow_links)
        valid.checkpoint.close()
        stage = "fingerprint"
        fingerprint = fingerprint_model(folder, inputs=inputs, device=device, tensor_hashes=valid.tensor_hashes,
                                        follow_links=record.follow_links)
        stage = "write"
        address, sha = store.write(fingerprint, record.model_id, record.revision, scratch=scratch)
        stage = "profile"
        weights = _weight_profile(valid.adapter) if profile else None
    except Exception as e:  # noqa: BLE001 - a model's failure is data for scan_errors, whatever its type
        return _failed(record, stage, e, started)
    return FingerprintOutcome(record, meta=fingerprint.meta, path=address, file_sha256=sha,
                              n_tokens=inputs.n_sequences * inputs.seq_len, device=device,
                              seconds=time.perf_counter() - started, profile=weights)


def _weight_profile(adapter) -> WeightProfile | None:  # noqa: ANN001 - an adapter of either kind
    """The weight profile, or None for a family whose attention and norm roles hubtrace does not know or weights
    that do not fit them (its pairs then have no weight fingerprints; the fingerprint and phi_MATCH are unaffected:
    an optional statistic never costs a model its fingerprint)."""
    from scanner.reading.weight_profiles import weight_profile

    try:
        return weight_profile(adapter)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def pick_device() -> str:
    """The GPU Ray assigned to this worker (Ray sets CUDA_VISIBLE_DEVICES, so it is ``cuda``), else the CPU.

    Outside Ray (a bench, a single machine) any visible GPU is used; asking Ray for GPU ids there would start a
    local Ray just to answer.
    """
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return "cuda" if not ray.is_initialized() or ray.get_gpu_ids() else "cpu"


@ray.remote(concurrency_groups={"control": 1})
class FingerprintWorker:
    """A long-lived fingerprinting process: torch and transformers load once, then one model at a time.

    ``status`` runs in its own concurrency group, so it answers while a fingerprint is being computed.
    """

    def __init__(self, fingerprint_store: str, inputs: dict, threads: int, scratch: str | None,
                 token: str | None, probe: StoreProbe | None = None, profiles: bool = False) -> None:
        import torch
        from transformers.utils import logging as transformers_logging

        torch.set_num_threads(max(1, threads))
        transformers_logging.disable_progress_bar()  # one bar per model would flood the job log
        transformers_logging.set_verbosity_error()
        self._store = FingerprintStore(fingerprint_store)
        self._inputs = InputSpec(**inputs)
        self._scratch = Path(scratch) if scratch else default_scratch()
        remove_orphans(self._scratch)
        self._token = token
        self._probe = probe
        self._profiles = profiles
        self._device = pick_device()
        self._lock = threading.Lock()
        self._current: str | None = None
        self._done = 0

    @ray.method(concurrency_group="control")
    def status(self) -> WorkerStatus:
        with self._lock:
            return WorkerStatus(os.getpid(), ray.get_runtime_context().get_node_id(), self._device, self._current,
                                self._done)

    def fingerprint(self, record: ModelRecord) -> FingerprintOutcome:
        with self._lock:
            self._current = record.model_id
        try:
            unreachable = _unreachable_store(self._probe)
            if unreachable is not None:  # a node that joined later and cannot reach the store: not even a download
                return FingerprintOutcome(record, error=unreachable)
            return fingerprint_record(record, self._store, self._inputs, device=self._device, scratch=self._scratch,
                                      token=self._token, profile=self._profiles)
        finally:
            with self._lock:
                self._current = None
                self._done += 1


def compare_batch(jobs: list[PairJob], statistic: str, design: SequentialDesign | None = None,
                  workers: int = 1, rule: MatchingRule = "screened", cache: DiskCacheSpec | None = None,
                  probe: StoreProbe | None = None) -> list[PairOutcome]:
    """Test each pair from its two fingerprints, read from the store wherever it is (on the task's GPU when Ray
    gave it one, screening blocks first when a design is given, ``workers`` blocks at once on the host); a failing
    pair becomes an error value. A GPU task's worker outlives the task in Ray's reused worker process, so the next
    batches find their fingerprints resident (scanner.pairs.worker). ``cache``: the node's disk cache of parts of
    remote fingerprints (scanner.fingerprints.cache), shared by every pair task on the node; None: no disk cache.
    ``probe``: on a node that joined after the scan started, the store probe runs first (once per node); if the
    node cannot reach the store, every pair of the batch comes back as a ``store`` error (the driver retries them
    on a node probed at start). A related pair whose depths differ gets its block map on the same worker, right after
    its test (scanner.pairs.block_map)."""
    from scanner.pairs.worker import PairWorker

    unreachable = _unreachable_store(probe)
    if unreachable is not None:
        return [PairOutcome(job, error=unreachable) for job in jobs]
    device = pick_device()
    worker = (_resident_pair_worker(device, statistic, design, workers, rule, cache) if device != "cpu"
              else PairWorker(device, statistic=statistic, design=design, workers=workers, rule=rule,
                              disk_cache=_disk_cache(cache)))
    out = []
    for job in jobs:
        try:
            result = worker.compare(job.path_a, job.path_b, job.block_map, sha256_a=job.sha256_a,
                                    sha256_b=job.sha256_b)
        except Exception as e:  # noqa: BLE001 - recorded as a compare error, the other pairs go on
            out.append(PairOutcome(job, error=WorkFailure("compare", type(e).__name__, one_line(e, REASON_CHARS))))
            continue
        try:
            links = worker.block_map(job.path_a, job.path_b, result, sha256_a=job.sha256_a, sha256_b=job.sha256_b)
        except Exception as e:  # noqa: BLE001 - the map alone is lost; the lineage reads the pair without one
            out.append(PairOutcome(job, result=result,
                                   map_error=WorkFailure("block_map", type(e).__name__, one_line(e, REASON_CHARS))))
            continue
        out.append(PairOutcome(job, result=result, block_map=links))
    return out


def _unreachable_store(probe: StoreProbe | None) -> WorkFailure | None:
    """None when this node may use the store (or there is nothing to probe), else the ``store`` failure."""
    if probe is None:
        return None
    try:
        probe.check()
    except StoreUnreachableError as e:
        return WorkFailure("store", type(e).__name__, one_line(e, REASON_CHARS))
    return None


@dataclass(frozen=True)
class DiskCacheSpec:
    """Where each node keeps its disk cache of remote fingerprint parts (None: the node's default) and its budget."""

    folder: str | None
    max_bytes: int


def _disk_cache(spec: DiskCacheSpec | None) -> FingerprintCache | None:
    if spec is None or spec.max_bytes <= 0:
        return None
    return FingerprintCache(spec.folder, spec.max_bytes)


@functools.cache
def _resident_pair_worker(device: str, statistic: str, design: SequentialDesign | None, workers: int,
                          rule: MatchingRule, cache: DiskCacheSpec | None) -> PairWorker:
    from scanner.pairs.worker import PairWorker

    return PairWorker(device, statistic=statistic, design=design, workers=workers, rule=rule,
                      disk_cache=_disk_cache(cache))


compare_batch_task = ray.remote(compare_batch)
