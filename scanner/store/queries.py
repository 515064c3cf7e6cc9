"""The questions investigators ask of a scan database, as documented SQL (the ``*_SQL`` constants, runnable in
the DuckDB CLI with the ``$name`` parameters filled in) and as functions returning polars frames.

Two kinds of answers: from the raw pair tests (a p-value threshold, no direction: symmetric dependence) and from
the lineage tables that ``rebuild_lineage`` writes (FDR-controlled, oriented parent -> child, family trees).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl

from scanner.store.read_only_sql import check_read_only
from scanner.store.store import AnswerStream, Store

if TYPE_CHECKING:
    from scanner.stats.weight_statistics import NullPair

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
WITH RECURSIVE tree(model_id, parent, depth, link, log10_p, direction_confidence, decided, path) AS (
    SELECT child, parent, 1, tree_link, log10_p, direction_confidence, coalesce(direction_decided, true),
           [parent, child]
    FROM lineage_edges WHERE dependent AND tree_link IS NOT NULL AND parent = $model
  UNION ALL
    SELECT e.child, e.parent, t.depth + 1, e.tree_link, e.log10_p, e.direction_confidence,
           t.decided AND coalesce(e.direction_decided, true), list_append(t.path, e.child)
    FROM lineage_edges e JOIN tree t ON e.parent = t.model_id
    WHERE e.dependent AND e.tree_link IS NOT NULL AND NOT list_contains(t.path, e.child)
)
SELECT model_id, arg_max(parent, (decided, -depth)) AS parent, min(depth) AS depth,
       arg_max(link, (decided, -depth)) AS link, arg_max(log10_p, (decided, -depth)) AS log10_p,
       arg_max(direction_confidence, (decided, -depth)) AS direction_confidence,
       bool_or(decided) AS direction_decided,
       CASE WHEN bool_or(decided AND link NOT IN ('alternative', 'copy')) THEN 'derives from it'
            WHEN bool_or(decided AND link = 'copy') THEN 'copy: the same function'
            WHEN bool_or(decided) THEN 'perhaps derives from it (the tree cannot tell between two parents)'
            ELSE 'related; a link between them is undecided, so it may not derive from it' END AS relation
FROM tree GROUP BY model_id ORDER BY NOT bool_or(decided), depth, model_id
"""
"""Every model below $model in its family tree (children, grandchildren, ...; merges included), from the lineage
tables: depth 1 are its children, ``parent`` is the model each hangs from. A model reached only through a link whose
direction is undecided (``direction_decided`` false) or a copy or "cannot tell" link is listed after the others,
and ``relation`` says so: the tree leans that way, it does not claim it."""

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


def read_only_query(store: Store, sql: str, *, as_text: bool = False, limit: int | None = None) -> pl.DataFrame:
    """Run ``sql`` if it is exactly one statement that only reads (`read_only_sql.check_read_only`: DuckDB's
    parser, EXPLAIN ANALYZE and everything that writes or executes refused unrun, and so is every function that
    acts). Columns of types polars cannot hold come as text (`Store.query_as_text`); ``as_text`` makes every column
    text (a date past polars' range); ``limit``: at most that many rows."""
    check_read_only(store.connection, sql, local_files=store.allow_local_files)
    return store.query_as_text(sql, every_column=as_text, limit=limit)


def read_only_stream(store: Store, sql: str, *, as_text: bool = False, limit: int | None = None,
                     batch_rows: int = 10_000) -> AnswerStream:
    """`read_only_query`'s answer a batch of rows at a time (`Store.stream_as_text`), checked the same way."""
    check_read_only(store.connection, sql, local_files=store.allow_local_files)
    return store.stream_as_text(sql, every_column=as_text, limit=limit, batch_rows=batch_rows)


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


MODEL_SHAPES_SQL = """
SELECT model_id, revision, model_type, n_layers, hidden_size FROM current_models
WHERE model_type IS NOT NULL AND n_layers IS NOT NULL AND hidden_size IS NOT NULL
"""
"""Each current model's type, depth and width: the kind of model an empirical null is drawn from."""


def model_shapes(store: Store) -> dict[tuple[str, str], tuple[str, int, int]]:
    """(model, revision) -> (model type, depth, width) of every current model that has them."""
    return {(r[0], r[1]): (r[2], int(r[3]), int(r[4])) for r in store.query(MODEL_SHAPES_SQL).iter_rows()}


