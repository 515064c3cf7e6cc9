"""The weight fingerprints of public disputes (scanner.stats.weight_statistics), each with the null it can have.

Fixed seeds throughout. Validity: KS against uniform at alpha = 0.01 over at least 100 independent pairs (1% false
failures for an exactly valid test; the seeds are fixed). The claims the robustness notes make are measured on the
zoo here, so a note cannot say more than a test shows.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re

import numpy as np
import pytest
import torch
from scipy import stats

from scanner.errors import UnsupportedArchitectureError
from scanner.pairs.compare import compare_models
from scanner.reading.architectures.families import adapter_for
from scanner.reading.checkpoint import open_checkpoint
from scanner.reading.weight_profiles import weight_profile
from scanner.stats.registry import weight_statistic
from scanner.stats.verbatim import log10_binomial_tail_bound, sample_positions, verbatim_share
from scanner.stats.weight_statistics import (
    MIN_NULL_PAIRS,
    Shape,
    WeightProfile,
    layernorm_cosine,
    layernorm_permtest,
    leave_out_log10_p,
    pair_kind,
    profile_correlation,
    verbatim_test,
)
from scanner.zoo import Zoo

ALPHA = 0.01
BASES = ("aurora-labs/aurora-base", "tundra-research/tundra-64", "cobalt-ai/cobalt-base", "deepfield/deepfield-wide",
         "ember-ml/ember-small")


def _profile(path) -> WeightProfile:
    return weight_profile(adapter_for(open_checkpoint(path)))


@pytest.fixture(scope="module")
def profiles(zoo: Zoo, independent_zoo: Zoo) -> dict[str, WeightProfile]:
    """Every zoo model's profile, and the 12 independently trained bases' (17 independent models in all)."""
    out = {m: _profile(zoo[m].path) for m in zoo.ids}
    out |= {f"independent/{m}": _profile(independent_zoo[m].path) for m in independent_zoo.ids}
    return out


def _independent(profiles: dict[str, WeightProfile]) -> list[str]:
    return [*BASES, *(m for m in profiles if m.startswith("independent/"))]


@pytest.mark.slow
def test_layernorm_permtest_is_uniform_for_independent_models() -> None:
    """150 pairs of models whose norm weights are drawn independently, each dimension alike (what training from
    all-ones gains does under a null that permutes the residual stream): PERMTEST's p-values are uniform."""
    rng = np.random.default_rng(21)
    ps = []
    for _ in range(150):
        a, b = (1.0 + 0.1 * rng.standard_normal((4, 2, 64)) for _ in range(2))
        ps.append(10 ** layernorm_permtest(a, b, permutations=999, seed=int(rng.integers(1 << 30))).log10_p)
    assert stats.kstest(ps, "uniform").pvalue >= ALPHA


def _kind(profile: WeightProfile) -> Shape:
    return ("llama", profile.attn_std.shape[0], profile.norms.shape[-1])


def test_empirical_null_p_values_are_uniform_over_independent_trained_models(profiles) -> None:
    """The 136 pairs of the zoo's 17 independent bases: each pair against the others of its kind that share no model
    with it (leave_out_log10_p, as a scan computes them) gives uniform p-values for attn-std and for ghostspec over
    the 120 pairs of the 16 four-block bases; the 16 pairs of the three-block deepfield-wide with a four-block base
    have no null of their kind once deepfield's own pairs are left out, so no p-value."""
    models = _independent(profiles)
    assert len(models) == 17
    for field in ("attn_std", "ghostspec"):
        pairs = [(a, b, profile_correlation(getattr(profiles[a], field), getattr(profiles[b], field)),
                  pair_kind(_kind(profiles[a]), _kind(profiles[b]))) for a, b in itertools.combinations(models, 2)]
        answers = leave_out_log10_p(pairs, pairs)
        same = [answer for answer, pair in zip(answers, pairs, strict=True) if pair[3][0] == pair[3][1]]
        ps = [10 ** p for p, _ in same]
        assert len(ps) == 120 and stats.kstest(ps, "uniform").pvalue >= ALPHA, field
        assert {size for _, size in same} == {91}  # the pairs of the other 14 four-block bases: p >= 1/92, as noted
        assert {answer for answer, pair in zip(answers, pairs, strict=True) if pair[3][0] != pair[3][1]} == {(None, 0)}


