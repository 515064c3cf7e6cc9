"""The registry of statistics (scanner.stats.registry) is the one list of them: the docs' table, the pair tests'
dispatch, the CLI, a scan's config and the pair worker all follow it. Deterministic: no statistic is computed."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import get_args

import numpy as np
import pytest
from pydantic import ValidationError

from jobs.cli.compare import STAT_HELP
from jobs.config import PairsConfig, ScanConfig
from scanner.pairs.compare import TESTS_BY_READS
from scanner.pairs.fingerprint_compare import BLOCK_TESTS, fingerprint_statistic
from scanner.pairs.results import LayerResult, PairTestResult
from scanner.pairs.worker import PairWorker
from scanner.stats import registry
from scanner.stats.independence import BlockTest, PermTestResult
from scanner.stats.registry import (
    EMPIRICAL_NULL_STATISTICS,
    FINGERPRINT_READS,
    FINGERPRINT_STATISTICS,
    STATISTIC_NAMES,
    STATISTICS,
    WEIGHT_STATISTICS,
    Reads,
)
from scanner.stats.result import StatisticResult
from scanner.stats.verbatim import VerbatimShare
from scanner.stats.weight_statistics import WeightStatistic

DOCS = Path(__file__).resolve().parent.parent / "docs" / "statistics.md"


def docs_table() -> list[list[str]]:
    """The rows of docs/statistics.md's table of statistics (the one headed by `--stat`), cells stripped."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| `--stat` |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_the_docs_table_lists_exactly_the_registry_with_the_same_reads_null_and_validity() -> None:
    expected = [[f"`{s.name}`", s.symbol, s.reads, s.computed, s.null, s.validity] for s in STATISTICS]
    assert docs_table() == expected


def test_every_statistic_is_named_once_and_computed_by_a_function_of_scanner_stats() -> None:
    assert len(set(STATISTIC_NAMES)) == len(STATISTICS)
    for entry in STATISTICS:
        function = entry.compute.resolve()
        assert callable(function) and inspect.getmodule(function).__name__ == f"scanner.stats.{entry.compute.module}"
        assert entry.robustness and registry.robustness(entry.name) == entry.robustness


def test_a_p_value_is_claimed_only_where_a_null_gives_one() -> None:
    for entry in STATISTICS:
        assert (entry.null == "none") == (entry.validity == "no p-value"), entry.name
        assert (entry.null == "empirical null") == (entry.validity == "empirical p-value"), entry.name
        assert entry.validity == "no p-value" or "no p-value" not in (entry.caveat or ""), entry.name
    assert EMPIRICAL_NULL_STATISTICS == ("attn-std", "ghostspec")


def test_every_kind_of_input_a_statistic_reads_has_the_stage_that_gathers_it() -> None:
    assert set(TESTS_BY_READS) == set(get_args(Reads)) >= {entry.reads for entry in STATISTICS}
    assert set(BLOCK_TESTS) == set(FINGERPRINT_READS)
    assert FINGERPRINT_STATISTICS == tuple(s.name for s in STATISTICS if s.reads in FINGERPRINT_READS)


def test_the_cli_the_scan_config_and_the_pair_worker_take_the_registry_s_names() -> None:
    assert all(re.search(rf"\b{re.escape(name)} \({s.validity}\)", STAT_HELP)
               for name, s in zip(STATISTIC_NAMES, STATISTICS))
    sources = [{"kind": "local", "path": "."}]
    for name in STATISTIC_NAMES:
        if name in FINGERPRINT_STATISTICS:
            assert ScanConfig(sources=sources, statistic=name).statistic == name
            assert fingerprint_statistic(name).name == name
            assert PairWorker("cpu", statistic=name).statistic == name
        else:
            with pytest.raises(ValidationError):
                ScanConfig(sources=sources, statistic=name)
            with pytest.raises(ValueError, match="cannot be computed from fingerprints"):
                PairWorker("cpu", statistic=name)
    assert PairsConfig(extra_stats=list(WEIGHT_STATISTICS)).extra_stats == list(WEIGHT_STATISTICS)
    with pytest.raises(ValidationError):
        PairsConfig(extra_stats=["match"])


def test_an_unknown_name_is_refused_with_the_registry_s_choices() -> None:
    with pytest.raises(ValueError, match="choose one of " + ", ".join(STATISTIC_NAMES)):
        registry.statistic("cosine")
    with pytest.raises(ValueError, match="choose one of " + ", ".join(WEIGHT_STATISTICS)):
        registry.weight_statistic("match", None, None)
    assert registry.robustness("a statistic of another version") == ""


def test_every_result_type_names_its_raw_value_and_log10_p_alike() -> None:
    results = [
        (BlockTest(rho=0.5, log10_p=-1.0, n_units=8), (0.5, -1.0)),
        (PermTestResult(observed=-3.0, null_values=np.zeros(9), log10_p=-1.0), (-3.0, -1.0)),
        (VerbatimShare(equal=1, compared=4, coincident=0, null_compared=4, log10_p=-2.0), (0.25, -2.0)),
        (WeightStatistic(0.99, None, "no p-value: no null"), (0.99, None)),
        (LayerResult(0, 0, -4.0, rho=0.7), (0.7, -4.0)),
        (PairTestResult("a", "b", "jsd", None, [], 4, None, value=0.1), (0.1, None)),
    ]
    for result, (value, log10_p) in results:
        assert isinstance(result, StatisticResult), type(result)
        assert (result.value, result.log10_p) == (value, log10_p), type(result)
