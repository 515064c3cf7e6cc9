"""The questions investigators ask of a scan database, as documented SQL (the ``*_SQL`` constants, runnable in
the DuckDB CLI with the ``$name`` parameters filled in) and as functions returning polars frames.

Two kinds of answers: from the raw pair tests (a p-value threshold, no direction: symmetric dependence) and from
the lineage tables that ``rebuild_lineage`` writes (FDR-controlled, oriented parent -> child, family trees).
"""

from __future__ import annotations

import math
from datetime import datetime

import polars as pl

from scanner.store.read_only_sql import check_read_only
from scanner.store.store import Store

DEFAULT_LOG10_P = -8.0
"""log10 p at or below which a raw pair test counts as dependence: about a 5% Bonferroni bound over 2 million
pairs (2,000 models). Dependent zoo pairs reach -52 or lower; the lineage tables use FDR instead."""

DEPENDENT_ON_SQL = """
SELECT CASE WHEN t.model_a = $model THEN t.model_b ELSE t.model_a END AS model_id,
       CASE WHEN t.model_a = $model THEN t.revision_b ELSE t.revision_a END AS revision,
       t.log10_p, t.statistic, t.input_set, t.reason, t.tested_at,
       list_contains(m.declared_base_models, $model) AS declares_it_as_base,
       m.claims_from_scratch, m.created_at
FROM current_pair_tests t
JOIN current_models m
  ON m.model_id = CASE WHEN t.model_a = $model THEN t.model_b ELSE t.model_a END
 AND m.revision = CASE WHEN t.model_a = $model THEN t.revision_b ELSE t.revision_a END
WHERE $model IN (t.model_a, t.model_b) AND t.model_a <> t.model_b
  AND t.statistic = $statistic AND t.log10_p <= $threshold
ORDER BY t.log10_p, model_id
"""
"""Models whose weights depend on $model by a current pair test at log10 p <= $threshold (either direction)."""

DESCENDANTS_SQL = """
WITH RECURSIVE tree(model_id, parent, depth, link, log10_p, direction_confidence, path) AS (
    SELECT child, parent, 1, tree_link, log10_p, direction_confidence, [parent, child]
    FROM lineage_edges WHERE dependent AND tree_link IS NOT NULL AND parent = $model
  UNION ALL
    SELECT e.child, e.parent, t.depth + 1, e.tree_link, e.log10_p, e.direction_confidence, list_append(t.path, e.child)
    FROM lineage_edges e JOIN tree t ON e.parent = t.model_id
    WHERE e.dependent AND e.tree_link IS NOT NULL AND NOT list_contains(t.path, e.child)
)
SELECT model_id, arg_min(parent, depth) AS parent, min(depth) AS depth, arg_min(link, depth) AS link,
       arg_min(log10_p, depth) AS log10_p, arg_min(direction_confidence, depth) AS direction_confidence
FROM tree GROUP BY model_id ORDER BY depth, model_id
"""
"""Every model below $model in its family tree (children, grandchildren, ...; merges included), from the lineage
tables: depth 1 are its children, ``parent`` is the model each hangs from."""

CLAIMS_NO_PARENT_SQL = """
SELECT m.model_id, m.revision, m.claims_from_scratch,
       CASE WHEN t.model_a = m.model_id THEN t.model_b ELSE t.model_a END AS depends_on,
       o.revision AS depends_on_revision, t.log10_p, t.statistic,
       m.created_at, o.created_at AS depends_on_created_at
FROM current_models m
JOIN current_pair_tests t ON m.model_id IN (t.model_a, t.model_b) AND t.model_a <> t.model_b
JOIN current_models o
  ON o.model_id = CASE WHEN t.model_a = m.model_id THEN t.model_b ELSE t.model_a END
 AND o.revision = CASE WHEN t.model_a = m.model_id THEN t.revision_b ELSE t.revision_a END
WHERE (m.claims_from_scratch OR coalesce(len(m.declared_base_models), 0) = 0)
  AND m.revision = CASE WHEN t.model_a = m.model_id THEN t.revision_a ELSE t.revision_b END
  AND t.statistic = $statistic AND t.log10_p <= $threshold
  AND NOT coalesce(list_contains(o.declared_base_models, m.model_id), false)
  AND NOT coalesce(o.created_at > m.created_at, false)
ORDER BY m.model_id, t.log10_p
"""
"""Models that claim from-scratch training or declare no base, yet depend (log10 p <= $threshold) on another
model that is not itself declared as derived from them and is not known to be newer (without dates on both, the
pair is listed: the original of an undeclared pair shows up too; the lineage discrepancies orient it)."""

UNDECLARED_DERIVATIVES_SQL = """
SELECT model_id, kind, related_model AS depends_on, confidence, detail, built_at
FROM discrepancies WHERE kind IN ('false_from_scratch', 'undeclared_base')
ORDER BY confidence DESC, model_id
"""
"""The same question answered by the lineage tables: oriented, FDR-controlled, family roots never accused."""

