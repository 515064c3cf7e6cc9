"""The store's schema as an ordered list of migrations, so a file written by an older hubtrace is brought up to
date when a newer one opens it for writing. Each migration runs once, in its own transaction, and is recorded in
``schema_version``; its statements are also safe to run again (``IF NOT EXISTS``, ``OR REPLACE``), except a
table rebuilt to change a constraint (migration 10), which the transaction makes all or nothing."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

SCHEMA_VERSION_DDL = """CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY, description VARCHAR NOT NULL, applied_at TIMESTAMPTZ NOT NULL,
    hubtrace_version VARCHAR NOT NULL)"""

CORE_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS scan_runs (
        run_id VARCHAR PRIMARY KEY, started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ,
        status VARCHAR NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
        config JSON, hubtrace_version VARCHAR NOT NULL, summary JSON)""",
    """CREATE TABLE IF NOT EXISTS models (
        model_id VARCHAR NOT NULL, revision VARCHAR NOT NULL, source VARCHAR, location VARCHAR,
        architecture VARCHAR, model_type VARCHAR, hidden_size INTEGER, intermediate_size INTEGER,
        n_layers INTEGER, n_experts INTEGER, vocab_size INTEGER, tokenizer_hash VARCHAR, parameter_count BIGINT,
        declared_base_models VARCHAR[], declared_relation VARCHAR, claims_from_scratch BOOLEAN, license VARCHAR,
        tags VARCHAR[], created_at TIMESTAMPTZ, last_modified TIMESTAMPTZ,
        status VARCHAR NOT NULL CHECK (status IN ('ok', 'error', 'superseded')),
        first_seen_run VARCHAR, last_seen_run VARCHAR,
        PRIMARY KEY (model_id, revision))""",
    """CREATE TABLE IF NOT EXISTS fingerprints (
        model_id VARCHAR NOT NULL, revision VARCHAR NOT NULL, input_set VARCHAR NOT NULL, path VARCHAR NOT NULL,
        file_sha256 VARCHAR, n_tokens BIGINT, hubtrace_version VARCHAR, run_id VARCHAR, created_at TIMESTAMPTZ,
        PRIMARY KEY (model_id, revision, input_set))""",
    """CREATE TABLE IF NOT EXISTS pair_tests (
        model_a VARCHAR NOT NULL, revision_a VARCHAR NOT NULL, model_b VARCHAR NOT NULL,
        revision_b VARCHAR NOT NULL, statistic VARCHAR NOT NULL, input_set VARCHAR NOT NULL,
        log10_p DOUBLE, n_layers INTEGER, layers JSON, notes VARCHAR[],
        reason VARCHAR CHECK (reason IN ('comparable', 'declared_base')),
        hubtrace_version VARCHAR, run_id VARCHAR, tested_at TIMESTAMPTZ, superseded BOOLEAN NOT NULL DEFAULT false,
        PRIMARY KEY (model_a, revision_a, model_b, revision_b, statistic, input_set),
        CHECK (model_a < model_b OR (model_a = model_b AND revision_a < revision_b)))""",
    """CREATE TABLE IF NOT EXISTS scan_errors (
        run_id VARCHAR NOT NULL, model_id VARCHAR NOT NULL, stage VARCHAR NOT NULL, revision VARCHAR,
        location VARCHAR, error_type VARCHAR, reason VARCHAR, "at" TIMESTAMPTZ NOT NULL,
        PRIMARY KEY (run_id, model_id, stage))""",
    "CREATE OR REPLACE VIEW current_models AS SELECT * FROM models WHERE status <> 'superseded'",
    "CREATE OR REPLACE VIEW current_pair_tests AS SELECT * FROM pair_tests WHERE NOT superseded",
)

