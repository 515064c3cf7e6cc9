"""The scan job: discover models, fingerprint the new ones on Ray actors, test pairs as Ray tasks, keep it all in
DuckDB, rebuild the lineage.

    python -m jobs.scan --config configs/demo.yaml [--local DIR] [--db FILE] [--output DIR]   (jobs/scan.py)
    hubtrace scan --config configs/nightly-hub.yaml
    ray job submit --working-dir . -- python -m jobs.scan --config configs/nightly-hub.yaml

The driver is the only process that opens the database (DuckDB allows one writer): workers return results as
values and the driver stores each as it arrives, in its own transaction, keyed so that storing it twice is
harmless. A killed scan rerun therefore picks up where it stopped: models whose revision is already stored with
a fingerprint are skipped, pairs already tested at these revisions are not tested again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from rich.console import Console

from jobs.actors import DiskCacheSpec, FingerprintOutcome, PairJob, PairOutcome, WorkFailure, compare_batch_task
from jobs.cluster import StoreProbe, alive_nodes, check_fingerprint_store, check_store_from_every_node
from jobs.config import ConfigError, HfCacheSourceConfig, HubSourceConfig, ScanConfig
from jobs.ownership import claim_fingerprint_store
from jobs.pairs import Candidate, PairPlan, batches, plan_pairs
from jobs.pool import FingerprintPool, PoolShape, WorkersNotStartedError, pool_shape, windowed
from jobs.summary import ScanSummary
from scanner.errors import one_line, without_sql_excerpt
from scanner.fingerprints.store import FingerprintStore
from scanner.sources import ModelRecord, SourceFailure, discover_hf_cache, discover_hub, discover_local
from scanner.text_safety import terminal

if TYPE_CHECKING:
    from scanner.store import LastError, PairKey, PairTestRow, Store

#: Error stages worth retrying on the next run even at an unchanged revision (the model may be fine).
TRANSIENT_STAGES = frozenset({"fetch", "worker", "store"})


class ScanObserver:
    """Hooks into a running scan (progress displays, fault-injection tests); every method is optional."""

    def on_fingerprint_submitted(self, pool: FingerprintPool, record: ModelRecord) -> None: ...

    def on_pairs_stored(self, stored: int, total: int) -> None: ...


def input_set_prefix(config: ScanConfig) -> str:
    """The part of an input set id fixed by the spec (the token range is per model): ``v1-seed0-4x64-``."""
    s = config.inputs.spec()
    return f"v{s.version}-seed{s.seed}-{s.n_sequences}x{s.seq_len}-"


def discover(config: ScanConfig) -> Iterator[ModelRecord | SourceFailure]:
    """Records from every configured source in order; a model id seen twice keeps its first source."""
    seen: set[str] = set()
    for source in config.sources:
        if isinstance(source, HubSourceConfig):
            found = discover_hub(endpoint=source.endpoint, token=os.environ.get(source.token_env),
                                 author=source.author, search=source.search, filter=source.filter, limit=source.limit)
        elif isinstance(source, HfCacheSourceConfig):
            found = discover_hf_cache(source.cache_dir)
        else:
            found = discover_local(source.path, follow_links=source.follow_links)
        for item in found:
            if isinstance(item, ModelRecord):
                if item.model_id in seen:
                    continue
                seen.add(item.model_id)
            yield item


@dataclass
class _Known:
    """What the store already holds for this input spec, loaded once at the start of a run."""

    revisions: dict[str, tuple[str, str]] = field(default_factory=dict)     # model -> (revision, status)
    fingerprinted: set[tuple[str, str]] = field(default_factory=set)        # (model, revision), file present
    last_error: dict[tuple[str, str], LastError] = field(default_factory=dict)  # (model, revision) -> error
    missing: dict[tuple[str, str], str] = field(default_factory=dict)       # (model, revision) -> recorded address

    @classmethod
    def load(cls, store: Store, prefix: str, stored: set[str]) -> _Known:
        """``stored``: the addresses the fingerprint store holds now (a row without its file is not a fingerprint)."""
        rows = store.fingerprints_on(prefix)
        fingerprinted = {(model_id, revision) for model_id, revision, path in rows if path in stored}
        missing = {(model_id, revision): path for model_id, revision, path in rows
                   if path not in stored and (model_id, revision) not in fingerprinted}
        return cls(store.current_revisions(), fingerprinted, store.last_errors(), missing)

    def needs_fingerprint(self, record: ModelRecord, rescan_errors: bool) -> bool:
        revision, status = self.revisions.get(record.model_id, (None, None))
        if revision != record.revision:
            return True
        if status == "ok":
            return (record.model_id, revision) not in self.fingerprinted
        error = self.last_error.get((record.model_id, revision))
        return rescan_errors or error is None or error.stage in TRANSIENT_STAGES

    def failed_before(self, record: ModelRecord) -> LastError | None:
        """The error of a model that is not fingerprinted again because it failed at this very revision (its files
        are unchanged, so it would fail the same way)."""
        revision, status = self.revisions.get(record.model_id, (None, None))
        return self.last_error.get((record.model_id, revision)) if status == "error" else None


def connect_ray(config: ScanConfig) -> bool:
    """Join the configured cluster, or the one in RAY_ADDRESS (``ray job submit``), or start a local one.
    Returns whether this call started Ray (and so should shut it down)."""
    if ray.is_initialized():
        return False
    address = config.ray.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
    else:
        ray.init(address="local", num_cpus=config.ray.num_cpus or os.cpu_count(), include_dashboard=False)
    return True


class _Scan:
    """One run: owns the store connection, the console and the counters that become the summary."""

    def __init__(self, config: ScanConfig, store: Store, fingerprints: FingerprintStore, observer: ScanObserver,
                 console: Console, probed: frozenset[str] | None = None) -> None:
        self.config, self.store, self.observer, self.console = config, store, observer, console
        self.fingerprints = fingerprints
        self.run_id = store.start_run(config.to_json_dict())
        #: Nodes that join later probe an object store on first use (None: a local store, nothing to probe).
        self.probe = None if probed is None else StoreProbe(fingerprints.location, self.run_id, probed)
        self.summary = ScanSummary(run_id=self.run_id, db=str(config.db_path))
        self.prefix = input_set_prefix(config)

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.summary.stage_seconds[stage] = time.perf_counter() - started

    def say(self, message: str) -> None:
        """One progress line; ids and reasons in it are hub text, so no escape sequence reaches the terminal."""
        self.console.print(terminal(message), markup=False, highlight=False, soft_wrap=True)

    # discovery -> fingerprints ---------------------------------------------------------------------------
    def _to_fingerprint(self, known: _Known) -> Iterator[ModelRecord]:
        for item in discover(self.config):
            if isinstance(item, SourceFailure):
                self.summary.source_errors += 1
                self.summary.failures["discover"] += 1
                self.store.record_error(self.run_id, item.model_id, None, item.location, "discover", "SourceFailure",
                                        item.reason)
                self.say(f"[discover] {item.model_id}: {item.reason}")
                continue
            self.summary.models += 1
            if known.needs_fingerprint(item, self.config.rescan_errors):
                if (item.model_id, item.revision) in known.missing:
                    self._record_lost_fingerprint(item.model_id, item.revision, known.missing[item.model_id,
                                                                                             item.revision],
                                                  "FingerprintMissing", "its fingerprint file is gone from the store")
                yield item
            elif (error := known.failed_before(item)) is not None:
                self._repeat_model_error(item, error)
            else:
                self.summary.skipped += 1

    def fingerprint_stage(self, pool: FingerprintPool) -> None:
        stored = self.fingerprints.existing()  # one listing of the store (forgetting drops rows, not files)
        if self.config.pairs.select == "candidates":
            self._forget_unreadable_fingerprints(stored)
        known = _Known.load(self.store, self.prefix, stored)

        def submit(record: ModelRecord) -> ray.ObjectRef:
            ref = pool.submit(record)
            self.observer.on_fingerprint_submitted(pool, record)
            return ref

        for record, ref in windowed(self._to_fingerprint(known), submit, pool.shape.max_in_flight):
            self._store_fingerprint(pool.result(record, ref))

    def _store_fingerprint(self, outcome: FingerprintOutcome) -> None:
        r = outcome.record
        if outcome.error is None:
            self.store.upsert_model(r, outcome.meta, self.run_id, "ok")
            self.store.put_fingerprint(r.model_id, r.revision, outcome.meta.input_set, outcome.path,
                                       outcome.file_sha256, outcome.n_tokens, self.run_id)
            if outcome.profile is not None:
                self.store.put_weight_profile(r.model_id, r.revision, outcome.profile)
            self.summary.fingerprinted += 1
            self.say(f"[fingerprint] {r.model_id} ok ({outcome.seconds:.1f} s on {outcome.device})")
        else:
            self._record_model_error(r, outcome.error)

    def _forget_unreadable_fingerprints(self, stored: set[str]) -> None:
        """Before fingerprinting: every stored fingerprint whose retrieval entry can be neither read nor made from
        it (a damaged file) is recorded in scan_errors and forgotten, so this run fingerprints the model anew and
        the candidate stage never meets it. The entries of the others are left ready for that stage."""
        from scanner.retrieval.scan import unreadable_entries

        current = [Candidate(*row) for row in self.store.fingerprinted_ok_models(self.prefix) if row[3] in stored]
        by_key = {(c.model_id, c.revision, c.input_set): c for c in current}
        try:
            unreadable = unreadable_entries(self.config.db_path, current, self.store.identity())
        except OSError as e:  # not one fingerprint's fault: recorded once, and no fingerprint is forgotten for it
            self.store.record_error(self.run_id, "(retrieval)", None, str(self.config.db_path), "retrieval",
                                    type(e).__name__, f"stored entries not checked: {one_line(e)}")
            self.summary.failures["retrieval"] += 1
            self.say(f"[retrieval] stored entries not checked: {terminal(one_line(e))}")
            return
        for key, reason in unreadable.items():
            self.store.forget_fingerprint(*key)
            self._record_lost_fingerprint(key[0], key[1], by_key[key].path, "FingerprintError", reason)

    def _record_lost_fingerprint(self, model_id: str, revision: str, location: str, error_type: str,
                                 reason: str) -> None:
        """A stored fingerprint that is gone or damaged: one scan_errors row (stage `store`, so the model is
        fingerprinted anew however the last run ended), and the model is fingerprinted again."""
        self.store.record_error(self.run_id, model_id, revision, location, "store", error_type,
                                f"{reason}; fingerprinted again")
        self.say(f"[store] {model_id}: {error_type}: {reason}; fingerprinted again")

    def _record_model_error(self, record: ModelRecord, error: WorkFailure) -> None:
        self.store.upsert_model(record, None, self.run_id, "error")
        self.store.record_error(self.run_id, record.model_id, record.revision, record.location, error.stage,
                                error.error_type, error.reason)
        self.summary.failures[error.stage] += 1
        self.say(f"[{error.stage}] {record.model_id}: {error.error_type}: {error.reason}")

    def _repeat_model_error(self, record: ModelRecord, error: LastError) -> None:
        """A model that failed at this revision and is not tried again (nothing it is read from changed): its error
        is recorded for this run too, so the summary and `hubtrace query --errors` keep showing it until it is fixed
        (`rescan_errors: true` tries it anyway)."""
        self.store.upsert_model(record, None, self.run_id, "error")
        self.store.record_error(self.run_id, record.model_id, record.revision, record.location, error.stage,
                                error.error_type or "Error", error.reason or "")
        self.summary.failures[error.stage] += 1
        self.summary.not_retried += 1
        self.say(f"[{error.stage}] {record.model_id}: {error.error_type}: {error.reason} (unchanged since it failed "
                 f"in run {error.run_id}: not tried again)")

    # pairs ------------------------------------------------------------------------------------------------
    def plan(self) -> PairPlan:
        stored = self.fingerprints.existing()
        candidates = [Candidate(*row) for row in self.store.fingerprinted_ok_models(self.prefix) if row[3] in stored]
        tested: set[PairKey] = set()
        for input_set in {c.input_set for c in candidates}:
            tested |= self.store.tested_pair_keys(self.config.statistic, input_set)
        retrieved = self.retrieve(candidates) if self.config.pairs.select == "candidates" else None
        plan = plan_pairs(candidates, tested, comparable=self.config.pairs.comparable,
                          declared=self.config.pairs.declared, retrieved=retrieved)
        self.summary.pairs = plan.to_json_dict()
        self._warn_if_nothing_tested(plan)
        return plan

    def _warn_if_nothing_tested(self, plan: PairPlan) -> None:
        """A run that had new work (revisions fingerprinted, the index queried or rebuilt) and still tests no pair
        while comparable pairs have no test says so, with why: a scan never tests nothing in silence. (A rerun with
        nothing new tests nothing by design; its summary still counts the untested pairs.)"""
        retrieval = self.summary.retrieval
        new_work = self.summary.fingerprinted or retrieval.get("queried") or retrieval.get("rebuilt")
        if plan.jobs or not plan.untested or not new_work:
            return
        if plan.select == "all":
            why = "pairs.comparable is false, so only declared pairs are tested"
        elif not retrieval:
            why = "candidate retrieval failed in this run (scan_errors, stage retrieval)"
        else:
            why = (f"candidate retrieval chose none of them ({retrieval.get('queried', 0)} revisions queried the "
                   f"index, min score {retrieval.get('min_score')})")
        self.warn(f"no pair tested, though {plan.untested} comparable pairs have none and "
                  f"{self.summary.fingerprinted} revisions were fingerprinted in this run: {why}")

    def warn(self, message: str) -> None:
        """Something a person must know about this run: said now, and kept in its summary (scan_runs)."""
        self.summary.warnings.append(message)
        self.say(f"[warning] {message}")

    def retrieve(self, candidates: list[Candidate]) -> dict[PairKey, tuple[tuple[int, int], ...]]:
        """Candidate retrieval (scanner.retrieval.scan): the new revisions query the persistent index, the
        pairs found are stored, and the candidates are every current retrieved pair plus their families."""
        from scanner.retrieval.scan import retrieve_candidates

        try:
            outcome = retrieve_candidates(self.store, self.config.db_path, candidates, self.run_id,
                                          min_score=self.config.pairs.min_score, index_kind=self.config.pairs.index,
                                          map_threshold=self.config.pairs.map_threshold)
        except Exception as e:  # noqa: BLE001 - a broken index or entry costs this run's candidates, not the scan
            self.store.record_error(self.run_id, "(retrieval)", None, str(self.config.db_path), "retrieval",
                                    type(e).__name__, one_line(e))
            self.summary.failures["retrieval"] += 1
            self.say(f"[retrieval] {type(e).__name__}: {one_line(e)}; only declared pairs are tested this run")
            return {}
        self.summary.retrieval = outcome.to_json_dict()
        for input_set, why in outcome.rebuilt.items():
            self.say(f"[retrieval] index of {input_set} rebuilt from the fingerprints: {why}")
        return outcome.block_maps

    def pair_stage(self, plan: PairPlan, shape: PoolShape) -> None:
        total, stored = len(plan.jobs), 0
        gpus = self.config.devices.gpus_per_pair_task if shape.num_gpus else 0.0
        task = compare_batch_task.options(num_cpus=self.config.ray.cpus_per_pair_task, num_gpus=gpus)
        work = batches(plan.jobs, self.config.pairs.batch_size)
        sequential = self.config.pairs.sequential
        design = sequential.design() if sequential is not None else None
        workers = max(1, int(self.config.ray.cpus_per_pair_task))  # blocks compared at once: the task's CPUs
        rule = self.config.pairs.matching
        cache = None if self.fingerprints.is_local else DiskCacheSpec(self.config.fingerprint_cache.dir,
                                                                      self.config.fingerprint_cache.max_bytes)
        args = (self.config.statistic, design, workers, rule, cache, self.probe)
        unreachable: list[PairJob] = []   # pairs sent to a late-joining node that cannot reach the store
        for _batch, ref in windowed(work, lambda b: task.remote(b, *args), shape.max_in_flight):
            outcomes: list[PairOutcome] = ray.get(ref)
            unreachable += [o.job for o in outcomes if o.error is not None and o.error.stage == "store"]
            outcomes = [o for o in outcomes if o.error is None or o.error.stage != "store"]
            stored = self._store_pair_outcomes(outcomes, stored, total)
        if unreachable:  # once more, each batch pinned (softly) to a node the scan probed at start
            nodes = sorted(self.probe.probed) if self.probe else []
            retry = [(b, task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nodes[i % len(nodes)],
                                                                                         soft=True)))
                     for i, b in enumerate(batches(unreachable, self.config.pairs.batch_size))]
            self.say(f"[pairs] {len(unreachable)} pairs landed on nodes that cannot reach the store: retrying them "
                     "on nodes probed at start")
            for b, pinned in retry:
                stored = self._store_pair_outcomes(ray.get(pinned.remote(b, *args)), stored, total)

    def _store_pair_outcomes(self, outcomes: list[PairOutcome], stored: int, total: int) -> int:
        """Store one batch's tests and errors; returns the pairs stored so far."""
        from scanner.pairs.block_map import encoded
        from scanner.store import PairTestRow

        rows = [PairTestRow(o.job.model_a, o.job.revision_a, o.job.model_b, o.job.revision_b,
                            self.config.statistic, o.job.input_set, o.result.log10_p, o.result.n_layers,
                            [asdict(layer) for layer in o.result.layers], list(o.result.notes), o.job.reason,
                            self.run_id, o.result.closeness, cannot_test=o.result.cannot_test,
                            block_map=None if o.block_map is None else encoded(o.block_map))
                for o in outcomes if o.error is None]
        self.store.put_pair_tests(rows)
        for o in outcomes:
            if o.map_error is not None:  # the test is stored; the lineage reads the pair without its map
                self.store.record_error(self.run_id, f"{o.job.model_a} | {o.job.model_b}", o.job.revision_b,
                                        o.job.path_b, o.map_error.stage, o.map_error.error_type, o.map_error.reason)
                self.say(f"[block_map] {o.job.model_a} | {o.job.model_b}: {o.map_error.error_type}: "
                         f"{o.map_error.reason} (the test is stored, without its block map)")
            if o.error is not None:
                self.summary.pairs_failed += 1
                self.store.record_error(self.run_id, f"{o.job.model_a} | {o.job.model_b}", o.job.revision_b,
                                        o.job.path_b, o.error.stage, o.error.error_type, o.error.reason)
                if o.error.error_type == "FingerprintError":  # a damaged file: fingerprinted again next run
                    for model, revision, path in ((o.job.model_a, o.job.revision_a, o.job.path_a),
                                                  (o.job.model_b, o.job.revision_b, o.job.path_b)):
                        if path in o.error.reason:
                            self.store.forget_fingerprint(model, revision, o.job.input_set)
                            self._record_lost_fingerprint(model, revision, path, o.error.error_type,
                                                          o.error.reason)
        stored += len(outcomes)
        self.summary.pairs_tested += len(rows)
        self.summary.pairs_cannot_test += sum(row.cannot_test is not None for row in rows)
        self.say(f"[pairs] stored {stored}/{total} pair tests")
        self.observer.on_pairs_stored(stored, total)
        return stored

    # weight fingerprints ------------------------------------------------------------------------------------
    def weight_statistics_stage(self) -> None:
        """``pairs.extra_stats``: each weight fingerprint of every pair phi_MATCH tested that has none yet (both
        models profiled), stored beside it; then the empirical p-values of those that need one, from the hub's own
        pairs phi_MATCH found independent (scanner.stats.weight_statistics)."""
        from scanner.stats.registry import weight_statistic
        from scanner.store import PairTestRow

        names = self.config.pairs.extra_stats
        tested = self.store.weight_statistic_rows(self.config.statistic, self.config.statistic)
        profiles = self.store.weight_profiles({(r[0], r[1]) for r in tested} | {(r[2], r[3]) for r in tested})
        rows = []
        unprofiled = sum(1 for r in tested if (r[0], r[1]) not in profiles or (r[2], r[3]) not in profiles)
        if unprofiled:
            self.say(f"[weight statistics] {unprofiled} of {len(tested)} pairs have a model without a weight profile "
                     "(fingerprinted before pairs.extra_stats was set, or roles unknown): no weight statistics")
        for name in names:
            done = {r[:5] for r in self.store.weight_statistic_rows(name, self.config.statistic)}
            for model_a, revision_a, model_b, revision_b, input_set, _, _, _, _, reason, _ in tested:
                a, b = profiles.get((model_a, revision_a)), profiles.get((model_b, revision_b))
                if a is None or b is None or (model_a, revision_a, model_b, revision_b, input_set) in done:
                    continue
                try:
                    result = weight_statistic(name, a, b, permutations=999)
                    value, log10_p, note = result.value, result.log10_p, result.null
                except Exception as e:  # noqa: BLE001 - an extra statistic never stops the scan
                    value, log10_p, note = float("nan"), None, f"no value: {one_line(e)}"
                rows.append(PairTestRow(model_a, revision_a, model_b, revision_b, name, input_set, log10_p, 0,
                                        notes=[note], reason=reason, run_id=self.run_id, value=value))
        self.store.put_pair_tests(rows)
        self.store.put_pair_tests(self._empirical_p_values(names))
        self.summary.weight_statistics = len(rows)

    def _empirical_p_values(self, names: list[str]) -> list[PairTestRow]:
        """The stored rows of the statistics that have only an empirical null, with their p-values against the
        current pairs of the same kind (model types, depths, widths) whose phi_MATCH p is above NULL_MATCH_P (each
        pair's own models left out of its null), or none, with the reason, where fewer than MIN_NULL_PAIRS are left."""
        from scanner.stats.registry import EMPIRICAL_NULL_STATISTICS
        from scanner.stats.weight_statistics import (
            MIN_NULL_PAIRS,
            NULL_MATCH_P,
            describe_kind,
            leave_out_log10_p,
            pair_kind,
        )
        from scanner.store import PairTestRow, queries

        shapes = queries.model_shapes(self.store)
        updated = []
        for name in (n for n in names if n in EMPIRICAL_NULL_STATISTICS):
            rows = self.store.weight_statistic_rows(name, self.config.statistic)
            kinds = [pair_kind(shapes[(r[0], r[1])], shapes[(r[2], r[3])])
                     if (r[0], r[1]) in shapes and (r[2], r[3]) in shapes else None for r in rows]
            null = queries.empirical_null(self.store, name, self.config.statistic)
            observed = [(r[0], r[2], r[5], kind) for r, kind in zip(rows, kinds, strict=True)]
            for row, kind, (log10_p, size) in zip(rows, kinds, leave_out_log10_p(observed, null), strict=True):
                pairs = "pairs" if kind is None else f"pairs of {describe_kind(kind)}"
                note = (f"empirical null: {size} of this hub's {pairs} whose phi_MATCH p > {NULL_MATCH_P}, none with "
                        f"either of this pair's models (p cannot go below 1/{size + 1})" if log10_p is not None else
                        f"no p-value: {size} of this hub's {pairs} have phi_MATCH p > {NULL_MATCH_P} and neither of "
                        f"this pair's models, fewer than the {MIN_NULL_PAIRS} an empirical null needs")
                updated.append(PairTestRow(*row[:4], name, row[4], log10_p, 0, notes=[note], reason=row[9],
                                           run_id=row[10], value=row[5]))
        return updated

    # lineage and exports ----------------------------------------------------------------------------------
    def lineage_stage(self) -> None:
        from lineage_graph.export import lineage_graph, write_graph
        from lineage_graph.persist import rebuild_lineage

        lineage = rebuild_lineage(self.store, q=self.config.lineage.q, method=self.config.lineage.method,
                                  statistic=self.config.statistic,
                                  min_direction_confidence=self.config.lineage.min_direction_confidence)
        self.summary.families = {f.family_id: list(f.members) for f in lineage.families if len(f.members) > 1}
        self.summary.dependent_pairs = sum(e.dependent for e in lineage.edges)
        self.summary.discrepancies = len(lineage.discrepancies)
        graph = lineage_graph(lineage)
        for fmt in self.config.exports:
            try:
                path = write_graph(graph, fmt, self.config.export_dir / f"lineage.{fmt}")
                self.summary.exports[fmt] = str(path)
            except Exception as e:  # noqa: BLE001 - an export failing does not undo the scan
                self.say(f"[export] {fmt} failed: {e}")


