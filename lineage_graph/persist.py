"""The lineage and the store: read current models and pair tests, compute the lineage, write it back in one
transaction (readers see the old lineage or the new one, never half of each). The SQL is the store's
(scanner.store.lineage_tables); the computing is lineage_graph.lineage's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, NamedTuple

import polars as pl

from lineage_graph.block_maps import wanted
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE, ModelInfo, PairTest
from lineage_graph.lineage import Lineage, compute_lineage
from lineage_graph.multiple_testing import Method
from scanner.declared.merge_config import MergeDeclaration
from scanner.pairs.block_map import BlockMap, decoded
from scanner.store import lineage_tables

if TYPE_CHECKING:
    from scanner.store import Store

RANK_SUMMARY = "activation_effective_rank"
"""Key of the per-block activation effective rank in FingerprintMeta.summaries (direction evidence)."""
SCALE_SUMMARY = "gate_rms_quantiles"
"""Key of the per-block quantiles of the units' gate activation RMS (the activation scale's source)."""


class _HeaderEvidence(NamedTuple):
    """What a model's fingerprint header gives the lineage: the weak direction signals and the MLP value sample."""

    rank: tuple[float, ...] | None = None
    scale: tuple[float, ...] | None = None
    mlp_values: bytes = b""
    mlp_layout: str = ""


def _models(store: Store, headers: Mapping[str, _HeaderEvidence]) -> list[ModelInfo]:
    rows = lineage_tables.ok_models(store)
    return [
        ModelInfo(
            model_id=r["model_id"], revision=r["revision"] or "", architecture=r["architecture"],
            n_layers=r["n_layers"], hidden_size=r["hidden_size"], intermediate_size=r["intermediate_size"],
            n_experts=r["n_experts"], declared_base_models=tuple(r["declared_base_models"] or ()),
            declared_relation=r["declared_relation"], claims_from_scratch=bool(r["claims_from_scratch"]),
            license=r["license"], created_at=r["created_at"],
            activation_rank=header.rank, activation_scale=header.scale,
            declared_merge=MergeDeclaration.from_json(r["merge_config"]),
            mlp_values=header.mlp_values, mlp_layout=header.mlp_layout,
        )
        for r in rows.iter_rows(named=True) for header in (headers.get(r["model_id"], _HeaderEvidence()),)
    ]


def _header_evidence(store: Store) -> dict[str, _HeaderEvidence]:
    """Per-block activation effective rank and activation scale, and the MLP value sample, from the current models'
    fingerprint headers (what a fingerprint written before one was recorded lacks, and missing or damaged
    fingerprints, are skipped: that model's pairs get no such evidence)."""
    try:
        from scanner.fingerprints.store import read_fingerprint_meta_at
    except ImportError:
        return {}
    out: dict[str, _HeaderEvidence] = {}
    for model_id, path in lineage_tables.current_fingerprint_files(store):
        try:
            meta = read_fingerprint_meta_at(path)
        except Exception:  # a missing or damaged fingerprint only costs this evidence
            continue
        try:
            values = meta.value_sample().tobytes()
        except ValueError:  # a sample that is no base64 of float32 values costs the value evidence alone
            values = b""
        summaries = meta.summaries
        rank = tuple(float(v) for v in summaries[RANK_SUMMARY]) if summaries.get(RANK_SUMMARY) else None
        out[model_id] = _HeaderEvidence(rank, activation_scale(summaries) if rank else None, values,
                                        meta.mlp_layout if values else "")
    return out


def activation_scale(summaries: Mapping) -> tuple[float, ...] | None:
    """Per block, the median over units of each unit's gate activation RMS (``gate_rms_quantiles``), when recorded."""
    quantiles, per_block = summaries.get("activation_rms_quantiles"), summaries.get(SCALE_SUMMARY)
    if not quantiles or not per_block or 0.5 not in quantiles:
        return None
    median = list(quantiles).index(0.5)
    return tuple(float(block[median]) for block in per_block)


def _tests(store: Store, statistic: str) -> list[PairTest]:
    rows = lineage_tables.latest_pair_tests(store, statistic)
    return [
        PairTest(r["model_a"], r["model_b"], r["statistic"], float(r["log10_p"]), int(r["n_layers"] or 0),
                 tuple(json.loads(r["layers"]) if isinstance(r["layers"], str) else (r["layers"] or ())),
                 r["input_set"] or "", r["reason"] or "comparable", r["revision_a"] or "", r["revision_b"] or "",
                 r["closeness"])
        for r in rows.iter_rows(named=True)
    ]


