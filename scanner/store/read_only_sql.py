"""One investigator's SQL statement, run only if it reads.

A read-only DuckDB connection still runs statements that write files (``COPY ... TO``, ``EXPORT DATABASE``) or
change the session, and ``EXPLAIN ANALYZE`` executes the statement it explains. So the statement is classified by
DuckDB's own parser and tokenizer, never by matching strings: exactly one statement, a query (SELECT, and what
parses as one: WITH, FROM-first, VALUES, DESCRIBE, SHOW, SUMMARIZE) or a plain EXPLAIN of a query. The store's
reader connection (`Store(..., read_only=True)`) adds a second wall: no file but the database is reachable.
"""

from __future__ import annotations

import duckdb

from scanner.store.store import StoreError

ALLOWED = "SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, or EXPLAIN of one of these"
_EXECUTING_EXPLAIN = {"analyze", "analyse"}


def check_read_only(connection: duckdb.DuckDBPyConnection, sql: str) -> None:
    """Raise StoreError naming the statement type unless sql is one reading statement."""
    statements = connection.extract_statements(sql)
    if len(statements) != 1:
        raise StoreError(f"give exactly one SQL statement; got {len(statements)}")
    kind = statements[0].type
    if kind == duckdb.StatementType.SELECT:
        return
    if kind != duckdb.StatementType.EXPLAIN:
        raise StoreError(f"{kind.name} refused: hubtrace query only reads ({ALLOWED}); the database is written by "
                         f"scans alone")
    inner = _explained(sql)
    inner_statements = connection.extract_statements(inner) if inner is not None else []
    if inner is None or len(inner_statements) != 1 or inner_statements[0].type != duckdb.StatementType.SELECT:
        raise StoreError(f"this EXPLAIN refused: EXPLAIN ANALYZE runs the statement it explains, and hubtrace query "
                         f"explains only queries ({ALLOWED})")


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
