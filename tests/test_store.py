"""The scan database on real DuckDB files: schema and migrations, idempotent upserts, superseding, transactions,
single-writer locking across processes, and the investigator queries."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import polars as pl
import pytest

from scanner.stats.versions import statistic_version
from scanner.store import LATEST_VERSION, MIGRATIONS, Store, StoreError, StoreLockedError, queries
from scanner.store.schema import CORE_DDL, SCHEMA_VERSION_DDL
from tests.store_support import T0, Meta, record, scanned_hub, test_row, writer_holding

TABLES = {"schema_version", "models", "fingerprints", "pair_tests", "scan_runs", "scan_errors", "lineage_edges",
          "families", "family_members", "discrepancies"}


def count(store: Store, table: str) -> int:
    return store.query(f"SELECT count(*) AS n FROM {table}")["n"][0]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "scan.duckdb"


# schema ---------------------------------------------------------------------------------------------------------
def test_schema_created_and_reopened(db: Path) -> None:
    with Store(db) as store:
        names = set(store.query("SELECT table_name FROM information_schema.tables")["table_name"])
        assert TABLES | {"current_models", "current_pair_tests"} <= names
        assert store.schema_version() == LATEST_VERSION
        store.upsert_model(record("org/a"), Meta(), store.start_run({}), "ok")
    for _ in range(2):  # reopening runs no migration twice and keeps the data
        with Store(db) as store:
            versions = store.query("SELECT version FROM schema_version ORDER BY version")["version"].to_list()
            assert versions == [m.version for m in MIGRATIONS]   # every step, once (numbers may skip)
            assert count(store, "models") == 1
    with Store(db, read_only=True) as store:
        assert store.known_revision("org/a") == "r1"


def test_old_file_is_migrated_and_readers_are_told(db: Path) -> None:
    con = duckdb.connect(str(db))  # a file as schema version 1 left it: no lineage tables
    con.execute(SCHEMA_VERSION_DDL)
    for statement in CORE_DDL:
        con.execute(statement)
    con.execute("INSERT INTO schema_version VALUES (1, 'core', now(), '0.0.1')")
    con.execute("INSERT INTO scan_runs (run_id, started_at, status, hubtrace_version) VALUES ('old', now(), "
                "'succeeded', '0.0.1')")
    con.close()
    with pytest.raises(StoreError, match="schema version 1.*read-write"):
        Store(db, read_only=True)
    with Store(db) as store:
        assert store.schema_version() == LATEST_VERSION
        assert count(store, "lineage_edges") == 0
        assert store.query("SELECT run_id FROM scan_runs")["run_id"].to_list() == ["old"]


def test_newer_file_is_not_written(db: Path) -> None:
    Store(db).close()
    con = duckdb.connect(str(db))
    con.execute("INSERT INTO schema_version VALUES (?, 'future', now(), '9')", [LATEST_VERSION + 1])
    con.close()
    with pytest.raises(StoreError, match="newer than this hubtrace"):
        Store(db)


def test_missing_and_corrupt_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no scan database"):
        Store(tmp_path / "absent.duckdb", read_only=True)
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreError, match="junk.duckdb"):
        Store(junk)


# upserts --------------------------------------------------------------------------------------------------------
def test_every_write_is_idempotent_on_retry(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({"sources": ["local"]})
        batch = [test_row("org/a", "r1", "org/b", "r1", -60.0, run), test_row("org/a", "r1", "org/c", "r1", -1.0, run)]
        for _ in range(2):
            store.upsert_model(record("org/a"), Meta(), run, "ok")
            store.put_fingerprint("org/a", "r1", "v1", "/fp/a.safetensors", "sha", 2048, run)
            store.put_pair_tests(batch)
            store.record_error(run, "org/x", "r1", "/hub/org/x", "fingerprint", "CheckpointError", "truncated")
        assert [count(store, t) for t in ("models", "fingerprints", "pair_tests", "scan_errors")] == [1, 1, 2, 1]
        assert store.recorded_fingerprint_path("org/a", "r1", "v1") == "/fp/a.safetensors"
        assert store.recorded_fingerprint_path("org/a", "r2", "v1") is None
        # a retried batch that repeats a pair inside itself keeps the last one
        store.put_pair_tests([test_row("org/a", "r1", "org/c", "r1", -2.0, run),
                              test_row("org/c", "r1", "org/a", "r1", -3.0, run)])
        assert store.query("SELECT log10_p FROM pair_tests WHERE model_b = 'org/c'")["log10_p"].to_list() == [-3.0]
        store.finish_run(run, "succeeded", {"models": 1})
        runs = store.query("SELECT status, summary, finished_at FROM scan_runs")
        assert runs["status"].to_list() == ["succeeded"] and runs["finished_at"][0] is not None
        with pytest.raises(StoreError, match="no scan run"):
            store.finish_run("nope", "succeeded", {})
        with pytest.raises(StoreError, match="run status"):
            store.finish_run(run, "done", {})


def test_model_row_holds_record_and_fingerprint_fields(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({})
        store.upsert_model(record("org/ft", bases=("org/base",), created=T0), Meta(), run, "ok")
        row = store.query("SELECT * FROM models").row(0, named=True)
        assert row["declared_base_models"] == ["org/base"] and row["declared_relation"] == "finetune"
        assert (row["architecture"], row["n_layers"], row["parameter_count"]) == ("LlamaForCausalLM", 4, 123_456)
        assert row["created_at"] == T0 and row["tags"] == ["text-generation"]
        # a later failure at the same revision keeps what the fingerprint said, and records the status
        run2 = store.start_run({})
        store.upsert_model(record("org/ft", bases=("org/base",), created=T0), None, run2, "error")
        row = store.query("SELECT * FROM models").row(0, named=True)
        assert (row["status"], row["hidden_size"], row["first_seen_run"], row["last_seen_run"]) == (
            "error", 64, run, run2)
        with pytest.raises(StoreError, match="model status"):
            store.upsert_model(record("org/ft"), None, run2, "superseded")


def test_each_model_row_says_which_kind_of_units_its_fingerprint_holds(db: Path) -> None:
    """mlp_kind and attention come from the fingerprint, so the pair plan groups models of one kind; a row from
    before they were stored (NULL) reads as what every model then was: gated, causal."""
    with Store(db) as store:
        run = store.start_run({})
        for model_id, meta in (("org/bert", Meta(mlp_kind="plain", attention="bidirectional")), ("org/llama", Meta()),
                               ("org/old", Meta(mlp_kind=None, attention=None))):
            store.upsert_model(record(model_id), meta, run, "ok")
            store.put_fingerprint(model_id, "r1", meta.input_set, f"/fp/{model_id}", "sha", 256, run)
        kinds = {row[0]: row[-1] for row in store.fingerprinted_ok_models("v1-")}
        assert kinds == {"org/bert": "plain, bidirectional", "org/llama": "gated, causal", "org/old": "gated, causal"}
        assert store.query("SELECT attention FROM current_models WHERE model_id = 'org/bert'")["attention"][0] == (
            "bidirectional")


def test_pairs_are_stored_with_the_smaller_model_first(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({})
        layers = [{"layer_a": 3, "layer_b": 1, "log10_p": -9.0, "rho": 0.5, "n_units": 64}]
        store.put_pair_tests([test_row("org/z", "rz", "org/a", "ra", -9.0, run, layers=layers)])
        row = store.query("SELECT model_a, revision_a, model_b, revision_b, layers FROM pair_tests").row(0)
        assert row[:4] == ("org/a", "ra", "org/z", "rz")
        assert pl.Series([row[4]]).str.json_decode().to_list()[0][0]["layer_a"] == 1
        assert store.tested_pair_keys("match", "v1") == {("org/a", "ra", "org/z", "rz")}
        assert store.tested_pair_keys("match", "other") == set()
        assert store.tested_pair_keys("hidden", "v1") == set()


def test_a_test_an_earlier_version_of_its_statistic_made_is_made_again(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({})
        store.put_pair_tests([test_row("org/a", "ra", "org/b", "rb", -9.0, run),
                              test_row("org/a", "ra", "org/c", "rc", -2.0, run)])
        stored = store.query("SELECT statistic_version FROM pair_tests")["statistic_version"].to_list()
        assert stored == [statistic_version("match")] * 2 and statistic_version("match") >= 2
    # a row from before versions were recorded (NULL) and an older version's are no longer tests of today's
    con = duckdb.connect(str(db))
    con.execute("UPDATE pair_tests SET statistic_version = NULL WHERE model_b = 'org/b'")
    con.execute("UPDATE pair_tests SET statistic_version = 1 WHERE model_b = 'org/c'")
    con.close()
    with Store(db) as store:
        assert store.tested_pair_keys("match", "v1") == set()
        store.put_pair_tests([test_row("org/a", "ra", "org/b", "rb", -9.0, run)])  # tested again: replaces it
        assert store.tested_pair_keys("match", "v1") == {("org/a", "ra", "org/b", "rb")}
        assert store.query("SELECT count(*) AS n FROM pair_tests")["n"][0] == 2


# supersede ------------------------------------------------------------------------------------------------------
def test_new_revision_supersedes_old_rows_and_tests(db: Path) -> None:
    with Store(db) as store:
        run1 = store.start_run({})
        for m in ("org/a", "org/b", "org/c"):
            store.upsert_model(record(m), Meta(), run1, "ok")
        store.put_pair_tests([test_row("org/a", "r1", "org/b", "r1", -50.0, run1),
                              test_row("org/a", "r1", "org/c", "r1", -1.0, run1),
                              test_row("org/b", "r1", "org/c", "r1", -1.5, run1)])
        run2 = store.start_run({})
        store.upsert_model(record("org/a"), Meta(), run2, "ok")  # unchanged: nothing superseded
        assert count(store, "current_pair_tests") == 3
        store.upsert_model(record("org/a", "r2"), Meta(), run2, "ok")
        assert store.known_revision("org/a") == "r2"
        statuses = dict(store.query("SELECT revision, status FROM models WHERE model_id = 'org/a'").iter_rows())
        assert statuses == {"r1": "superseded", "r2": "ok"}
        assert count(store, "pair_tests") == 3  # history kept
        assert store.tested_pair_keys("match", "v1") == {("org/b", "r1", "org/c", "r1")}
        # a late result for the old revision (a batch planned before the change) lands as history
        store.put_pair_tests([test_row("org/a", "r1", "org/b", "r1", -51.0, run2)])
        assert store.tested_pair_keys("match", "v1") == {("org/b", "r1", "org/c", "r1")}
        store.put_pair_tests([test_row("org/a", "r2", "org/b", "r1", -40.0, run2)])
        assert ("org/a", "r2", "org/b", "r1") in store.tested_pair_keys("match", "v1")
        # back to r1: its tests against partners still at their tested revision hold again
        store.upsert_model(record("org/a", "r1"), Meta(), store.start_run({}), "ok")
        assert store.tested_pair_keys("match", "v1") == {
            ("org/a", "r1", "org/b", "r1"), ("org/a", "r1", "org/c", "r1"), ("org/b", "r1", "org/c", "r1")}
        assert store.known_revision("org/a") == "r1"
        assert store.known_revision("org/unknown") is None


# transactions ---------------------------------------------------------------------------------------------------
def test_a_failing_batch_writes_nothing(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({})
        good = [test_row(f"org/m{i:03d}", "r", "org/z", "r", -1.0, run) for i in range(50)]
        bad = test_row("org/a", "r", "org/a", "r", -1.0, run)  # a model against itself violates the pair check
        with pytest.raises(duckdb.ConstraintException):
            store.put_pair_tests([*good, bad])
        assert count(store, "pair_tests") == 0
        with pytest.raises(RuntimeError), store.transaction():
            store.put_pair_tests(good)
            store.upsert_model(record("org/a"), Meta(), run, "ok")
            raise RuntimeError("driver died mid-store")
        assert count(store, "pair_tests") == count(store, "models") == 0
        store.put_pair_tests(good)  # the connection is usable after the rollback
        assert count(store, "pair_tests") == 50


# one writer, many readers ---------------------------------------------------------------------------------------
def test_readers_share_the_file_and_cannot_write(db: Path) -> None:
    with Store(db) as store:
        store.start_run({})
    with Store(db, read_only=True) as one, Store(db, read_only=True) as two:
        assert count(one, "scan_runs") == count(two, "scan_runs") == 1
        with pytest.raises(duckdb.Error, match="read-only"):
            one.start_run({})


def test_a_running_writer_gives_a_clear_error(db: Path) -> None:
    Store(db).close()
    with writer_holding(db) as writer:
        for read_only in (True, False):
            with pytest.raises(StoreLockedError, match=rf"open for writing by process {writer.pid}.*scan"):
                Store(db, read_only=read_only)
    with Store(db, read_only=True) as store:  # free again once the writer is gone
        assert store.schema_version() == LATEST_VERSION


# queries --------------------------------------------------------------------------------------------------------
def test_query_returns_polars_frames_with_types(db: Path) -> None:
    with Store(db) as store:
        run = store.start_run({})
        store.put_pair_tests([test_row("org/a", "r", "org/b", "r", -7.5, run)])
        frame = store.query("SELECT log10_p, notes, tested_at, superseded FROM pair_tests WHERE statistic = ?",
                            ["match"])
        assert isinstance(frame, pl.DataFrame) and frame["log10_p"].to_list() == [-7.5]
        assert frame.schema["notes"] == pl.List(pl.String) and frame.schema["superseded"] == pl.Boolean
        assert frame.schema["tested_at"] == pl.Datetime("us", "UTC")
        empty = store.query("SELECT model_id, n_layers FROM models")
        assert empty.height == 0 and empty.columns == ["model_id", "n_layers"]


def test_bulk_write_of_100k_pair_tests(db: Path) -> None:
    n = 100_000
    layers = [{"layer_a": i, "layer_b": i, "log10_p": -3.0, "rho": 0.4, "n_units": 64} for i in range(4)]
    with Store(db) as store:
        run = store.start_run({})
        rows = [test_row(f"org/m{i // 500:04d}", "r", f"org/n{i % 500:04d}", "r", -float(i % 97), run, layers=layers)
                for i in range(n)]
        store.put_pair_tests(rows)
        assert count(store, "current_pair_tests") == n
        assert len(store.tested_pair_keys("match", "v1")) == n
        total = store.query("SELECT sum(log10_p) AS s, sum(json_array_length(layers)) AS l FROM pair_tests").row(0)
        assert total == (sum(-float(i % 97) for i in range(n)), 4 * n)


def test_who_depends_on_and_derives_from(db: Path) -> None:
    with Store(db) as store:
        scanned_hub(store)
        near = queries.dependent_on(store, "org/ft")
        assert near["model_id"].to_list() == ["org/base", "copy/ft"]  # copy/ft r1's test is superseded; r2's: -55
        assert near.filter(pl.col("model_id") == "copy/ft")["revision"].to_list() == ["r2"]
        assert queries.dependent_on(store, "org/ft", log10_p_below=-58)["model_id"].to_list() == ["org/base"]
        assert queries.derives_from(store, "org/base").height == 0  # no lineage rebuilt yet
        store.connection.execute(
            "INSERT INTO lineage_edges (model_a, model_b, dependent, parent, child, tree_link, log10_p) VALUES "
            "('org/base', 'org/ft', true, 'org/base', 'org/ft', 'tree', -60), "
            "('copy/ft', 'org/ft', true, 'org/ft', 'copy/ft', 'tree', -55), "
            "('copy/ft', 'org/base', true, 'org/base', 'copy/ft', NULL, -60), "
            "('org/base', 'other/indep', false, NULL, NULL, NULL, -0.5)")
        tree = queries.derives_from(store, "org/base")
        assert tree.select("model_id", "parent", "depth").rows() == [("org/ft", "org/base", 1),
                                                                      ("copy/ft", "org/ft", 2)]
        assert tree["direction_decided"].to_list() == [True, True]
        assert queries.derives_from(store, "copy/ft").height == 0
        # a link whose direction is undecided: the model below it is listed after the others, and says so
        store.connection.execute(
            "INSERT INTO lineage_edges (model_a, model_b, dependent, parent, child, tree_link, log10_p, "
            "direction_decided) VALUES ('org/ft', 'x/maybe', true, 'org/ft', 'x/maybe', 'tree', -40, false)")
        tree = queries.derives_from(store, "org/base")
        assert tree["model_id"].to_list() == ["org/ft", "copy/ft", "x/maybe"]
        maybe = tree.row(2, named=True)
        assert not maybe["direction_decided"] and "undecided" in maybe["relation"] and maybe["depth"] == 2
        assert tree["relation"].to_list()[:2] == ["derives from it", "derives from it"]


def test_claims_no_parent_but_depends(db: Path) -> None:
    with Store(db) as store:
        scanned_hub(store)
        found = queries.claims_no_parent_but_depends(store)
        # copy/ft claims from-scratch yet depends on the older org/base and org/ft; org/base declares nothing
        # but its dependents are newer or declare it, so it is not listed
        assert sorted(found.select("model_id", "depends_on").rows()) == [("copy/ft", "org/ft")]
        assert found["revision"].to_list() == ["r2"] and found["claims_from_scratch"].to_list() == [True]
        assert queries.undeclared_derivatives(store).height == 0  # no lineage rebuilt yet


def test_what_changed_and_errors_per_run(db: Path) -> None:
    with Store(db) as store:
        night1, night2 = scanned_hub(store)
        assert queries.latest_run_id(store) == night2
        changes = queries.run_changes(store)
        assert sorted(changes.select("kind", "model_id").rows()) == [
            ("new_dependence", "copy/ft"), ("new_error", "new/other"), ("new_model", "new/model"),
            ("new_revision", "copy/ft"), ("repeated_error", "bad/broken")]
        assert changes.filter(pl.col("kind") == "new_revision")["detail"].to_list() == ["was r1, status ok"]
        first = queries.run_changes(store, night1)
        assert first.filter(pl.col("kind") == "new_model").height == 5
        found = first.filter(pl.col("kind") == "new_dependence")
        assert found.height == 3 and found["detail"].str.ends_with("since superseded").sum() == 2  # copy/ft r1
        night2_start = store.query("SELECT started_at FROM scan_runs WHERE run_id = ?", [night2])["started_at"][0]
        assert queries.changes_since(store, night2_start).equals(changes)
        assert queries.changes_since(store, T0).height == first.height + changes.height
        errors = queries.run_errors(store)
        assert dict(errors.select("model_id", "new").rows()) == {"bad/broken": False, "new/other": True}
        assert queries.run_errors(store, night1)["new"].to_list() == [True]
        overview = queries.runs(store)
        assert overview.select("run_id", "new_model_rows", "pair_tests", "errors").rows() == [
            (night2, 2, 2, 2), (night1, 5, 6, 1)]


# tensor hashes --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HashedMeta(Meta):
    tensor_hashes: dict = field(default_factory=dict)


def test_shared_tensor_pairs_are_a_join_over_current_revisions(db: Path) -> None:
    embed, own = "model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight"
    with Store(db) as store:
        run = store.start_run({})
        for model, hashes in {"org/base": {embed: "e1", own: "u1", "model.norm.weight": "ones"},
                              "org/copy": {embed: "e1", own: "u2", "model.norm.weight": "ones"},
                              "org/other": {embed: "e2", own: "u3", "model.norm.weight": "ones"}}.items():
            store.upsert_model(record(model), HashedMeta(tensor_hashes=hashes), run, "ok")
        assert count(store, "model_tensors") == 9
        skip = ("norm", "bias")
        both = (("org/base", "r1"), ("org/copy", "r1"))
        assert store.shared_tensor_pairs([("org/copy", "r1")], skip) == {both}
        assert store.shared_tensor_pairs([("org/other", "r1")], skip) == set(), "only a norm is shared"
        assert len(store.shared_tensor_pairs([("org/other", "r1")])) == 2, "without skip words the norm counts"
        assert store.shared_tensor_pairs([], skip) == set()
        # a new revision of the copy no longer shares the embedding: the old revision's rows stay, not current
        store.upsert_model(record("org/copy", "r2"), HashedMeta(tensor_hashes={embed: "e3", own: "u2"}), run, "ok")
        assert store.shared_tensor_pairs([("org/copy", "r2"), ("org/base", "r1")], skip) == set()
        assert store.revisions_with_tensor_hashes() == {("org/base", "r1"), ("org/copy", "r1"), ("org/copy", "r2"),
                                                        ("org/other", "r1")}
        store.put_tensor_hashes("org/other", "r1", {embed: "e1"})   # replaced, not added to
        assert count(store, "model_tensors WHERE model_id = 'org/other'") == 1
        assert store.shared_tensor_pairs([("org/other", "r1")], skip) == {(("org/base", "r1"), ("org/other", "r1"))}