CLOSENESS_DDL: tuple[str, ...] = (
    "ALTER TABLE pair_tests ADD COLUMN IF NOT EXISTS closeness DOUBLE",
    # The view's column list was fixed when it was created: recreate it so it shows the new column.
    "CREATE OR REPLACE VIEW current_pair_tests AS SELECT * FROM pair_tests WHERE NOT superseded",
)
"""Rows tested before this step keep closeness NULL; the lineage then falls back to p-values for those pairs."""


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
"""The lineage tables (written by lineage_graph through scanner.store.lineage_tables), migration 2."""


CANDIDATE_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS candidate_pairs (
        model_a VARCHAR NOT NULL, revision_a VARCHAR NOT NULL, model_b VARCHAR NOT NULL, revision_b VARCHAR NOT NULL,
        input_set VARCHAR NOT NULL, score INTEGER, rank INTEGER,
        source VARCHAR NOT NULL CHECK (source IN ('retrieval', 'family', 'declared_base', 'identical_tensor')),
        block_map JSON, run_id VARCHAR, found_at TIMESTAMPTZ,
        PRIMARY KEY (model_a, revision_a, model_b, revision_b),
        CHECK (model_a < model_b OR (model_a = model_b AND revision_a < revision_b)))""",
    """CREATE OR REPLACE VIEW current_candidate_pairs AS SELECT c.* FROM candidate_pairs c
        JOIN current_models ma ON ma.model_id = c.model_a AND ma.revision = c.revision_a
        JOIN current_models mb ON mb.model_id = c.model_b AND mb.revision = c.revision_b""",
)


TENSOR_HASH_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS model_tensors (
        model_id VARCHAR NOT NULL, revision VARCHAR NOT NULL, tensor VARCHAR NOT NULL, sha256 VARCHAR NOT NULL,
        PRIMARY KEY (model_id, revision, tensor))""",
    "CREATE INDEX IF NOT EXISTS model_tensors_sha256 ON model_tensors (sha256)",
)
"""Every weight tensor's sha256 (the validation pass computes them), so pairs sharing a byte-identical tensor are a
join, not a read of every fingerprint header; migration 5."""

NO_TENSOR_HASH_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS no_tensor_hashes (
        model_id VARCHAR NOT NULL, revision VARCHAR NOT NULL, read_at TIMESTAMPTZ,
        PRIMARY KEY (model_id, revision))""",
)
"""Revisions whose fingerprint header was read and carries no tensor hashes (written before the validation pass
hashed tensors), so the scan's backfill of ``model_tensors`` reads each such header once; migration 6."""


WEIGHT_STATISTICS_DDL: tuple[str, ...] = (
    "ALTER TABLE pair_tests ADD COLUMN IF NOT EXISTS value DOUBLE",
    "CREATE OR REPLACE VIEW current_pair_tests AS SELECT * FROM pair_tests WHERE NOT superseded",
    """CREATE TABLE IF NOT EXISTS weight_profiles (
        model_id VARCHAR NOT NULL, revision VARCHAR NOT NULL, n_layers INTEGER, norm_kinds INTEGER,
        hidden_size INTEGER, norms BLOB, attn_std DOUBLE[], ghostspec DOUBLE[], made_at TIMESTAMPTZ,
        PRIMARY KEY (model_id, revision))""",
)
"""The weight fingerprints of public disputes (scanner.stats.weight_statistics): each model's profile when a scan
asks for them (``pairs.extra_stats``), and their raw values beside phi_MATCH in pair_tests; migration 7."""


DIRECTION_LEVEL_DDL: tuple[str, ...] = (
    "ALTER TABLE lineage_edges ADD COLUMN IF NOT EXISTS direction_decided BOOLEAN",
    "ALTER TABLE lineage_edges ADD COLUMN IF NOT EXISTS min_direction_confidence DOUBLE",
    "ALTER TABLE families ADD COLUMN IF NOT EXISTS min_direction_confidence DOUBLE",
)
"""Whether each edge's direction is claimed (its confidence reaches the level the investigator set, which is stored
with the build so a reader recomputes the same lineage); migration 8. NULL in rows built before it."""