def test_an_empirical_null_reads_only_pairs_of_the_tested_pairs_kind_and_needs_enough_of_them() -> None:
    """Independent pairs of another kind (lower values, as models of other depths or types give) never enter a
    pair's null: against its own kind's 40 pairs a value of 0.9 is unremarkable (p = 21/41), where the mixed null
    would have called it dependent (p = 21/121). Below MIN_NULL_PAIRS pairs of its kind, no p-value."""
    small, large = pair_kind(("llama", 4, 64), ("llama", 4, 64)), pair_kind(("llama", 32, 4096), ("qwen2", 28, 3584))
    null = [(f"s{k}", f"t{k}", 0.85 + 0.1 * (k % 2), small) for k in range(40)]
    null += [(f"u{k}", f"v{k}", 0.1, large) for k in range(80)]
    [(own, size)] = leave_out_log10_p([("a", "b", 0.9, small)], null)
    [(mixed, _)] = leave_out_log10_p([("a", "b", 0.9, small)], [(a, b, v, small) for a, b, v, _ in null])
    assert size == 40 and own == pytest.approx(np.log10(21 / 41)) and mixed == pytest.approx(np.log10(21 / 121))
    few = leave_out_log10_p([("a", "b", 0.9, small)], null[: MIN_NULL_PAIRS - 1])
    assert few == [(None, MIN_NULL_PAIRS - 1)]
    note = weight_statistic("attn-std", *(WeightProfile(np.ones((4, 1, 8)), np.ones((4, 4)), np.ones((4, 2)))
                                          for _ in range(2)), null=[0.5] * (MIN_NULL_PAIRS - 1), kind=small).null
    assert note == (f"no p-value: the empirical null holds {MIN_NULL_PAIRS - 1} independent pairs of llama, 4 blocks "
                    f"of width 64, fewer than {MIN_NULL_PAIRS} (no p-value could reach 0.05)")


def test_the_verbatim_share_is_valid_where_coincidences_are_common() -> None:
    """300 pairs of independent samples of 3072 values rounded to bfloat16 (about 1 in 1000 values of one equals
    the other's by chance, where float32 weights almost never do): p <= 0.01 for at most 8 of them. An exact test
    would exceed 8 with probability 0.004; the Chernoff bound is conservative, so this fails less often. A sparse
    edit of one of them, 10% of its values kept, is found at log10 p below -100."""
    rng = np.random.default_rng(5)
    bf16 = lambda x: torch.from_numpy(x).to(torch.bfloat16).float().numpy()  # noqa: E731
    small, coincident = [], 0
    for _ in range(300):
        a, b = (bf16(0.02 * rng.standard_normal(3072).astype(np.float32)) for _ in range(2))
        shared = verbatim_share(a, b)
        coincident += shared.coincident
        small.append(shared.log10_p <= np.log10(ALPHA))
    assert sum(small) <= 8
    assert coincident >= 300  # the null sees the coarse format: about 1 in 1000 values coincide
    edit = np.where(rng.random(3072) < 0.1, a, a + 0.001 * rng.standard_normal(3072).astype(np.float32))
    assert verbatim_share(a, edit).log10_p < -100 and verbatim_share(a, edit).share == pytest.approx(0.1, abs=0.02)
    assert log10_binomial_tail_bound(3, 1000, 0.01) == 0.0  # below the expected count: no evidence
    assert np.array_equal(sample_positions((64, 128), 342), sample_positions((64, 128), 342))
    assert not np.array_equal(sample_positions((64, 128), 342), sample_positions((128, 64), 342))
    assert np.array_equal(sample_positions((4, 4), 342), np.arange(16))  # a small matrix is read whole


def test_the_verbatim_note_says_what_the_zoo_shows(profiles) -> None:
    """Dense derivatives and camouflaged copies share no sampled value with their source (the bound's p is 1), and
    models of another MLP shape get no value at all, with the reason; nor does a profile recorded without a sample."""
    base = profiles["aurora-labs/aurora-base"]
    for model, source in (("finch-nlp/aurora-chat", "aurora-labs/aurora-base"),
                          ("nimbus/nimbus-1", "finch-nlp/aurora-chat"), ("pylon/pylon-base", "cobalt-ai/cobalt-base"),
                          ("orchid/cobalt-instruct", "cobalt-ai/cobalt-base")):
        result = verbatim_test(profiles[source], profiles[model])
        assert result.value < 0.001 and result.log10_p == 0.0, model
    narrower = verbatim_test(base, profiles["kestrel/aurora-lite"])
    assert narrower.log10_p is None and "differ in shape" in narrower.null
    unsampled = dataclasses.replace(base, mlp_values=np.zeros(0, np.float32), mlp_layout="")
    assert verbatim_test(base, unsampled).log10_p is None
    assert verbatim_test(base, base).value == 1.0 and verbatim_test(base, base).log10_p < -1000


def test_two_independent_bases_have_a_layernorm_cosine_of_099_and_an_unremarkable_p_value(zoo: Zoo) -> None:
    """The slides' rebuttal, in miniature: norm weights start at 1.0, so unrelated models score ~0.99."""
    result = compare_models(zoo["aurora-labs/aurora-base"].path, zoo["tundra-research/tundra-64"].path, "layernorm")
    assert result.value >= 0.9 and result.log10_p > np.log10(ALPHA)