def run_scan(config: ScanConfig, *, observer: ScanObserver | None = None,
             console: Console | None = None) -> ScanSummary:
    """Run one scan end to end and return its summary (also stored in ``scan_runs.summary``)."""
    import duckdb

    from scanner.store import Store, StoreError

    console = console or Console()
    fingerprints = FingerprintStore(config.fingerprint_location)
    if config.db_path.exists():  # a database another process holds: one StoreLockedError before Ray starts
        Store(config.db_path).close()
    started_ray = connect_ray(config)
    started = time.perf_counter()
    try:
        check_fingerprint_store(fingerprints, alive_nodes(), config.fingerprint_store_shared)
        _make_folders(config, fingerprints)  # refused settings leave no file behind
        fingerprints.prepare()
        probed = None if fingerprints.is_local else check_store_from_every_node(fingerprints.location)
        with Store(config.db_path) as store:
            claimed = claim_fingerprint_store(fingerprints, store, config.db_path)
            scan = _Scan(config, store, fingerprints, observer or ScanObserver(), console, probed)
            try:
                if claimed is not None:
                    scan.warn(claimed)
                _run_stages(scan, config, fingerprints)
            except BaseException:
                scan.summary.seconds = time.perf_counter() - started
                with suppress(duckdb.Error):  # a database that failed under the scan may refuse this too
                    store.finish_run(scan.run_id, "failed", scan.summary.to_json_dict())
                raise
            scan.summary.seconds = time.perf_counter() - started
            store.finish_run(scan.run_id, "succeeded", scan.summary.to_json_dict())
            return scan.summary
    except duckdb.Error as exc:  # the file failed under the scan (damaged, disk full): one line, not a traceback
        raise StoreError(f"the scan database {config.db_path} failed during the scan: {without_sql_excerpt(exc)}; "
                         "if the file is damaged, restore it from a copy or delete it to start anew") from exc
    finally:
        if started_ray:
            ray.shutdown()