DATABASE_IDENTITY_DDL: tuple[str, ...] = (
    """CREATE TABLE IF NOT EXISTS database_identity (
        database_id VARCHAR PRIMARY KEY, created_at TIMESTAMPTZ NOT NULL, legacy_artefacts BOOLEAN NOT NULL)""",
    """INSERT INTO database_identity SELECT uuid()::VARCHAR, now(), EXISTS (SELECT 1 FROM scan_runs)
        WHERE NOT EXISTS (SELECT 1 FROM database_identity)""",
)
"""The database's identity, one row: every artefact a scan keeps beside it (the retrieval index, its manifest and
entries, the fingerprint store) records this id, so one left by another or a deleted database is never trusted
(scanner.store.database_identity). ``legacy_artefacts``: the id was given to a database that already had scans, so
artefacts written before ids existed (none recorded) are its own; migration 9."""


ABANDONED_RUNS_DDL: tuple[str, ...] = (
    """CREATE TABLE scan_runs_with_process (
        run_id VARCHAR PRIMARY KEY, started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ,
        status VARCHAR NOT NULL CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
        config JSON, hubtrace_version VARCHAR NOT NULL, summary JSON, host VARCHAR, pid INTEGER)""",
    """INSERT INTO scan_runs_with_process SELECT run_id, started_at, finished_at, status, config, hubtrace_version,
        summary, NULL, NULL FROM scan_runs""",
    "DROP TABLE scan_runs",
    "ALTER TABLE scan_runs_with_process RENAME TO scan_runs",
)
"""Status ``abandoned`` (a run whose process ended without finishing it: killed, or its machine lost) and the host
and process id of each run; DuckDB cannot change a CHECK constraint in place, so the table is rebuilt (once, in the
migration's transaction: these statements are not meant to run twice); migration 10."""


MODEL_KIND_DDL: tuple[str, ...] = (
    "ALTER TABLE models ADD COLUMN IF NOT EXISTS mlp_kind VARCHAR",
    "ALTER TABLE models ADD COLUMN IF NOT EXISTS attention VARCHAR",
    "CREATE OR REPLACE VIEW current_models AS SELECT * FROM models WHERE status <> 'superseded'",
)
"""The kind of units each fingerprint holds (gated or plain MLPs; a decoder's causal or an encoder's bidirectional
reading), so a scan pairs only models of one kind; NULL in rows fingerprinted before it (read as gated, causal:
what every model was before encoders were read); migration 11."""


DECLARED_MERGE_DDL: tuple[str, ...] = (
    "ALTER TABLE models ADD COLUMN IF NOT EXISTS merge_config JSON",
    "CREATE OR REPLACE VIEW current_models AS SELECT * FROM models WHERE status <> 'superseded'",
    "ALTER TABLE families ADD COLUMN IF NOT EXISTS root_decided BOOLEAN",
    "ALTER TABLE lineage_edges ADD COLUMN IF NOT EXISTS kinship VARCHAR",
    """CREATE TABLE IF NOT EXISTS block_maps (
        model_a VARCHAR NOT NULL, revision_a VARCHAR NOT NULL, model_b VARCHAR NOT NULL, revision_b VARCHAR NOT NULL,
        input_set VARCHAR NOT NULL, pairs JSON, computed_at TIMESTAMPTZ,
        PRIMARY KEY (model_a, revision_a, model_b, revision_b, input_set))""",
)
"""What a model folder's mergekit_config.yml declares (models.merge_config), whether a family's root is claimed
(families.root_decided: every link out of it decided), how two relatives stand in the family tree
(lineage_edges.kinship: parent, ancestor, sibling, cousin, copy...), and the any-order block maps of related pairs
whose depths differ (block_maps: every block of the deeper model against its best block of the shallower one, kept
so that a rebuild computes each once); migration 12."""