def empirical_null(store: Store, statistic: str, match_statistic: str = "match") -> list[NullPair]:
    """(model_a, model_b, value, kind) of every current pair whose ``statistic`` has a value and whose phi_MATCH
    p-value is above NULL_MATCH_P: the hub's own independent pairs, the empirical null of a weight fingerprint
    (scanner.stats.weight_statistics), each with the kind of its two models (type, depth, width) that a tested pair
    must share to be compared with it."""
    from scanner.stats.weight_statistics import NULL_MATCH_P, pair_kind

    shapes = model_shapes(store)
    return [(r[0], r[2], r[5], pair_kind(shapes[(r[0], r[1])], shapes[(r[2], r[3])]))
            for r in store.weight_statistic_rows(statistic, match_statistic)
            if r[6] is not None and r[6] > math.log10(NULL_MATCH_P) and r[5] is not None and math.isfinite(r[5])
            and (r[0], r[1]) in shapes and (r[2], r[3]) in shapes]


# -- the local web app (`hubtrace serve`, jobs/web): one read per page part, never the whole hub ------------------

OVERVIEW_SQL = """
SELECT (SELECT count(*) FROM current_models) AS models,
       (SELECT count(*) FROM current_pair_tests) AS pair_tests,
       (SELECT count(*) FROM lineage_edges WHERE dependent) AS dependent_pairs,
       (SELECT count(*) FROM families) AS families,
       (SELECT count(*) FROM families WHERE n_members > 1) AS families_with_relatives,
       (SELECT count(*) FROM discrepancies WHERE kind <> 'cannot_tell') AS discrepancies,
       (SELECT max(built_at) FROM families) AS lineage_built_at,
       (SELECT arg_max(q, built_at) FROM families) AS q,
       (SELECT arg_max(method, built_at) FROM families) AS method,
       (SELECT max(started_at) FROM scan_runs) AS last_scan_at
"""
"""What the database holds, in one row: counts, when the lineage was last rebuilt (NULL before the first
``hubtrace lineage``) with its FDR q and method, and when the last scan started."""

FAMILIES_PAGE_SQL = """
WITH flagged AS (SELECT m.family_id, count(*) AS discrepancies
                 FROM discrepancies d JOIN family_members m USING (model_id)
                 WHERE d.kind <> 'cannot_tell' GROUP BY m.family_id)
SELECT f.family_id, f.root, f.n_members, coalesce(x.discrepancies, 0) AS discrepancies, f.built_at
FROM families f LEFT JOIN flagged x USING (family_id)
ORDER BY f.n_members DESC, f.family_id
LIMIT $limit OFFSET $offset
"""
"""One page of the families, largest first, with how many discrepancies their members carry."""

DISCREPANCIES_PAGE_SQL = """
SELECT model_id, kind, related_model, confidence, detail, count(*) OVER () AS total
FROM discrepancies WHERE kind <> 'cannot_tell' ORDER BY confidence DESC, model_id, kind
LIMIT $limit OFFSET $offset
"""
"""One page of the discrepancies (a card that disagrees with the weights), most confident first; ``total`` on each
row counts them all. "cannot_tell" rows (a relation whose order is undecided, no card accused) are no discrepancy:
the model pages show them."""

SEARCH_MODELS_SQL = """
SELECT m.model_id, m.status, m.architecture, m.license, f.family_id, count(*) OVER () AS total
FROM current_models m LEFT JOIN family_members f USING (model_id)
WHERE contains(lower(m.model_id), lower($text))
ORDER BY lower(m.model_id) <> lower($text), NOT starts_with(lower(m.model_id), lower($text)),
         length(m.model_id), m.model_id
LIMIT $limit OFFSET $offset
"""
"""Current models whose id contains $text anywhere (case-insensitive; no wildcard characters: ``%`` and ``_`` are
text): the exact id first, then ids starting with it, then shorter ids; ``total`` counts every match."""

MODEL_FINGERPRINTS_SQL = """
SELECT f.input_set, f.n_tokens, f.file_sha256, f.path, f.hubtrace_version, f.run_id, f.created_at
FROM fingerprints f JOIN current_models m USING (model_id, revision)
WHERE m.model_id = $model ORDER BY f.created_at DESC
"""
"""The stored facts of $model's fingerprints at its current revision, one row per input set."""