def _run_stages(scan: _Scan, config: ScanConfig, fingerprints: FingerprintStore) -> None:
    """One run's stages in order: fingerprints on the actor pool, then pairs, weight statistics, lineage."""
    shape = pool_shape(config, ray.cluster_resources())
    scan.summary.actors, scan.summary.device = shape.actors, shape.device
    scan.say(f"scan {scan.run_id}: {shape.actors} {shape.device} fingerprint actor(s), "
             f"at most {shape.max_in_flight} models in flight; database {config.db_path}; "
             f"fingerprints {fingerprints.location}")
    token = next((os.environ.get(s.token_env) for s in config.sources if isinstance(s, HubSourceConfig)), None)
    with scan.timed("fingerprint"):
        pool = FingerprintPool(shape, config, fingerprints.location, token, scan.probe)
        try:
            scan.fingerprint_stage(pool)
            if missing := pool.not_started:
                scan.warn(f"{missing} of {shape.actors} fingerprint actors never started (the cluster had no room "
                          "for them); the models were fingerprinted on the others")
        except WorkersNotStartedError as exc:  # kept in the failed run's summary too, not only on the console
            scan.warn(str(exc))
            raise
        finally:
            pool.shutdown()  # frees the actors' CPUs/GPUs for the pair tasks
    with scan.timed("pairs"):
        plan = scan.plan()
        scan.say(f"pairs: {plan.comparable} comparable, "
                 + (f"{plan.retrieved} retrieved, " if plan.select == "candidates" else "")
                 + f"{plan.declared} declared, {sum(plan.incomparable.values())} incomparable, "
                 f"{plan.already_tested} already tested, {len(plan.jobs)} to test")
        scan.pair_stage(plan, shape)
    if config.pairs.extra_stats:
        with scan.timed("weight statistics"):
            scan.weight_statistics_stage()
    with scan.timed("lineage"):
        scan.lineage_stage()


def _make_folders(config: ScanConfig, fingerprints: FingerprintStore) -> None:
    """The database's folder and a local fingerprint store: one that cannot be made (a file in the way, no
    permission) is one line, not a traceback."""
    folders = [config.db_path.parent, *([Path(fingerprints.location)] if fingerprints.is_local else [])]
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the folder {folder} for the scan's output: "
                              f"{exc.strerror or exc}") from exc
