"""One investigator's SQL statement, run only if it reads.

A read-only DuckDB connection still runs statements that write files (``COPY ... TO``, ``EXPORT DATABASE``) or
change the session, and ``EXPLAIN ANALYZE`` executes the statement it explains. So the statement is classified by
DuckDB's own parser and tokenizer, never by matching strings: exactly one statement, a query (SELECT, and what
parses as one: WITH, FROM-first, VALUES, DESCRIBE, SHOW, SUMMARIZE) or a plain EXPLAIN of a query.

A query can still call functions that act: ``enable_logging(storage_path := ...)`` and ``enable_profiling`` change
the engine (one call once aborted `hubtrace serve` on its next request), ``checkpoint()`` writes, ``query('...')``
runs SQL no parser here saw, ``arrow_scan`` reads a memory address. So every function the statement calls is read
off DuckDB's own parse tree (``json_serialize_sql``) and checked against DuckDB's catalogue (``duckdb_functions()``):
a table function runs only when it is listed here as one that reads (`READING_TABLE_FUNCTIONS`; those that read
local files, `FILE_TABLE_FUNCTIONS`, only with ``--allow-local-files``), a scalar function that DuckDB marks as
having side effects only when it is listed as harmless (`HARMLESS_SIDE_EFFECTS`), and a function the database
itself defines (a macro) never. Whatever a new DuckDB release adds is refused until someone lists it here
(tests/test_sql_box.py holds every function of the catalogue against these lists).

The store's reader connection (`Store(..., read_only=True)`) adds the other walls: no file but the database is
reachable, and the engine's settings are locked, so no statement can change them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb

from scanner.errors import one_line
from scanner.store.store import StoreError

ALLOWED = "SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of one of these"
_EXECUTING_EXPLAIN = {"analyze", "analyse"}

READING_TABLE_FUNCTIONS = frozenset({
    # the catalogue, settings and state of this engine, read
    "duckdb_approx_database_count", "duckdb_available_metrics", "duckdb_columns", "duckdb_connection_count",
    "duckdb_constraints", "duckdb_coordinate_systems", "duckdb_databases", "duckdb_dependencies", "duckdb_dialects",
    "duckdb_eviction_queues", "duckdb_extension_repositories", "duckdb_extensions", "duckdb_external_file_cache",
    "duckdb_external_resource_types", "duckdb_external_resources", "duckdb_functions", "duckdb_grammar_extensions",
    "duckdb_indexes", "duckdb_keywords", "duckdb_live_query_metrics", "duckdb_log_contexts", "duckdb_logs",
    "duckdb_logs_parsed", "duckdb_memory", "duckdb_optimizers", "duckdb_prepared_statements",
    "duckdb_profiling_settings", "duckdb_schemas", "duckdb_secret_type_parameters", "duckdb_secret_types",
    "duckdb_sequences", "duckdb_settings", "duckdb_table_sample", "duckdb_tables", "duckdb_temporary_files",
    "duckdb_triggers", "duckdb_types", "duckdb_variables", "duckdb_views", "icu_calendar_names", "pg_timezone_names",
    "pragma_collations", "pragma_database_size", "pragma_metadata_info", "pragma_platform", "pragma_show",
    "pragma_storage_info", "pragma_table_info", "pragma_user_agent", "pragma_version",
    # rows computed from their arguments, or read from the database's own tables
    "generate_series", "histogram", "histogram_values", "json_each", "json_tree", "query_table", "range", "repeat",
    "repeat_row", "seq_scan", "summary", "test_all_types", "test_vector_types", "unnest",
})
"""Table functions that only read the database or compute rows: a query may call them."""

FILE_TABLE_FUNCTIONS = frozenset({
    "glob", "parquet_bloom_probe", "parquet_file_metadata", "parquet_full_metadata", "parquet_kv_metadata",
    "parquet_metadata", "parquet_page_index", "parquet_scan", "parquet_schema", "read_blob", "read_csv",
    "read_csv_auto", "read_duckdb", "read_json", "read_json_auto", "read_json_objects", "read_json_objects_auto",
    "read_ndjson", "read_ndjson_auto", "read_ndjson_objects", "read_parquet", "read_single_csv_file",
    "read_single_json_file", "read_single_parquet_file", "read_text", "sniff_csv",
})
"""Table functions that read local files: only on a connection that may (``hubtrace query --allow-local-files``)."""

REFUSED_TABLE_FUNCTIONS = {
    "enable_logging": "changes the engine (logging, to a file of its choosing)",
    "disable_logging": "changes the engine (logging)",
    "truncate_duckdb_logs": "changes the engine (its log)",
    "enable_profiling": "changes the engine (profiling, to a file of its choosing)",
    "disable_profiling": "changes the engine (profiling)",
    "checkpoint": "writes the database",
    "force_checkpoint": "writes the database",
    "add_grammar_extension": "changes the engine (its parser)",
    "remove_grammar_extension": "changes the engine (its parser)",
    "create_external_resource": "changes the engine (external resources)",
    "register_external_resource": "changes the engine (external resources)",
    "register_external_resource_type": "changes the engine (external resources)",
    "deregister_external_resource": "changes the engine (external resources)",
    "destroy_external_resource": "changes the engine (external resources)",
    "query": "runs SQL given as text, which no check here has seen",
    "json_execute_serialized_sql": "runs SQL given as a serialized plan, which no check here has seen",
    "arrow_scan": "reads the memory of the process at an address given",
    "arrow_scan_dumb": "reads the memory of the process at an address given",
    "python_arrow_scan": "reads objects of the Python process",
    "pandas_scan": "reads objects of the Python process",
    "python_map_function": "runs Python code of the process",
    "duckdb_secrets": "lists the engine's credentials",
    "which_secret": "looks up the engine's credentials",
}
"""Table functions a query may not call, each with why (the others DuckDB has: listed above, or refused as
unknown)."""

HARMLESS_SIDE_EFFECTS = frozenset({
    "current_connection_id", "current_query", "current_query_id", "current_transaction_id", "currval", "error",
    "gen_random_uuid", "random", "sleep_ms", "stats", "uuid", "uuidv4", "uuidv7", "vector_type",
})
"""Scalar functions DuckDB marks as having side effects whose effect stays inside the one query (a random number,
an id, an error raised, a pause the query time limit ends): a query may call them. The others it marks (``setseed``
changes the session's random numbers, ``nextval`` and ``setval`` write sequences, ``write_log`` writes the log)
are refused, and so is any a new release adds."""


def check_read_only(connection: duckdb.DuckDBPyConnection, sql: str, *, local_files: bool = False) -> None:
    """Raise StoreError naming the statement type unless sql is one reading statement, or naming the function
    unless every function it calls only reads (``local_files``: table functions that read local files too)."""
    statements = connection.extract_statements(sql)
    if len(statements) != 1:
        raise StoreError(f"give exactly one SQL statement; got {len(statements)}")
    kind = _kind(statements[0])
    if kind == duckdb.StatementType.SELECT:
        _check_functions(connection, sql, local_files)
        return
    if kind != duckdb.StatementType.EXPLAIN:
        raise StoreError(f"{kind.name} refused: hubtrace query only reads ({ALLOWED}); the database is written by "
                         f"scans alone")
    inner = _explained(sql)
    inner_statements = connection.extract_statements(inner) if inner is not None else []
    if inner is None or len(inner_statements) != 1 or _kind(inner_statements[0]) != duckdb.StatementType.SELECT:
        raise StoreError(f"this EXPLAIN refused: EXPLAIN ANALYZE runs the statement it explains, and hubtrace query "
                         f"explains only queries ({ALLOWED})")
    _check_functions(connection, inner, local_files)


def _kind(statement: Any) -> duckdb.StatementType:
    """The statement's type; one DuckDB's Python enum does not name (UPDATE EXTENSIONS is type 29, and reading it
    raises ValueError) is refused as what it is: not a query."""
    try:
        return statement.type
    except ValueError as exc:
        raise StoreError(f"this statement refused: DuckDB parses it as a kind of statement hubtrace does not know "
                         f"({one_line(exc)}); hubtrace query only reads ({ALLOWED})") from exc


def _check_functions(connection: duckdb.DuckDBPyConnection, sql: str, local_files: bool) -> None:
    """Refuse the first function ``sql`` calls that may act (the module's docstring says which may run)."""
    (serialized,), = connection.execute("SELECT json_serialize_sql(?)", [sql]).fetchall()
    try:
        tree = json.loads(serialized)
        if tree.get("error"):
            raise StoreError(f"this statement refused: its functions cannot be checked ({tree.get('error_message')}); "
                             "write it as a plain SELECT (a PIVOT with an IN list, or GROUP BY)")
        built_in = built_in_functions(connection)
        calls = list(_calls(tree["statements"]))
    except RecursionError as exc:  # the parse tree is deeper than Python reads: nobody writes such SQL by hand
        raise StoreError("this statement refused: it nests expressions or queries too deeply for its functions to be "
                         "checked; write it with fewer levels (a CTE for each)") from exc
    for name, as_table in calls:
        why = _refusal(name, as_table, built_in, local_files)
        if why is not None:
            raise StoreError(f"{name}() refused: {why}")


def _refusal(name: str, as_table: bool, built_in: dict[tuple[str, bool], bool], local_files: bool) -> str | None:
    """Why a call of ``name`` may not run here (None: it may)."""
    if (name, True) not in built_in and (name, False) not in built_in:
        return "it is not a function DuckDB itself defines (the database or an extension does)"
    if not as_table:  # (unnest, say, is listed as a table function and called in a select list too)
        return None if not built_in.get((name, False)) or name in HARMLESS_SIDE_EFFECTS else (
            "DuckDB marks it as acting beyond the query, and queries here only read")
    if name in FILE_TABLE_FUNCTIONS:
        return None if local_files else ("it reads local files, and this connection reads nothing but the database "
                                         "(hubtrace query --allow-local-files allows it; the web app never does)")
    if name in READING_TABLE_FUNCTIONS:
        return None
    return f"it {REFUSED_TABLE_FUNCTIONS.get(name, 'is not one hubtrace knows to only read')}; queries here only read"


def _calls(node: Any, table: bool = False) -> Iterator[tuple[str, bool]]:
    """(lowercase name, called as a table function) of every function call in a serialized statement tree."""
    if isinstance(node, list):
        for item in node:
            yield from _calls(item)
    elif isinstance(node, dict):
        if node.get("type") == "TABLE_FUNCTION" and isinstance(node.get("function"), dict):
            yield from _calls(node["function"], table=True)
            yield from _calls({k: v for k, v in node.items() if k != "function"})
            return
        if node.get("class") in ("FUNCTION", "WINDOW") and isinstance(node.get("function_name"), str):
            yield node["function_name"].lower(), table
        for key, value in node.items():
            if key != "function_name":
                yield from _calls(value)


def built_in_functions(connection: duckdb.DuckDBPyConnection) -> dict[tuple[str, bool], bool]:
    """(lowercase name, a table function) -> whether DuckDB marks any overload as having side effects, for every
    function DuckDB itself defines: listed once per process (the catalogue takes ~60 ms to list), since they are
    the release's."""
    functions = _BUILT_IN.get(duckdb.__version__)
    if functions is None:
        functions = {}
        for name, kind, side_effects in connection.execute(
                "SELECT lower(function_name), function_type, coalesce(has_side_effects, false) "
                "FROM duckdb_functions() WHERE internal").fetchall():
            key = (name, kind in ("table", "table_macro"))
            functions[key] = functions.get(key, False) or side_effects
        _BUILT_IN[duckdb.__version__] = functions
    return functions


_BUILT_IN: dict[str, dict[tuple[str, bool], bool]] = {}


def _explained(sql: str) -> str | None:
    """The statement after ``EXPLAIN`` and its options, or None when an option asks to execute it (ANALYZE)."""
    tokens = [(pos, kind) for pos, kind in duckdb.tokenize(sql) if kind != duckdb.token_type.comment]
    words = [(pos, sql[pos:next_pos].strip(), kind) for (pos, kind), (next_pos, _) in
             zip(tokens, [*tokens[1:], (len(sql), None)])]
    depth = 0
    for index, (pos, text, kind) in enumerate(words):
        if index == 0:
            continue  # EXPLAIN itself
        lowered = text.lower().rstrip(",;")
        if lowered.strip("()") in _EXECUTING_EXPLAIN or any(w in _EXECUTING_EXPLAIN for w in lowered.split()):
            return None
        if text.startswith("("):
            depth += 1
        if depth == 0 and kind == duckdb.token_type.keyword:
            return sql[pos:]
        if text.endswith(")"):
            depth = max(0, depth - 1)
    return None