def test_the_robustness_notes_say_what_the_zoo_shows(profiles) -> None:
    base, chat = profiles["aurora-labs/aurora-base"], profiles["finch-nlp/aurora-chat"]
    layernorm = {m: weight_statistic("layernorm", base, profiles[m], permutations=999)
                 for m in ("finch-nlp/aurora-chat", "kestrel/aurora-lite", "lumen/aurora-slim")}
    assert all(r.log10_p <= np.log10(ALPHA) for r in layernorm.values())  # survives fine-tune and prunes
    assert weight_statistic("layernorm", chat, profiles["meridian/aurora-remix"]).log10_p <= np.log10(ALPHA)
    narrower = dataclasses.replace(chat, norms=chat.norms[..., : chat.norms.shape[-1] // 2])
    refused = weight_statistic("layernorm", base, narrower)  # other widths: no p-value and why, not an exception
    assert refused.log10_p is None and "do not line up" in refused.null
    for copy, source in (("nimbus/nimbus-1", "finch-nlp/aurora-chat"), ("pylon/pylon-base", "cobalt-ai/cobalt-base")):
        assert abs(layernorm_cosine(profiles[source].norms, profiles[copy].norms)) < 0.2  # defeated by T1-T6
        for field in ("attn_std", "ghostspec"):  # these survive it
            assert profile_correlation(getattr(profiles[source], field), getattr(profiles[copy], field)) >= 0.97
    independent = [(a, b) for a, b in itertools.combinations(_independent(profiles), 2)]
    for field, top in (("attn_std", 0.997), ("ghostspec", 0.998)):
        values = [profile_correlation(getattr(profiles[a], field), getattr(profiles[b], field)) for a, b in independent]
        tuned = profile_correlation(getattr(base, field), getattr(chat, field))
        assert max(values) >= tuned >= 0.99 and abs(max(values) - top) < 0.003, field  # as the notes say


def test_without_a_null_the_invariant_fingerprints_give_no_p_value_and_say_why(zoo: Zoo) -> None:
    base, chat = zoo["aurora-labs/aurora-base"].path, zoo["finch-nlp/aurora-chat"].path
    result = compare_models(base, chat, "ghostspec")
    assert result.log10_p is None and result.value > 0.99
    assert any("no empirical null was given" in n for n in result.notes)
    kind = pair_kind(("llama", 4, 64), ("llama", 4, 64))
    with_null = compare_models(base, chat, "ghostspec", null={kind: [0.5] * 99})
    assert with_null.log10_p == pytest.approx(-2.0)  # above all 99 null values: 1 / 100
    assert "empirical null of 99 independent pairs of llama, 4 blocks of width 64" in with_null.notes[0]
    other_kind = compare_models(base, chat, "ghostspec", null={pair_kind(("llama", 3, 64), kind[0]): [0.5] * 99})
    assert other_kind.log10_p is None and "holds 0 independent pairs of llama, 4 blocks" in other_kind.notes[0]


def test_a_family_without_known_attention_roles_is_refused_with_the_reason(tmp_path) -> None:
    """GPT-2 is read as a module tree (fused c_attn): no q/k/v/o by role, so no weight fingerprint, said plainly."""
    from transformers import AutoModelForCausalLM

    from scanner.reading.architectures.tiny import tiny_config

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(tiny_config("gpt2")).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedArchitectureError, match="read as a module tree"):
        compare_models(tmp_path / "gpt2", tmp_path / "gpt2", "attn-std")


@pytest.fixture(scope="module")
def scanned(zoo: Zoo, independent_zoo: Zoo, local_ray, tmp_path_factory: pytest.TempPathFactory):
    """A real scan (local Ray, DuckDB) of nine zoo models and three independent bases with every weight fingerprint
    recorded: eleven four-block models, whose 49 independent pairs leave at least 30 to each pair's null (19 needed),
    and the three-block deepfield-wide, whose pairs have none."""
    from jobs.scan_job import run_scan
    from tests.scan_support import copy_models, scan_config

    models = (*BASES, "finch-nlp/aurora-chat", "nimbus/nimbus-1", "orchid/cobalt-instruct", "pylon/pylon-base")
    extra = tuple(independent_zoo.ids[:3])
    root = tmp_path_factory.mktemp("extra")
    copy_models(zoo, models, root / "hub")
    copy_models(independent_zoo, extra, root / "hub")
    config = scan_config(root / "hub", root / "out",
                         pairs={"extra_stats": ["layernorm", "attn-std", "ghostspec", "verbatim"]})
    return config, run_scan(config), (*models, *extra), root / "hub"


def test_a_scan_records_each_weight_fingerprint_beside_phi_match_and_draws_no_family_from_them(scanned) -> None:
    """Every pair gets every weight fingerprint's value; layernorm a p-value from its permutations, attn-std and
    ghostspec one from this hub's independent pairs of the pair's kind where there are enough of them (the pairs of
    two four-block models), and none, with the reason, where there are not (deepfield-wide's)."""
    from tests.scan_support import query

    config, summary, models, _ = scanned
    pairs = len(models) * (len(models) - 1) // 2
    rows = query(config.db_path, "SELECT statistic, count(*) AS n, count(log10_p) AS with_p, "
                                 "count(value) AS with_value FROM current_pair_tests GROUP BY statistic")
    counts = {r["statistic"]: r for r in rows.iter_rows(named=True)}
    assert counts["match"]["n"] == pairs and summary.weight_statistics == 4 * pairs
    assert counts["layernorm"]["n"] == counts["layernorm"]["with_value"] == counts["layernorm"]["with_p"] == pairs
    deepfield = len(models) - 1
    for name in ("attn-std", "ghostspec"):
        assert counts[name]["n"] == counts[name]["with_value"] == pairs, name
        assert counts[name]["with_p"] == pairs - deepfield, name
    # verbatim: a p-value wherever the MLP shapes line up, and none of these dense or camouflaged pairs shares a value
    assert counts["verbatim"]["n"] == pairs and counts["verbatim"]["with_p"] == pairs - deepfield
    verbatim = query(config.db_path, "SELECT log10_p FROM current_pair_tests WHERE statistic = 'verbatim'")
    assert set(verbatim["log10_p"].drop_nulls()) == {0.0}
    assert set(query(config.db_path, "SELECT DISTINCT statistic FROM lineage_edges")["statistic"]) == {"match"}
    notes = query(config.db_path, "SELECT model_a, model_b, log10_p, notes FROM current_pair_tests "
                                  "WHERE statistic = 'ghostspec'")
    for row in notes.iter_rows(named=True):
        if "deepfield/deepfield-wide" in (row["model_a"], row["model_b"]):
            assert row["log10_p"] is None and re.fullmatch(
                r"no p-value: 0 of this hub's pairs of llama \(3 blocks of width 64\) with llama \(4 blocks of width "
                r"64\) have phi_MATCH p > 0.05 and neither of this pair's models, fewer than the 19 an empirical null "
                r"needs", row["notes"][0]), row
        else:
            size = re.fullmatch(r"empirical null: (\d+) of this hub's pairs of llama, 4 blocks of width 64 whose "
                                r"phi_MATCH p > 0.05, none with either of this pair's models \(p cannot go below "
                                r"1/(\d+)\)", row["notes"][0])
            assert size and int(size[1]) >= 19 and int(size[2]) == int(size[1]) + 1, row


def test_the_command_line_borrows_a_scans_null_without_the_pairs_of_the_models_under_test(scanned) -> None:
    """`hubtrace test --null-db`: the scan's independent pairs of the pair's kind less those of a model it scanned
    from the same folder, so the p-value agrees with the one the scan stored; a statistic with a null of its own
    refuses the option."""
    from typer.testing import CliRunner

    from jobs.cli import EXIT_REFUSED, app
    from scanner.store import Store, queries

    config, _, _, hub = scanned
    base, copy = hub / "cobalt-ai/cobalt-base", hub / "pylon/pylon-base"
    result = CliRunner().invoke(app, ["test", str(base), str(copy), "--stat", "attn-std", "--null-db",
                                      str(config.db_path), "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    with Store(config.db_path, read_only=True) as store:
        stored = queries.pair_tests_between(store, "cobalt-ai/cobalt-base", "pylon/pylon-base")
        null = queries.empirical_null(store, "attn-std")
    row = stored.filter(stored["statistic"] == "attn-std").row(0, named=True)
    kind = pair_kind(("llama", 4, 64), ("llama", 4, 64))
    kept = [n for n in null if not {n[0], n[1]} & {"cobalt-ai/cobalt-base", "pylon/pylon-base"} and n[3] == kind]
    assert printed["value"] == pytest.approx(row["value"]) and printed["log10_p"] == pytest.approx(row["log10_p"])
    assert f"empirical null of {len(kept)} independent pairs of llama, 4 blocks of width 64" in printed["notes"][0]
    assert MIN_NULL_PAIRS <= len(kept) < len(null)
    refused = CliRunner().invoke(app, ["test", str(base), str(copy), "--null-db", str(config.db_path)])
    assert refused.exit_code == EXIT_REFUSED and "--null-db is for --stat attn-std or ghostspec" in refused.output
