"""The scan database (DuckDB): models, fingerprints, pair tests, runs and errors, written by one scan at a time
and read by investigators as polars frames. The only part of hubtrace that writes SQL."""

from scanner.store.schema import LATEST_VERSION, MIGRATIONS, Migration
from scanner.store.store import CandidateRow, LastError, PairKey, PairTestRow, Store, StoreError, StoreLockedError

__all__ = ["CandidateRow", "LATEST_VERSION", "LastError", "MIGRATIONS", "Migration", "PairKey", "PairTestRow", "Store",
           "StoreError", "StoreLockedError"]
