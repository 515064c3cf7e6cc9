"""Rebuild the lineage tables from the store: read current models and pair tests, compute, write back in one
transaction (readers see the old lineage or the new one, never half of each)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import polars as pl

from lineage_graph.evidence import ModelInfo, PairTest
from lineage_graph.multiple_testing import Method
from lineage_graph.lineage import Lineage, compute_lineage

if TYPE_CHECKING:
    from scanner.store import Store

LINEAGE_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS lineage_edges (
        model_a VARCHAR, model_b VARCHAR, statistic VARCHAR, input_set VARCHAR,
        log10_p DOUBLE, log10_q DOUBLE, dependent BOOLEAN, joins_family BOOLEAN,
        parent VARCHAR, child VARCHAR, direction_confidence DOUBLE, direction_reasons VARCHAR[],
        blocks_matched INTEGER, block_map JSON, family_id VARCHAR, tree_link VARCHAR,
        q DOUBLE, method VARCHAR, built_at TIMESTAMPTZ,
        PRIMARY KEY (model_a, model_b))""",
    """CREATE TABLE IF NOT EXISTS families (
        family_id VARCHAR PRIMARY KEY, root VARCHAR, n_members INTEGER,
        first_built_at TIMESTAMPTZ, built_at TIMESTAMPTZ, q DOUBLE, method VARCHAR)""",
    """CREATE TABLE IF NOT EXISTS family_members (
        family_id VARCHAR, model_id VARCHAR, revision VARCHAR, is_root BOOLEAN,
        parents VARCHAR[], merge_parents VARCHAR[],
        PRIMARY KEY (family_id, model_id))""",
    """CREATE TABLE IF NOT EXISTS discrepancies (
        model_id VARCHAR, kind VARCHAR, related_model VARCHAR, confidence DOUBLE,
        detail VARCHAR, evidence JSON, built_at TIMESTAMPTZ)""",
)
"""The lineage tables; scanner/store/schema.py runs these as one migration."""

KURTOSIS_SUMMARY = "mlp_weight_kurtosis"
"""Key of the per-block MLP weight kurtosis in FingerprintMeta.summaries."""


def _models(store: Store, kurtosis: Mapping[str, tuple[float, ...]]) -> list[ModelInfo]:
    rows = store.query(
        "SELECT model_id, revision, architecture, n_layers, hidden_size, intermediate_size, n_experts, "
        "declared_base_models, declared_relation, claims_from_scratch, license, created_at "
        "FROM current_models WHERE status = 'ok' ORDER BY model_id"
    )
    return [
        ModelInfo(
            model_id=r["model_id"], revision=r["revision"] or "", architecture=r["architecture"],
            n_layers=r["n_layers"], hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"],
            n_experts=r["n_experts"], declared_base_models=tuple(r["declared_base_models"] or ()),
            declared_relation=r["declared_relation"], claims_from_scratch=bool(r["claims_from_scratch"]),
            license=r["license"], created_at=r["created_at"], kurtosis=kurtosis.get(r["model_id"]),
        )
        for r in rows.iter_rows(named=True)
    ]


def _kurtosis(store: Store) -> dict[str, tuple[float, ...]]:
    """Per-block weight kurtosis from the current models' fingerprint headers (absent ones are skipped)."""
    try:
        from scanner.fingerprint import read_fingerprint_meta
    except ImportError:
        return {}
    rows = store.query(
        "SELECT f.model_id, f.path FROM fingerprints f JOIN current_models m USING (model_id, revision)"
    )
    out: dict[str, tuple[float, ...]] = {}
    for model_id, path in rows.iter_rows():
        try:
            values = read_fingerprint_meta(path).summaries.get(KURTOSIS_SUMMARY)
        except Exception:  # a missing or damaged fingerprint only costs this weak signal
            continue
        if values:
            out[model_id] = tuple(float(v) for v in values)
    return out


def _tests(store: Store, statistic: str) -> list[PairTest]:
    rows = store.query(
        "SELECT model_a, revision_a, model_b, revision_b, statistic, input_set, log10_p, n_layers, layers, reason "
        "FROM current_pair_tests WHERE statistic = ? AND log10_p IS NOT NULL "
        "QUALIFY row_number() OVER (PARTITION BY model_a, model_b ORDER BY tested_at DESC) = 1",
        [statistic],
    )
    return [
        PairTest(r["model_a"], r["model_b"], r["statistic"], float(r["log10_p"]), int(r["n_layers"] or 0),
                 tuple(json.loads(r["layers"]) if isinstance(r["layers"], str) else (r["layers"] or ())),
                 r["input_set"] or "", r["reason"] or "comparable", r["revision_a"] or "", r["revision_b"] or "")
        for r in rows.iter_rows(named=True)
    ]