MODEL_FAMILY_SQL = """
SELECT m.family_id, f.root, f.n_members, m.is_root, m.parents, m.merge_parents, e.tree_link,
       coalesce(e.direction_decided, true) AS direction_decided
FROM family_members m JOIN families f USING (family_id)
LEFT JOIN lineage_edges e ON len(m.parents) > 0
     AND e.model_a = least(m.model_id, m.parents[1]) AND e.model_b = greatest(m.model_id, m.parents[1])
WHERE m.model_id = $model
"""
"""$model's family in the last lineage rebuild: its root and size, $model's parents in the family tree, and how it
is joined to its first parent (a copy, a claimed direction or an undecided one), as the family page words it."""

MODEL_RELATIVES_SQL = """
WITH tests AS (
    SELECT model_a, model_b, statistic, input_set, closeness FROM current_pair_tests
    WHERE $model IN (model_a, model_b)
    QUALIFY row_number() OVER (PARTITION BY model_a, model_b, statistic, input_set ORDER BY tested_at DESC) = 1)
SELECT CASE WHEN e.model_a = $model THEN e.model_b ELSE e.model_a END AS model_id,
       e.dependent, e.log10_p, e.log10_q, e.statistic, e.parent, e.child, e.direction_confidence,
       coalesce(e.direction_decided, true) AS direction_decided, e.direction_reasons, e.tree_link, e.kinship,
       e.blocks_matched, t.closeness
FROM lineage_edges e LEFT JOIN tests t USING (model_a, model_b, statistic, input_set)
WHERE $model IN (e.model_a, e.model_b)
ORDER BY NOT e.dependent, e.log10_p, model_id
"""
"""Every pair of the last lineage rebuild that holds $model: the other model, its p-value and FDR-adjusted one,
whether it counts as dependent, the direction (parent, child, confidence, whether it reaches the level set to be
claimed, reasons), the tree link it is, how the two stand in the family tree (kinship: parent, ancestor, sibling,
cousin...; NULL before it was stored) and the pair test's closeness; dependent pairs first, strongest first."""

MODEL_PAIR_TESTS_SQL = """
SELECT CASE WHEN model_a = $model THEN model_b ELSE model_a END AS model_id,
       statistic, input_set, log10_p, value, closeness, reason, tested_at
FROM current_pair_tests WHERE $model IN (model_a, model_b) AND model_a <> model_b
ORDER BY log10_p NULLS LAST, model_id, statistic
"""
"""Every current pair test that holds $model, every statistic, strongest first (what there is before a lineage
rebuild)."""

MODEL_DISCREPANCIES_SQL = """
SELECT model_id, kind, related_model, confidence, detail FROM discrepancies
WHERE $model IN (model_id, related_model) ORDER BY confidence DESC, model_id, kind
"""
"""Discrepancies about $model's card, and those of other cards that name $model."""

MODEL_ERRORS_SQL = """
SELECT run_id, revision, stage, error_type, reason, location, "at" FROM scan_errors
WHERE model_id = $model ORDER BY "at" DESC
"""
"""Every scan error recorded for $model, newest first."""

FAMILY_SQL = """
SELECT family_id, root, n_members, first_built_at, built_at, q, method, min_direction_confidence,
       coalesce(root_decided, true) AS root_decided
FROM families WHERE family_id = $family
"""
"""One family's row, as the last lineage rebuild wrote it."""

FAMILY_MEMBER_IDS_SQL = "SELECT model_id FROM family_members WHERE family_id = $family ORDER BY model_id"
"""The ids of $family's members, without FAMILY_MEMBERS_SQL's evidence and card joins."""

FAMILY_MEMBERS_SQL = """
WITH members AS (SELECT * FROM family_members WHERE family_id = $family),
flagged AS (SELECT model_id, count(*) AS discrepancies FROM discrepancies
            WHERE model_id IN (SELECT model_id FROM members) AND kind <> 'cannot_tell' GROUP BY model_id)
SELECT m.model_id, m.is_root, m.parents, m.merge_parents, e.log10_p, e.direction_confidence,
       coalesce(e.direction_decided, true) AS direction_decided, e.tree_link,
       coalesce(x.discrepancies, 0) AS discrepancies, c.license, c.architecture, c.created_at
FROM members m
LEFT JOIN lineage_edges e ON len(m.parents) > 0
     AND e.model_a = least(m.model_id, m.parents[1]) AND e.model_b = greatest(m.model_id, m.parents[1])
LEFT JOIN flagged x USING (model_id)
LEFT JOIN current_models c USING (model_id)
ORDER BY m.model_id
"""
"""Every member of $family with its tree parents and merge parents, the evidence of the link to its first parent
(p-value, direction confidence and whether it is claimed, link kind), its number of discrepancies and a few card
fields."""