_CHANGES_BODY = """
earlier AS (SELECT run_id FROM scan_runs
            WHERE started_at < (SELECT min(started_at) FROM scan_runs WHERE run_id IN (SELECT run_id FROM runs))),
new_rows AS (
    SELECT m.*, (SELECT arg_max(p.revision, p.last_seen_run) FROM models p
                 WHERE p.model_id = m.model_id AND p.revision <> m.revision
                   AND p.first_seen_run IN (SELECT run_id FROM earlier)) AS previous_revision
    FROM models m WHERE m.first_seen_run IN (SELECT run_id FROM runs)
)
SELECT CASE WHEN previous_revision IS NULL THEN 'new_model' ELSE 'new_revision' END AS kind,
       model_id, revision, NULL::VARCHAR AS related_model, NULL::DOUBLE AS log10_p,
       CASE WHEN previous_revision IS NULL THEN 'status ' || status
            ELSE 'was ' || previous_revision || ', status ' || status END AS detail,
       first_seen_run AS run_id
FROM new_rows
UNION ALL
SELECT 'new_dependence', model_a, revision_a, model_b, log10_p,
       statistic || ' on ' || input_set || ' (' || reason || ')' || CASE WHEN superseded THEN ', since superseded'
       ELSE '' END, run_id
FROM pair_tests WHERE run_id IN (SELECT run_id FROM runs) AND log10_p <= $threshold
UNION ALL
SELECT CASE WHEN EXISTS (SELECT 1 FROM scan_errors p WHERE p.model_id = e.model_id AND p.stage = e.stage
                         AND p.revision IS NOT DISTINCT FROM e.revision
                         AND p.run_id IN (SELECT run_id FROM earlier))
            THEN 'repeated_error' ELSE 'new_error' END,
       model_id, revision, NULL, NULL, stage || ': ' || error_type || ': ' || reason, run_id
FROM scan_errors e WHERE run_id IN (SELECT run_id FROM runs)
ORDER BY run_id, kind, model_id, related_model
"""

CHANGES_SINCE_SQL = "WITH runs AS (SELECT run_id FROM scan_runs WHERE started_at >= $since),\n" + _CHANGES_BODY
"""What the runs started at or after $since changed: new models, new revisions of known models (with the
revision they replaced), dependent pairs they found (log10 p <= $threshold; later superseded ones say so) and
errors, new or already seen by an earlier run."""

RUN_CHANGES_SQL = "WITH runs AS (SELECT run_id FROM scan_runs WHERE run_id = $run_id),\n" + _CHANGES_BODY
"""The same for one run."""

RUN_ERRORS_SQL = """
SELECT e.model_id, e.revision, e.stage, e.error_type, e.reason, e.location, e."at",
       NOT EXISTS (SELECT 1 FROM scan_errors p JOIN scan_runs r USING (run_id)
                   WHERE p.model_id = e.model_id AND p.stage = e.stage
                     AND p.revision IS NOT DISTINCT FROM e.revision
                     AND r.started_at < (SELECT started_at FROM scan_runs WHERE run_id = $run_id)) AS new
FROM scan_errors e WHERE e.run_id = $run_id
ORDER BY e.stage, e.model_id
"""
"""Errors of run $run_id; ``new`` is false when an earlier run failed on the same model, revision and stage."""

RUNS_SQL = """
SELECT r.run_id, r.status, r.started_at, r.finished_at, r.hubtrace_version,
       (SELECT count(*) FROM models m WHERE m.first_seen_run = r.run_id) AS new_model_rows,
       (SELECT count(*) FROM pair_tests t WHERE t.run_id = r.run_id) AS pair_tests,
       (SELECT count(*) FROM scan_errors e WHERE e.run_id = r.run_id) AS errors
FROM scan_runs r ORDER BY r.started_at DESC
"""
"""Every scan run, newest first, with how many model revisions it first saw, tests it stored, errors it hit."""


def dependent_on(store: Store, model_id: str, *, log10_p_below: float = DEFAULT_LOG10_P,
                 statistic: str = "match") -> pl.DataFrame:
    """Models whose current pair test with ``model_id`` is at or below the threshold (no direction)."""
    return store.query(DEPENDENT_ON_SQL, {"model": model_id, "statistic": statistic, "threshold": log10_p_below})


def derives_from(store: Store, model_id: str) -> pl.DataFrame:
    """Every descendant of ``model_id`` in the family trees of the last lineage rebuild (empty before one)."""
    return store.query(DESCENDANTS_SQL, {"model": model_id})


def claims_no_parent_but_depends(store: Store, *, log10_p_below: float = DEFAULT_LOG10_P,
                                 statistic: str = "match") -> pl.DataFrame:
    """Models with no declared base (or a from-scratch claim) that depend on another model, from pair tests."""
    return store.query(CLAIMS_NO_PARENT_SQL, {"statistic": statistic, "threshold": log10_p_below})