STATISTIC_VERSION_DDL: tuple[str, ...] = (
    "ALTER TABLE pair_tests ADD COLUMN IF NOT EXISTS statistic_version INTEGER",
    "CREATE OR REPLACE VIEW current_pair_tests AS SELECT * FROM pair_tests WHERE NOT superseded",
)
"""The version of its statistic each test was made with (scanner.stats.versions; NULL: made before versions were
recorded, version 1); migration 13."""

MLP_VALUES_DDL: tuple[str, ...] = (
    "ALTER TABLE weight_profiles ADD COLUMN IF NOT EXISTS mlp_values BLOB",
    "ALTER TABLE weight_profiles ADD COLUMN IF NOT EXISTS mlp_layout VARCHAR",
)
"""Each weight profile's sample of MLP weight values (float32 bytes) and the digest of the shapes they were read from,
for the verbatim share (scanner.stats.verbatim); NULL in profiles recorded before; migration 14."""


CANNOT_TEST_DDL: tuple[str, ...] = (
    "ALTER TABLE pair_tests ADD COLUMN IF NOT EXISTS cannot_test VARCHAR",
    "CREATE OR REPLACE VIEW current_pair_tests AS SELECT * FROM pair_tests WHERE NOT superseded",
)
"""Why a pair could not be tested (too few units its statistic can read on either side), its log10_p then NULL: a
pair that cannot be tested is never stored as p = 1; migration 15."""


@dataclass(frozen=True)
class Migration:
    """One step of the schema: its version number, what it adds, and its DDL (a callable, so a step's DDL is
    built only when it runs)."""

    version: int
    description: str
    statements: Callable[[], Sequence[str]]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "models, fingerprints, pair_tests, scan_runs, scan_errors and the current_* views",
              lambda: CORE_DDL),
    Migration(2, "lineage tables: lineage_edges, families, family_members, discrepancies",
              lambda: LINEAGE_DDL),
    Migration(3, "pair_tests.closeness: how near two related models are (phi_MATCH's matched activations)",
              lambda: CLOSENESS_DDL),
    Migration(4, "candidate_pairs (pairs candidate retrieval chose for a test) and current_candidate_pairs",
              lambda: CANDIDATE_DDL),
    Migration(5, "model_tensors: each model revision's weight tensor sha256s (pairs sharing a tensor by a join)",
              lambda: TENSOR_HASH_DDL),
    Migration(6, "no_tensor_hashes: revisions whose fingerprint was read and holds no tensor hashes (read once)",
              lambda: NO_TENSOR_HASH_DDL),
    Migration(7, "pair_tests.value and weight_profiles: the weight fingerprints of public disputes",
              lambda: WEIGHT_STATISTICS_DDL),
    Migration(8, "lineage_edges.direction_decided and the min_direction_confidence of each lineage build",
              lambda: DIRECTION_LEVEL_DDL),
    Migration(9, "database_identity: the id every artefact beside the database records",
              lambda: DATABASE_IDENTITY_DDL),
    Migration(10, "scan_runs: status abandoned, and each run's host and process id",
              lambda: ABANDONED_RUNS_DDL),
    Migration(11, "models.mlp_kind and models.attention: the kind of units a fingerprint holds (pairs of one kind)",
              lambda: MODEL_KIND_DDL),
    Migration(12, "models.merge_config, families.root_decided, lineage_edges.kinship and block_maps",
              lambda: DECLARED_MERGE_DDL),
    Migration(13, "pair_tests.statistic_version: tests an earlier version of their statistic made are made again",
              lambda: STATISTIC_VERSION_DDL),
    Migration(14, "weight_profiles.mlp_values and mlp_layout: MLP weight values for the verbatim share",
              lambda: MLP_VALUES_DDL),
    Migration(15, "pair_tests.cannot_test: why a pair could not be tested (its log10_p NULL, never p = 1)",
              lambda: CANNOT_TEST_DDL),
)
"""Append new steps at the end with the next version number; never edit or reorder a released step."""

LATEST_VERSION = MIGRATIONS[-1].version