LINEAGE_EDGES_AMONG_SQL = """
SELECT model_a, model_b, statistic, input_set, log10_p, log10_q, dependent, joins_family, parent, child,
       direction_confidence, coalesce(direction_decided, true) AS direction_decided, direction_reasons, block_map,
       tree_link, kinship
FROM lineage_edges
WHERE dependent AND model_a IN (SELECT unnest($models)) AND model_b IN (SELECT unnest($models))
ORDER BY model_a, model_b
"""
"""The dependent pairs of the last lineage rebuild whose two models are both in $models (a list)."""

PAIR_EVIDENCE_SQL = """
WITH test AS (
    SELECT revision_a, revision_b, statistic, input_set, n_layers, layers, reason, closeness
    FROM current_pair_tests WHERE model_a = $a AND model_b = $b
    QUALIFY row_number() OVER (PARTITION BY statistic, input_set ORDER BY tested_at DESC) = 1)
SELECT e.model_a, e.model_b, e.statistic, e.input_set, e.log10_p, e.log10_q, e.dependent, e.joins_family,
       e.parent, e.child, e.direction_confidence, coalesce(e.direction_decided, true) AS direction_decided,
       e.direction_reasons, e.block_map, e.tree_link, e.kinship, t.revision_a, t.revision_b, t.n_layers, t.layers,
       t.reason, t.closeness
FROM lineage_edges e LEFT JOIN test t USING (statistic, input_set)
WHERE e.model_a = $a AND e.model_b = $b
"""
"""One pair ($a < $b) as the last lineage rebuild judged it, with the per-block layers of the test it judged."""

DISCREPANCIES_OF_SQL = """
SELECT model_id, kind, related_model, confidence, detail, evidence FROM discrepancies
WHERE model_id IN (SELECT unnest($models)) ORDER BY model_id, kind
"""
"""The discrepancies of the cards of $models (a list)."""

ALL_FAMILIES_SQL = """
SELECT family_id, root, n_members, q, method, min_direction_confidence, coalesce(root_decided, true) AS root_decided
FROM families ORDER BY family_id
"""
"""Every family of the last lineage rebuild (``root_decided`` true for a build from before it was stored)."""

ALL_FAMILY_MEMBERS_SQL = "SELECT family_id, model_id, parents, merge_parents FROM family_members ORDER BY model_id"
"""Every family member with its tree and merge parents."""

DEPENDENT_EDGES_SQL = """
SELECT model_a, model_b, statistic, input_set, log10_p, log10_q, dependent, joins_family, parent, child,
       direction_confidence, coalesce(direction_decided, true) AS direction_decided, direction_reasons, block_map,
       tree_link, kinship
FROM lineage_edges WHERE dependent ORDER BY model_a, model_b
"""
"""Every dependent pair of the last lineage rebuild (what the lineage graph draws)."""

ALL_DISCREPANCIES_SQL = """
SELECT model_id, kind, related_model, confidence, detail, evidence FROM discrepancies
ORDER BY kind = 'cannot_tell', confidence DESC, model_id, kind
"""
"""Every discrepancy of the last lineage rebuild, most confident first, the "cannot tell" entries last."""

TABLES_SQL = """
SELECT table_name AS name, 'table' AS kind, column_count AS columns FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
UNION ALL
SELECT view_name, 'view', column_count FROM duckdb_views()
WHERE database_name = current_database() AND schema_name = 'main' AND NOT internal AND NOT temporary
ORDER BY name
"""
"""The database's own tables and views (DuckDB's catalogue), by name."""


def overview(store: Store) -> dict:
    """`OVERVIEW_SQL` as a dict."""
    return store.query(OVERVIEW_SQL).row(0, named=True)


def families_page(store: Store, *, limit: int, offset: int = 0) -> pl.DataFrame:
    return store.query(FAMILIES_PAGE_SQL, {"limit": limit, "offset": offset})


