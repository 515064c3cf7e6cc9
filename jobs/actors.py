"""The scan's Ray workers: fingerprinting actors and pair-comparison tasks.

Failures come back as values (`WorkFailure`: stage, exception type, one-line reason), never as exceptions into
the driver, so one broken checkpoint costs one ``scan_errors`` row and nothing else. Only a dying process (OOM,
SIGKILL) escapes that; Ray restarts the actor and retries its task, which is safe because a fingerprint is
written atomically to a path fixed by model, revision and input set.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import ray

from scanner.errors import one_line
from scanner.inputs import InputSpec
from scanner.results import PairTestResult

if TYPE_CHECKING:
    from scanner.fingerprint import Fingerprint, FingerprintMeta
    from scanner.sources import ModelRecord
    from scanner.stats.sequential import SequentialDesign

#: Fingerprints a pair task keeps in memory: batches are ordered by first model, so a few suffice.
FINGERPRINT_CACHE = 4


@dataclass(frozen=True)
class WorkFailure:
    """Why one model (or pair) failed: the stage it reached, the exception type and a one-line reason."""

    stage: str        # "fetch" | "validate" | "fingerprint" | "write" | "compare" | "worker" | "discover"
    error_type: str
    reason: str


@dataclass(frozen=True)
class FingerprintOutcome:
    """A model's fingerprint on disk (path, sha256, metadata), or the error that stopped it."""

    record: ModelRecord
    meta: FingerprintMeta | None = None
    path: str | None = None
    file_sha256: str | None = None
    n_tokens: int | None = None
    device: str | None = None
    seconds: float = 0.0
    error: WorkFailure | None = None


@dataclass(frozen=True)
class WorkerStatus:
    """What a worker is doing now; answered from its own thread even mid-fingerprint."""

    pid: int
    device: str
    current: str | None   # model id being fingerprinted, if any
    done: int


@dataclass(frozen=True)
class PairJob:
    """One pair to test, ``model_a < model_b``, with the fingerprint files of both at their revisions."""

    model_a: str
    revision_a: str
    path_a: str
    model_b: str
    revision_b: str
    path_b: str
    input_set: str
    reason: str       # "comparable" | "declared_base"
    block_map: tuple[tuple[int, int], ...] = ()   # retrieval's block pairs, used when the depths differ


@dataclass(frozen=True)
class PairOutcome:
    job: PairJob
    result: PairTestResult | None = None
    error: WorkFailure | None = None


def fingerprint_destination(root: Path, model_id: str, revision: str, input_set: str) -> Path:
    """``<root>/<model_id>/<revision>/<input_set>.safetensors``: one file per model, revision and input set."""
    return Path(root) / model_id / revision / f"{input_set}.safetensors"


def _failed(record: ModelRecord, stage: str, error: BaseException, started: float) -> FingerprintOutcome:
    return FingerprintOutcome(record, seconds=time.perf_counter() - started,
                              error=WorkFailure(stage, type(error).__name__, one_line(error)))


def fingerprint_record(record: ModelRecord, fingerprint_root: Path, inputs: InputSpec, *, device: str = "cpu",
                       download_dir: Path | None = None, token: str | None = None) -> FingerprintOutcome:
    """Fetch (Hub records), validate, fingerprint and write one model; every failure is returned, not raised."""
    from scanner.fingerprint import fingerprint_model, write_fingerprint
    from scanner.retrieval.index import entry_path, write_entry
    from scanner.retrieval.signatures import retrieval_entry
    from scanner.sources import materialize
    from scanner.validate import validate_checkpoint

    started = time.perf_counter()
    stage = "fetch"
    try:
        folder = materialize(record, download_dir or fingerprint_root / "hub-cache", token=token)
        stage = "validate"
        valid = validate_checkpoint(folder)
        valid.checkpoint.close()
        stage = "fingerprint"
        fingerprint = fingerprint_model(folder, inputs=inputs, device=device, tensor_hashes=valid.tensor_hashes)
        stage = "write"
        target = fingerprint_destination(fingerprint_root, record.model_id, record.revision, fingerprint.meta.input_set)
        target.parent.mkdir(parents=True, exist_ok=True)
        sha = write_fingerprint(fingerprint, target)
        write_entry(retrieval_entry(fingerprint), entry_path(target))   # candidate retrieval's part, kept beside
    except Exception as e:  # noqa: BLE001 - a model's failure is data for scan_errors, whatever its type
        return _failed(record, stage, e, started)
    return FingerprintOutcome(record, meta=fingerprint.meta, path=str(target), file_sha256=sha,
                              n_tokens=inputs.n_sequences * inputs.seq_len, device=device,
                              seconds=time.perf_counter() - started)


def pick_device() -> str:
    """The GPU Ray assigned to this worker (Ray sets CUDA_VISIBLE_DEVICES, so it is ``cuda``), else the CPU."""
    import torch

    if ray.get_gpu_ids() and torch.cuda.is_available():
        return "cuda"
    return "cpu"


@ray.remote(concurrency_groups={"control": 1})
class FingerprintWorker:
    """A long-lived fingerprinting process: torch and transformers load once, then one model at a time.

    ``status`` runs in its own concurrency group, so it answers while a fingerprint is being computed.
    """

    def __init__(self, fingerprint_root: str, inputs: dict, threads: int, download_dir: str | None,
                 token: str | None) -> None:
        import torch
        from transformers.utils import logging as transformers_logging

        torch.set_num_threads(max(1, threads))
        transformers_logging.disable_progress_bar()  # one bar per model would flood the job log
        transformers_logging.set_verbosity_error()
        self._root = Path(fingerprint_root)
        self._inputs = InputSpec(**inputs)
        self._download_dir = Path(download_dir) if download_dir else None
        self._token = token
        self._device = pick_device()
        self._lock = threading.Lock()
        self._current: str | None = None
        self._done = 0

    @ray.method(concurrency_group="control")
    def status(self) -> WorkerStatus:
        with self._lock:
            return WorkerStatus(os.getpid(), self._device, self._current, self._done)

    def fingerprint(self, record: ModelRecord) -> FingerprintOutcome:
        with self._lock:
            self._current = record.model_id
        try:
            return fingerprint_record(record, self._root, self._inputs, device=self._device,
                                      download_dir=self._download_dir, token=self._token)
        finally:
            with self._lock:
                self._current = None
                self._done += 1


def compare_batch(jobs: list[PairJob], statistic: str, design: SequentialDesign | None = None) -> list[PairOutcome]:
    """Test each pair from its two fingerprint files (cosine matrices on the task's GPU when Ray gave it one,
    screening blocks first when a design is given); a failing pair becomes an error value."""
    from scanner.fingerprint import read_fingerprint
    from scanner.fingerprint_compare import compare_fingerprints

    cache: OrderedDict[str, Fingerprint] = OrderedDict()

    def load(path: str) -> Fingerprint:
        if path in cache:
            cache.move_to_end(path)
        else:
            cache[path] = read_fingerprint(path)
            if len(cache) > FINGERPRINT_CACHE:
                cache.popitem(last=False)
        return cache[path]

    device = pick_device()
    out = []
    for job in jobs:
        try:
            result = compare_fingerprints(load(job.path_a), load(job.path_b), statistic, device=device, design=design,
                                          block_map=job.block_map)
            out.append(PairOutcome(job, result=result))
        except Exception as e:  # noqa: BLE001 - recorded as a compare error, the other pairs go on
            out.append(PairOutcome(job, error=WorkFailure("compare", type(e).__name__, one_line(e))))
    return out


compare_batch_task = ray.remote(compare_batch)