def undeclared_derivatives(store: Store) -> pl.DataFrame:
    """The lineage rebuild's verdicts on the same question (oriented, FDR-controlled)."""
    return store.query(UNDECLARED_DERIVATIVES_SQL)


def latest_run_id(store: Store) -> str | None:
    """The most recently started run, or None for an empty database."""
    runs = store.query("SELECT run_id FROM scan_runs ORDER BY started_at DESC, run_id DESC LIMIT 1")
    return runs["run_id"][0] if runs.height else None


def changes_since(store: Store, since: datetime, *, log10_p_below: float = DEFAULT_LOG10_P) -> pl.DataFrame:
    """What every run started at or after ``since`` (timezone-aware) changed; see ``CHANGES_SINCE_SQL``."""
    return store.query(CHANGES_SINCE_SQL, {"since": since, "threshold": log10_p_below})


def run_changes(store: Store, run_id: str | None = None, *, log10_p_below: float = DEFAULT_LOG10_P
                ) -> pl.DataFrame:
    """What one run (default: the latest) changed; see ``RUN_CHANGES_SQL``."""
    return store.query(RUN_CHANGES_SQL, {"run_id": run_id or latest_run_id(store), "threshold": log10_p_below})


def run_errors(store: Store, run_id: str | None = None) -> pl.DataFrame:
    """The errors of one run (default: the latest), each marked new or seen in an earlier run."""
    return store.query(RUN_ERRORS_SQL, {"run_id": run_id or latest_run_id(store)})


def runs(store: Store) -> pl.DataFrame:
    """Every run, newest first, with its counts."""
    return store.query(RUNS_SQL)


def current_model_rows(store: Store, model_ids: list[str]) -> dict[str, dict]:
    """Every column of the current row of each of these models that the store knows, by model id."""
    placeholders = ", ".join("?" for _ in model_ids) or "NULL"
    frame = store.query(f"SELECT * FROM current_models WHERE model_id IN ({placeholders})", list(model_ids))
    return {row["model_id"]: row for row in frame.iter_rows(named=True)}


def revision_history(store: Store, model_ids: list[str]) -> pl.DataFrame:
    """Every stored revision of these models (superseded ones included) with the runs that saw it."""
    placeholders = ", ".join("?" for _ in model_ids) or "NULL"
    return store.query(
        "SELECT model_id, revision, status, first_seen_run, last_seen_run FROM models "
        f"WHERE model_id IN ({placeholders}) ORDER BY model_id, first_seen_run", list(model_ids))


def pair_tests_between(store: Store, model_a: str, model_b: str) -> pl.DataFrame:
    """The current tests of one pair (``model_a < model_b``), one row per statistic and input set."""
    return store.query(
        "SELECT statistic, input_set, log10_p, value, closeness, notes, tested_at FROM current_pair_tests "
        "WHERE model_a = ? AND model_b = ? ORDER BY statistic", [model_a, model_b])


def read_only_query(store: Store, sql: str, *, as_text: bool = False) -> pl.DataFrame:
    """Run ``sql`` if it is exactly one statement that only reads (`read_only_sql.check_read_only`: DuckDB's
    parser, EXPLAIN ANALYZE and everything that writes or executes refused unrun). Columns of types polars cannot
    hold come as text (`Store.query_as_text`); ``as_text`` makes every column text (a date past polars' range)."""
    check_read_only(store.connection, sql)
    return store.query_as_text(sql, every_column=as_text)


CURRENT_FINGERPRINTS_SQL = """
SELECT m.model_id, m.revision, f.input_set, f.path
FROM current_models m JOIN fingerprints f USING (model_id, revision)
WHERE m.status = 'ok' AND m.model_id = $model
ORDER BY f.created_at DESC
"""
"""The fingerprint files of $model's current revision (one per input set)."""


def current_fingerprints(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(CURRENT_FINGERPRINTS_SQL, {"model": model_id})


def models_at(store: Store, locations: list[str]) -> set[str]:
    """The ids of the current models read from these locations (a local folder or file, as the scan recorded it)."""
    if not locations:
        return set()
    placeholders = ", ".join("?" for _ in locations)
    frame = store.query(f"SELECT DISTINCT model_id FROM current_models WHERE location IN ({placeholders})", locations)
    return set(frame["model_id"].to_list())


def empirical_null(store: Store, statistic: str, match_statistic: str = "match") -> list[tuple[str, str, float]]:
    """(model_a, model_b, value) of every current pair whose ``statistic`` has a value and whose phi_MATCH p-value is
    above NULL_MATCH_P: the hub's own independent pairs, the empirical null of a weight fingerprint
    (scanner.stats.weight_statistics)."""
    from scanner.stats.weight_statistics import NULL_MATCH_P

    return [(r[0], r[2], r[5]) for r in store.weight_statistic_rows(statistic, match_statistic)
            if r[6] is not None and r[6] > math.log10(NULL_MATCH_P) and r[5] is not None and math.isfinite(r[5])]