def discrepancies_page(store: Store, *, limit: int, offset: int = 0) -> pl.DataFrame:
    return store.query(DISCREPANCIES_PAGE_SQL, {"limit": limit, "offset": offset})


def search_models(store: Store, text: str, *, limit: int, offset: int = 0) -> pl.DataFrame:
    return store.query(SEARCH_MODELS_SQL, {"text": text, "limit": limit, "offset": offset})


def model_fingerprints(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(MODEL_FINGERPRINTS_SQL, {"model": model_id})


def model_family(store: Store, model_id: str) -> dict | None:
    """`MODEL_FAMILY_SQL`'s row, or None for a model in no family (no lineage rebuild since it was scanned)."""
    frame = store.query(MODEL_FAMILY_SQL, {"model": model_id})
    return frame.row(0, named=True) if frame.height else None


def model_relatives(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(MODEL_RELATIVES_SQL, {"model": model_id})


def model_pair_tests(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(MODEL_PAIR_TESTS_SQL, {"model": model_id})


def model_discrepancies(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(MODEL_DISCREPANCIES_SQL, {"model": model_id})


def model_errors(store: Store, model_id: str) -> pl.DataFrame:
    return store.query(MODEL_ERRORS_SQL, {"model": model_id})


def family(store: Store, family_id: str) -> dict | None:
    """`FAMILY_SQL`'s row, or None for an unknown family id."""
    frame = store.query(FAMILY_SQL, {"family": family_id})
    return frame.row(0, named=True) if frame.height else None


def family_members(store: Store, family_id: str) -> pl.DataFrame:
    return store.query(FAMILY_MEMBERS_SQL, {"family": family_id})


def family_member_ids(store: Store, family_id: str) -> list[str]:
    return store.query(FAMILY_MEMBER_IDS_SQL, {"family": family_id})["model_id"].to_list()


def lineage_edges_among(store: Store, model_ids: list[str]) -> pl.DataFrame:
    return store.query(LINEAGE_EDGES_AMONG_SQL, {"models": list(model_ids)})


def pair_evidence(store: Store, model_a: str, model_b: str) -> dict | None:
    """`PAIR_EVIDENCE_SQL`'s row for the pair in either order, or None when the last rebuild did not judge it."""
    a, b = sorted((model_a, model_b))
    frame = store.query(PAIR_EVIDENCE_SQL, {"a": a, "b": b})
    return frame.row(0, named=True) if frame.height else None


def all_families(store: Store) -> pl.DataFrame:
    return store.query(ALL_FAMILIES_SQL)


def all_family_members(store: Store) -> pl.DataFrame:
    return store.query(ALL_FAMILY_MEMBERS_SQL)


def dependent_edges(store: Store) -> pl.DataFrame:
    return store.query(DEPENDENT_EDGES_SQL)


def all_discrepancies(store: Store) -> pl.DataFrame:
    return store.query(ALL_DISCREPANCIES_SQL)


def discrepancies_of(store: Store, model_ids: list[str]) -> pl.DataFrame:
    return store.query(DISCREPANCIES_OF_SQL, {"models": list(model_ids)})


def tables(store: Store) -> pl.DataFrame:
    """`TABLES_SQL` with each one's exact row count (``rows``)."""
    frame = store.query(TABLES_SQL)
    counts = [store.query(f"SELECT count(*) AS n FROM {_identifier(name)}")["n"][0] for name in frame["name"]]
    return frame.with_columns(pl.Series("rows", counts, dtype=pl.Int64))


def table_batches(store: Store, table: str, *, as_text: bool = False, batch_rows: int = 10_000) -> AnswerStream:
    """Every row of one of `tables` (``KeyError`` at once for any other name) in frames of about ``batch_rows`` (at
    least one, empty for an empty table, so its columns are known), read on a connection of its own: an export of a
    big table never holds all of it in memory, and the store's connection stays free for other reads meanwhile.
    ``as_text``: every column as DuckDB's text (`Store.stream_as_text`)."""
    if table not in set(store.query(TABLES_SQL)["name"]):
        raise KeyError(table)
    return store.stream_as_text(f"SELECT * FROM {_identifier(table)}", every_column=as_text, batch_rows=batch_rows)


def _identifier(name: str) -> str:
    """A name from the catalogue as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'
