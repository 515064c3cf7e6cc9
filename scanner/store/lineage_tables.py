"""The lineage tables (lineage_edges, families, family_members, discrepancies; DDL in schema.py): what
lineage_graph reads to build them, and their replacement in one transaction. lineage_graph computes; this module
holds its SQL."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import polars as pl

from scanner.store.store import Store

LINEAGE_TABLES = ("lineage_edges", "families", "family_members", "discrepancies")


def ok_models(store: Store) -> pl.DataFrame:
    """The current models that fingerprinted cleanly, with what direction and discrepancies need to know."""
    return store.query(
        "SELECT model_id, revision, architecture, n_layers, hidden_size, intermediate_size, n_experts, "
        "declared_base_models, declared_relation, claims_from_scratch, license, created_at, merge_config "
        "FROM current_models WHERE status = 'ok' ORDER BY model_id"
    )


def current_fingerprint_files(store: Store) -> list[tuple[str, str]]:
    """(model_id, recorded fingerprint path) for every current model; the files may have gone since."""
    rows = store.query(
        "SELECT f.model_id, f.path FROM fingerprints f JOIN current_models m USING (model_id, revision)")
    return list(rows.iter_rows())


def stored_block_maps(store: Store) -> dict[tuple[str, str, str, str, str], str]:
    """(model_a, revision_a, model_b, revision_b, input_set) -> the any-order block map kept for it (JSON)."""
    rows = store.query("SELECT model_a, revision_a, model_b, revision_b, input_set, pairs FROM block_maps")
    return {tuple(r[:5]): r[5] for r in rows.iter_rows()}


def latest_pair_tests(store: Store, statistic: str) -> pl.DataFrame:
    """The newest current test of each pair with this statistic and a p-value."""
    return store.query(
        "SELECT model_a, revision_a, model_b, revision_b, statistic, input_set, log10_p, n_layers, layers, reason, "
        "closeness "
        "FROM current_pair_tests WHERE statistic = ? AND log10_p IS NOT NULL "
        "QUALIFY row_number() OVER (PARTITION BY model_a, model_b ORDER BY tested_at DESC) = 1",
        [statistic],
    )


def stored_families(store: Store) -> tuple[dict[str, list[str]], dict[str, datetime]]:
    """The families as last built: members by family id, and when each family id was first built."""
    members = store.query("SELECT family_id, list(model_id) AS members FROM family_members GROUP BY family_id")
    first = store.query("SELECT family_id, first_built_at FROM families")
    return ({r["family_id"]: list(r["members"]) for r in members.iter_rows(named=True)},
            {r["family_id"]: r["first_built_at"] for r in first.iter_rows(named=True)})


def last_fdr_setting(store: Store) -> tuple[float, str] | None:
    """(q, method) of the last lineage build, or None when none was built yet."""
    last = store.query("SELECT q, method FROM families ORDER BY built_at DESC LIMIT 1")
    return (last["q"][0], last["method"][0]) if last.height else None


def last_direction_level(store: Store) -> float | None:
    """The min_direction_confidence of the last lineage build (None before any build, or for a build from before the
    level was stored)."""
    last = store.query("SELECT min_direction_confidence FROM families ORDER BY built_at DESC LIMIT 1")
    return last["min_direction_confidence"][0] if last.height else None


def replace_lineage_tables(store: Store, frames: Mapping[str, pl.DataFrame]) -> None:
    """Replace every lineage table by its frame in one transaction: readers see the old lineage or the new one."""
    unknown = set(frames) - set(LINEAGE_TABLES)
    if unknown:
        raise ValueError(f"not lineage tables: {', '.join(sorted(unknown))}")
    with store.transaction() as con:
        for table, frame in frames.items():
            con.execute(f"DELETE FROM {table}")
            if frame.height:
                con.register("_lineage_frame", frame.to_arrow())
                columns = ", ".join(frame.columns)
                con.execute(f"INSERT INTO {table} ({columns}) SELECT {columns} FROM _lineage_frame")
                con.unregister("_lineage_frame")