def _frames(lineage: Lineage, first_built: Mapping[str, datetime], now: datetime) -> dict[str, pl.DataFrame]:
    family_of = {m: f.family_id for f in lineage.families for m in f.members}
    links = {(p, c): kind for f in lineage.families for p, c, kind in f.tree_edges()}
    edges = pl.DataFrame([
        {"model_a": e.test.model_a, "model_b": e.test.model_b, "statistic": e.test.statistic,
         "input_set": e.test.input_set, "log10_p": e.test.log10_p, "log10_q": e.log10_q, "dependent": e.dependent,
         "joins_family": e.joins_family,
         "parent": e.direction.parent, "child": e.direction.child, "direction_confidence": e.direction.confidence,
         "direction_decided": e.direction.claimed, "min_direction_confidence": lineage.min_direction_confidence,
         "direction_reasons": list(e.direction.reasons), "blocks_matched": len(e.block_map),
         "block_map": json.dumps([{"layer_a": a, "layer_b": b} for a, b in e.block_map]),
         "family_id": family_of.get(e.test.model_a) if e.joins_family else None,
         "tree_link": links.get((e.test.model_a, e.test.model_b)) or links.get((e.test.model_b, e.test.model_a)),
         "kinship": e.kinship, "q": lineage.q, "method": lineage.method, "built_at": now}
        for e in lineage.edges
    ], schema_overrides={"direction_reasons": pl.List(pl.String), "parent": pl.String, "child": pl.String,
                         "family_id": pl.String, "tree_link": pl.String, "kinship": pl.String},
        infer_schema_length=None)
    families = pl.DataFrame([
        {"family_id": f.family_id, "root": f.root, "n_members": len(f.members),
         "first_built_at": first_built.get(f.family_id, now), "built_at": now, "q": lineage.q, "method": lineage.method,
         "min_direction_confidence": lineage.min_direction_confidence, "root_decided": f.root_decided}
        for f in lineage.families
    ])
    members = pl.DataFrame([
        {"family_id": f.family_id, "model_id": m, "revision": lineage.models[m].revision,
         "is_root": m == f.root and f.root_decided,
         "parents": [p for p, k in f.parents.get(m, ()) if k in ("tree", "copy")],
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


def _compute(store: Store, q: float, method: Method, statistic: str, min_direction_confidence: float
             ) -> tuple[Lineage, dict[str, datetime]]:
    previous, first_built = lineage_tables.stored_families(store)
    models = _models(store, _header_evidence(store))
    tests = _tests(store, statistic)
    lineage = compute_lineage(models, tests, q=q, method=method, statistic=statistic, previous_families=previous,
                              min_direction_confidence=min_direction_confidence,
                              block_maps=_block_maps(store, models, tests))
    return lineage, first_built


def _block_maps(store: Store, models: list[ModelInfo], tests: list[PairTest]) -> dict[tuple[str, str], BlockMap]:
    """The any-order block maps of the depth-changed related pairs the lineage reads (lineage_graph.block_maps.wanted),
    as the scan's pair workers made and stored them with the pairs' tests (scanner.pairs.block_map). A pair without one
    (tested by a hubtrace that made no maps with its tests, or whose map failed) is read as before: its depth vote
    alone. Nothing is matched here."""
    kept = lineage_tables.stored_block_maps(store)
    test_of = {(t.model_a, t.model_b): t for t in tests}
    out: dict[tuple[str, str], BlockMap] = {}
    for a, b in wanted({m.model_id: m for m in models}, tests):
        t = test_of[(a, b)]
        text = kept.get((a, t.revision_a, b, t.revision_b, t.input_set))
        if text is not None:
            out[(a, b)] = decoded(text)
    return out


def read_lineage(store: Store, *, statistic: str = "match") -> Lineage:
    """The lineage as last rebuilt (same q, method and direction level, same family ids), recomputed in memory
    without writing: works on a read-only store."""
    q, method = lineage_tables.last_fdr_setting(store) or (0.05, "bh")
    level = lineage_tables.last_direction_level(store)
    return _compute(store, q, method, statistic, DEFAULT_MIN_DIRECTION_CONFIDENCE if level is None else level)[0]


def rebuild_lineage(store: Store, *, q: float = 0.05, method: Method = "bh", statistic: str = "match",
                    min_direction_confidence: float = DEFAULT_MIN_DIRECTION_CONFIDENCE) -> Lineage:
    """Recompute the whole lineage from current_models/current_pair_tests and replace the lineage tables."""
    lineage, first_built = _compute(store, q, method, statistic, min_direction_confidence)
    frames = _frames(lineage, first_built, datetime.now(UTC))
    lineage_tables.replace_lineage_tables(store, frames)
    return lineage
