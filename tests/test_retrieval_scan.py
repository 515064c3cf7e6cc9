"""A scan with ``pairs.select: candidates`` (the default) on real Ray and a real DuckDB file: the dependent pairs
are tested, the independent twin is not, declared pairs always are; reruns query nothing; a lost index is rebuilt
from the fingerprints; ``hubtrace query --similar`` lists neighbours without testing."""

from __future__ import annotations

import json
import shutil
from itertools import combinations

import pytest
from typer.testing import CliRunner

from jobs.cli import app
from jobs.scan_job import run_scan
from scanner.retrieval.hub import index_folder
from tests.scan_support import SUBSET, copy_models, query, scan_config


@pytest.fixture(scope="module")
def candidate_scan(zoo, local_ray, tmp_path_factory):
    root = copy_models(zoo, SUBSET, tmp_path_factory.mktemp("hub"))
    config = scan_config(root, tmp_path_factory.mktemp("out"), pairs={"batch_size": 4, "select": "candidates"})
    assert config.pairs.select == "candidates"
    return config, run_scan(config)


def test_candidates_test_every_dependent_pair_and_declared_pair_but_not_the_twin(candidate_scan, zoo) -> None:
    config, summary = candidate_scan
    tested = {(a, b) for a, b in query(config.db_path, "SELECT model_a, model_b FROM current_pair_tests").iter_rows()}
    dependent = {tuple(sorted(p)) for p in combinations(SUBSET, 2) if zoo.dependent(*p)}
    assert dependent <= tested
    declared = {("aurora-labs/aurora-base", "ember-ml/ember-small"),
                ("aurora-labs/aurora-base", "finch-nlp/aurora-chat")}
    assert declared <= tested
    assert not any("tundra-research/tundra-64" in pair for pair in tested), "the independent twin was tested"
    pairs = summary.to_json_dict()["pairs"]
    # candidates: the dependent pairs plus ember's declared (false) base, which a card puts there
    assert pairs["possible"] == 15 and pairs["retrieved"] == len(dependent) + 1 and pairs["to_test"] == len(tested)
    rows = query(config.db_path, "SELECT model_a, model_b, score, rank, source, block_map FROM candidate_pairs")
    sources = {(a, b): s for a, b, _, _, s, _ in rows.iter_rows()}
    assert sources[("aurora-labs/aurora-base", "ember-ml/ember-small")] == "declared_base"
    assert all(sources[p] in ("retrieval", "family") for p in dependent)
    lite = rows.filter((rows["model_a"] == "aurora-labs/aurora-base") & (rows["model_b"] == "kestrel/aurora-lite"))
    assert json.loads(lite["block_map"][0]) == [[0, 0], [1, 1], [3, 2]]
    notes = query(config.db_path, "SELECT notes FROM current_pair_tests WHERE model_b = 'kestrel/aurora-lite' "
                                  "AND model_a = 'aurora-labs/aurora-base'")["notes"][0]
    assert any("candidate retrieval maps" in n for n in notes)
    # every scanned revision's tensor hashes are in the store: shared tensors are found by a join, not by reading
    stored = query(config.db_path, "SELECT model_id, count(*) AS n FROM model_tensors GROUP BY model_id")
    assert set(stored["model_id"]) == set(SUBSET) and min(stored["n"]) > 1


def test_a_rerun_queries_nothing_and_a_lost_index_is_rebuilt(candidate_scan) -> None:
    config, first = candidate_scan
    again = run_scan(config)
    assert again.retrieval["queried"] == 0 and again.pairs_tested == 0
    shutil.rmtree(index_folder(config.db_path))
    rebuilt = run_scan(config)
    assert rebuilt.retrieval["queried"] == len(SUBSET) and rebuilt.pairs_tested == 0
    assert rebuilt.retrieval["candidates"] == first.retrieval["candidates"]


def test_query_similar_lists_neighbours_by_score_without_testing(candidate_scan) -> None:
    config, _ = candidate_scan
    result = CliRunner().invoke(app, ["query", "--db", str(config.db_path), "--similar", "kestrel/aurora-lite",
                                      "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert rows[0]["model_id"] == "aurora-labs/aurora-base" and rows[0]["score"] >= 4
    assert "tundra-research/tundra-64" not in {r["model_id"] for r in rows if r["score"] >= 4}
    missing = CliRunner().invoke(app, ["query", "--db", str(config.db_path), "--similar", "no/such-model"])
    assert missing.exit_code == 2 and "hubtrace: error:" in missing.output