def _previous(store: Store) -> tuple[dict[str, list[str]], dict[str, datetime]]:
    members = store.query("SELECT family_id, list(model_id) AS members FROM family_members GROUP BY family_id")
    first = store.query("SELECT family_id, first_built_at FROM families")
    return ({r["family_id"]: list(r["members"]) for r in members.iter_rows(named=True)},
            {r["family_id"]: r["first_built_at"] for r in first.iter_rows(named=True)})


def _frames(lineage: Lineage, first_built: Mapping[str, datetime], now: datetime) -> dict[str, pl.DataFrame]:
    family_of = {m: f.family_id for f in lineage.families for m in f.members}
    links = {(p, c): kind for f in lineage.families for p, c, kind in f.tree_edges()}
    edges = pl.DataFrame([
        {"model_a": e.test.model_a, "model_b": e.test.model_b, "statistic": e.test.statistic,
         "input_set": e.test.input_set, "log10_p": e.test.log10_p, "log10_q": e.log10_q, "dependent": e.dependent,
         "joins_family": e.joins_family,
         "parent": e.direction.parent, "child": e.direction.child, "direction_confidence": e.direction.confidence,
         "direction_reasons": list(e.direction.reasons), "blocks_matched": len(e.block_map),
         "block_map": json.dumps([{"layer_a": a, "layer_b": b} for a, b in e.block_map]),
         "family_id": family_of.get(e.test.model_a) if e.joins_family else None,
         "tree_link": links.get((e.test.model_a, e.test.model_b)) or links.get((e.test.model_b, e.test.model_a)),
         "q": lineage.q, "method": lineage.method, "built_at": now}
        for e in lineage.edges
    ], schema_overrides={"direction_reasons": pl.List(pl.String), "parent": pl.String, "child": pl.String,
                         "family_id": pl.String, "tree_link": pl.String}, infer_schema_length=None)
    families = pl.DataFrame([
        {"family_id": f.family_id, "root": f.root, "n_members": len(f.members),
         "first_built_at": first_built.get(f.family_id, now), "built_at": now, "q": lineage.q, "method": lineage.method}
        for f in lineage.families
    ])
    members = pl.DataFrame([
        {"family_id": f.family_id, "model_id": m, "revision": lineage.models[m].revision, "is_root": m == f.root,
         "parents": [p for p, k in f.parents.get(m, ()) if k == "tree"],
         "merge_parents": [p for p, k in f.parents.get(m, ()) if k == "merge"]}
        for f in lineage.families for m in f.members
    ], schema_overrides={"parents": pl.List(pl.String), "merge_parents": pl.List(pl.String)})
    discrepancies = pl.DataFrame([
        {"model_id": d.model_id, "kind": d.kind, "related_model": d.related_model, "confidence": d.confidence,
         "detail": d.detail, "evidence": json.dumps(d.evidence), "built_at": now}
        for d in lineage.discrepancies
    ], schema={"model_id": pl.String, "kind": pl.String, "related_model": pl.String, "confidence": pl.Float64,
               "detail": pl.String, "evidence": pl.String, "built_at": pl.Datetime("us", "UTC")})
    return {"lineage_edges": edges, "families": families, "family_members": members, "discrepancies": discrepancies}


def _compute(store: Store, q: float, method: Method, statistic: str) -> tuple[Lineage, dict[str, datetime]]:
    previous, first_built = _previous(store)
    lineage = compute_lineage(_models(store, _kurtosis(store)), _tests(store, statistic), q=q, method=method,
                              statistic=statistic, previous_families=previous)
    return lineage, first_built


def read_lineage(store: Store, *, statistic: str = "match") -> Lineage:
    """The lineage as last rebuilt (same q and method, same family ids), recomputed in memory without writing:
    works on a read-only store."""
    last = store.query("SELECT q, method FROM families ORDER BY built_at DESC LIMIT 1")
    q, method = (last["q"][0], last["method"][0]) if last.height else (0.05, "bh")
    return _compute(store, q, method, statistic)[0]


def rebuild_lineage(store: Store, *, q: float = 0.05, method: Method = "bh", statistic: str = "match") -> Lineage:
    """Recompute the whole lineage from current_models/current_pair_tests and replace the lineage tables."""
    lineage, first_built = _compute(store, q, method, statistic)
    frames = _frames(lineage, first_built, datetime.now(timezone.utc))
    con = store.connection
    con.execute("BEGIN TRANSACTION")
    try:
        for table, frame in frames.items():
            con.execute(f"DELETE FROM {table}")
            if frame.height:
                con.register("_lineage_frame", frame.to_arrow())
                columns = ", ".join(frame.columns)
                con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _lineage_frame")
                con.unregister("_lineage_frame")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return lineage
