"""Helpers shared by the store tests and the `hubtrace query` tests: model records, pair-test rows, the
fingerprint fields the store reads, two nights of a scanned hub written straight into a store, and another
process holding the file open for writing as a running scan does."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scanner.sources import ModelRecord
from scanner.store import PairTestRow, Store

T0 = datetime(2024, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Meta:
    """The FingerprintMeta fields the store reads, with defaults, so that a store test writes a model's row without
    taking its fingerprint."""

    architecture: str = "LlamaForCausalLM"
    model_type: str = "llama"
    n_layers: int = 4
    hidden_size: int = 64
    intermediate_size: int = 128
    n_experts: int = 1
    vocab_size: int = 256
    tokenizer_hash: str | None = "tok"
    parameter_count: int = 123_456
    input_set: str = "v1-seed0-32x64-ids<256"
    summaries: dict = field(default_factory=dict)
    mlp_kind: str = "gated"
    attention: str = "causal"


def record(model_id: str, revision: str = "r1", *, bases: tuple[str, ...] = (), scratch: bool = False,
           created: datetime | None = None) -> ModelRecord:
    return ModelRecord(model_id=model_id, revision=revision, source="local", location=f"/hub/{model_id}",
                       base_models=bases, base_model_relation="finetune" if bases else None,
                       claims_from_scratch=scratch, license="mit", tags=("text-generation",),
                       created_at=created, last_modified=created)


def test_row(a: str, ra: str, b: str, rb: str, log10_p: float, run_id: str, *, layers: list[dict] | None = None,
             input_set: str = "v1") -> PairTestRow:
    return PairTestRow(a, ra, b, rb, "match", input_set, log10_p, 2, layers or [], [], "comparable", run_id)


test_row.__test__ = False  # a helper, not a test


def scanned_hub(store: Store) -> tuple[str, str]:
    """Two nights: night 1 finds a base, its declared fine-tune, an undeclared copy of the fine-tune, an
    independent model and a broken one; night 2 sees a new revision of the copy and a new model, and the
    broken one fails again. Returns the two run ids."""
    night1 = store.start_run({"night": 1})
    store.upsert_model(record("org/base", created=T0), Meta(), night1, "ok")
    store.upsert_model(record("org/ft", bases=("org/base",), created=T0 + timedelta(days=1)), Meta(), night1, "ok")
    store.upsert_model(record("copy/ft", scratch=True, created=T0 + timedelta(days=2)), Meta(), night1, "ok")
    store.upsert_model(record("other/indep", created=T0), Meta(), night1, "ok")
    store.upsert_model(record("bad/broken"), None, night1, "error")
    store.record_error(night1, "bad/broken", "r1", "/hub/bad/broken", "validate", "CheckpointError", "NaN weights")
    models = ["org/base", "org/ft", "copy/ft", "other/indep"]
    dependent = {frozenset(p) for p in [("org/base", "org/ft"), ("org/base", "copy/ft"), ("org/ft", "copy/ft")]}
    store.put_pair_tests([test_row(a, "r1", b, "r1", -60.0 if frozenset((a, b)) in dependent else -0.5, night1)
                          for i, a in enumerate(models) for b in models[i + 1:]])
    store.finish_run(night1, "succeeded", {})

    night2 = store.start_run({"night": 2})
    store.upsert_model(record("copy/ft", "r2", scratch=True, created=T0 + timedelta(days=2)), Meta(), night2, "ok")
    store.upsert_model(record("new/model", created=T0 + timedelta(days=3)), Meta(), night2, "ok")
    store.put_pair_tests([test_row("copy/ft", "r2", "org/ft", "r1", -55.0, night2),
                          test_row("new/model", "r1", "org/base", "r1", -0.2, night2)])
    store.record_error(night2, "bad/broken", "r1", "/hub/bad/broken", "validate", "CheckpointError", "NaN weights")
    store.record_error(night2, "new/other", "r1", "/hub/new/other", "fingerprint", "WorkerDied", "SIGKILL")
    store.finish_run(night2, "succeeded", {})
    return night1, night2


HOLD_WRITER = ("import sys; from scanner.store import Store; s = Store(sys.argv[1]); print('ready', flush=True); "
               "sys.stdin.read(); s.close()")
HOLD_READER = HOLD_WRITER.replace("Store(sys.argv[1])", "Store(sys.argv[1], read_only=True)")


@contextmanager
def writer_holding(db: Path, script: str = HOLD_WRITER) -> Iterator[subprocess.Popen]:
    """Another process with ``db`` open read-write (as a running scan has it; or as ``script`` opens it) until the
    block ends."""
    writer = subprocess.Popen([sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        yield writer
    finally:
        writer.stdin.close()
        writer.wait()
