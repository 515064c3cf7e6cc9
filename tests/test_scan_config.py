"""The scan's pure parts: YAML config validation and its messages, overrides, the pair plan, the pool shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.config import ConfigError, ScanConfig, load_config
from jobs.pairs import Candidate, plan_pairs
from jobs.pool import NoGpuError, pool_shape

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_configs_load(name):
    assert load_config(REPO / "configs" / name).sources


def test_config_errors_name_the_file_the_key_path_and_what_is_allowed(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - kind: hub\n    limitt: 3\n  - kind: ftp\nstatistic: up\nray: {actor: 2}\n"
                   "pairs: {sequential: {screen_block: 2}, matching: optimal}\n")
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    message = str(info.value)
    assert str(bad) in message
    assert "sources[0].limitt: unknown key; allowed here:" in message and "limit, search" in message
    assert "sources[1]: unknown source kind; allowed: local, hf_cache, hub" in message
    assert "statistic: Input should be 'match' or 'hidden'" in message
    assert "ray.actor: unknown key" in message and "actors" in message
    # inside a section that may also be null
    assert "pairs.sequential.screen_block: unknown key; allowed here: screen_blocks, stop_above_log10_p" in message
    assert "pairs.matching: Input should be 'screened', 'greedy' or 'exact'" in message


def test_pairs_map_threshold_is_a_cosine_up_to_the_collision_threshold(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sources: [{kind: local, path: models}]\npairs: {map_threshold: 0.45}\n")
    assert load_config(path).pairs.map_threshold == 0.45
    for bad in ("0.7", "0", "high"):
        path.write_text(f"sources: [{{kind: local, path: models}}]\npairs: {{map_threshold: {bad}}}\n")
        with pytest.raises(ConfigError, match="pairs.map_threshold"):
            load_config(path)


def test_config_rejects_non_mappings_and_broken_yaml(tmp_path):
    for text, expected in (
        ("- a\n- b\n", "must be a mapping"), ("sources: [\n", "not valid YAML"), ("{}", "sources: required")
    ):
        path = tmp_path / "c.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=expected):
            load_config(path)


def test_overrides_replace_sources_db_and_output():
    config = load_config(REPO / "configs" / "nightly-hub.yaml").with_overrides(
        local=Path("/models"), db=Path("/tmp/x.duckdb"), output_dir=Path("/tmp/out"))
    assert [(s.kind, s.path) for s in config.sources] == [("local", Path("/models"))]
    assert config.db_path == Path("/tmp/x.duckdb") and config.fingerprint_location == "/tmp/out/fingerprints"
    defaulted = ScanConfig.model_validate({"sources": [{"kind": "hf_cache"}], "output_dir": "o"})
    assert defaulted.db_path == Path("o/hubtrace.duckdb")


def _c(model_id: str, input_set: str = "v1-seed0-4x64-ids<256", bases: tuple[str, ...] = (),
       kind: str = "gated, causal") -> Candidate:
    return Candidate(model_id, "r", input_set, f"/fp/{model_id}", bases, kind=kind)


def test_pairs_are_planned_within_one_kind_of_units():
    """An encoder is never paired with a decoder, nor a plain MLP with a gated one: such pairs are counted as
    incomparable with the reason, and a declared base of another kind is not tested either."""
    candidates = [_c("o/llama"), _c("o/lora", bases=("o/llama",)), _c("o/bert", kind="plain, bidirectional"),
                  _c("o/bert-ft", bases=("o/bert",), kind="plain, bidirectional"),
                  _c("o/modernbert", kind="gated, bidirectional"),
                  _c("o/gpt2", bases=("o/llama",), kind="plain, causal")]
    plan = plan_pairs(candidates, tested=set())
    assert {(j.model_a, j.model_b) for j in plan.jobs} == {("o/llama", "o/lora"), ("o/bert", "o/bert-ft")}
    assert plan.comparable == 2 and plan.declared == 2 and plan.declared_incomparable == 1
    assert plan.incomparable == {
        "different kinds of units (gated, bidirectional vs plain, bidirectional models)": 2,
        "different kinds of units (gated, causal vs plain, bidirectional models)": 4,
        "different kinds of units (gated, bidirectional vs gated, causal models)": 2,
        "different kinds of units (gated, causal vs plain, causal models)": 2,
        "different kinds of units (plain, bidirectional vs plain, causal models)": 2,
        "different kinds of units (gated, bidirectional vs plain, causal models)": 1,
    }


def test_pair_plan_counts_comparable_declared_incomparable_and_tested():
    candidates = [_c("o/a"), _c("o/b", bases=("o/a",)), _c("o/c", bases=("o/x",)), _c("o/d"),
                  _c("o/big", "v1-seed0-4x64-ids<32000", bases=("o/a",))]
    plan = plan_pairs(candidates, tested={("o/a", "r", "o/d", "r")})
    assert plan.comparable == 6 and plan.already_tested == 1 and len(plan.jobs) == 5
    assert plan.declared == 1 and plan.declared_incomparable == 1 and plan.declared_base_not_scanned == 1
    assert sum(plan.incomparable.values()) == 4 and "token ranges differ" in next(iter(plan.incomparable))
    assert {(j.model_a, j.model_b, j.reason) for j in plan.jobs if j.reason == "declared_base"} == {
        ("o/a", "o/b", "declared_base")
    }
    assert all(j.model_a < j.model_b for j in plan.jobs)
    declared_only = plan_pairs(candidates, tested=set(), comparable=False)
    assert [(j.model_a, j.model_b) for j in declared_only.jobs] == [("o/a", "o/b")]


def test_pool_asks_for_gpus_only_when_the_cluster_has_them():
    config = ScanConfig.model_validate({"sources": [{"kind": "hf_cache"}]})
    cpu = pool_shape(config, {"CPU": 8.0})
    assert (cpu.actors, cpu.num_gpus, cpu.num_cpus, cpu.max_in_flight) == (8, 0.0, 1.0, 16)
    gpu = pool_shape(config, {"CPU": 16.0, "GPU": 4.0})
    assert (gpu.actors, gpu.num_gpus, gpu.num_cpus, gpu.device) == (4, 1.0, 1.0, "gpu")
    forced_cpu = config.model_copy(update={"devices": config.devices.model_copy(update={"mode": "cpu"})})
    assert pool_shape(forced_cpu, {"CPU": 4.0, "GPU": 4.0}).num_gpus == 0.0
    needs_gpu = config.model_copy(update={"devices": config.devices.model_copy(update={"mode": "gpu"})})
    with pytest.raises(NoGpuError):
        pool_shape(needs_gpu, {"CPU": 4.0})


def test_a_local_folder_without_a_config_gets_the_local_folder_yaml(tmp_path: Path) -> None:
    """`hubtrace scan --local DIR` alone scans exactly as configs/local-folder.yaml with --local DIR."""
    from jobs.config import local_folder_config

    written = load_config(REPO / "configs" / "local-folder.yaml").with_overrides(local=tmp_path)
    assert local_folder_config(tmp_path) == written


def test_every_source_kind_of_scanner_sources_has_a_config() -> None:
    from jobs.config import SOURCE_CONFIGS
    from scanner.sources import SOURCE_KINDS

    assert tuple(SOURCE_CONFIGS) == SOURCE_KINDS
