"""The issue's acceptance tests for the statistics on real checkpoints: valid under independence, powerful otherwise.

Everything goes through ``compare_models``, the function behind ``hubtrace test``, on zoo models written to disk,
except the calibration of phi_MATCH and phi_H over the 66 independent pairs: there each base is fingerprinted once
(as ``compare_models`` fingerprints it) and the pairs compared from those fingerprints, which a test below checks
gives exactly ``compare_models``' p-values. All models and inputs are seeded, so each test is deterministic; the
stated false-failure rates are what the thresholds would give over fresh seeds.
"""

from __future__ import annotations

import pytest
from scipy.stats import kstest

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.pairs.compare import compare_models
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.stats.logp import log10_fisher
from scanner.zoo import Zoo

#: alpha of each KS test: a false-failure rate of 0.1% per statistic if the p-values were exactly uniform and the
#: 66 pairs independent (they share models, which widens the spread of the KS distance a little).
KS_ALPHA = 1e-3


@pytest.fixture(scope="module")
def independent_prints(independent_zoo: Zoo) -> dict[str, Fingerprint]:
    """Each base fingerprinted once, as compare_models fingerprints it for phi_MATCH and phi_H (default inputs on the
    shared id range, which is every base's own: they share one vocabulary), instead of twice per pair (132 times)."""
    return {m: fingerprint_model(independent_zoo[m].path) for m in independent_zoo.ids}


def _log10_p(zoo: Zoo, prints: dict[str, Fingerprint], a: str, b: str, statistic: str) -> float:
    """phi_U reads weights, no fingerprint: through compare_models; the activation statistics from the prints."""
    if statistic == "up":
        return compare_models(zoo[a].path, zoo[b].path, statistic).log10_p
    return compare_fingerprints(prints[a], prints[b], statistic).log10_p


@pytest.mark.parametrize("statistic", ["hidden", "match"])
def test_pairs_from_the_prints_give_compare_models_p_values(independent_zoo: Zoo, independent_prints,
                                                            statistic: str) -> None:
    a, b = independent_zoo.pairs(dependent=False)[-1]  # deterministic: one pair shows the two routes are one
    assert _log10_p(independent_zoo, independent_prints, a, b, statistic) == compare_models(
        independent_zoo[a].path, independent_zoo[b].path, statistic).log10_p


@pytest.mark.parametrize("statistic", ["up", "hidden", "match"])
def test_pvalues_of_independent_pairs_are_uniform(independent_zoo: Zoo, independent_prints, statistic: str) -> None:
    """phi_U and phi_H: uniform (two-sided KS). phi_MATCH as reported is valid but conservative by construction (the
    smallest of three view pairs' p-values times three, version 4; the screened matching rule, whose unrelated
    blocks keep the greedy p-value), so it is held to validity: never smaller than uniform (one-sided KS)."""
    pairs = independent_zoo.pairs(dependent=False)
    assert len(pairs) >= 50
    log10_ps = [_log10_p(independent_zoo, independent_prints, a, b, statistic) for a, b in pairs]
    p_values = [10.0**x for x in log10_ps]
    ks = kstest(p_values, "uniform", alternative="greater" if statistic == "match" else "two-sided")
    assert ks.pvalue > KS_ALPHA, (
        f"{statistic}: KS D={ks.statistic:.3f}, p={ks.pvalue:.2g}; min log10 p {min(log10_ps):.1f}"
    )


def test_phi_match_finds_every_dependent_pair_of_the_zoo(zoo: Zoo) -> None:
    """Camouflaged, pruned and healed, merged, retrained-MLP and long fine-tune pairs included; siblings too."""
    results = {(a, b): compare_models(zoo[a].path, zoo[b].path, "match") for a, b in zoo.pairs(dependent=True)}
    relations = {zoo[m].relation for pair in results for m in pair}
    assert {"camouflage", "prune_depth", "prune_width", "merge", "retrained_mlp", "finetune"} <= relations
    # A direct derivation at a copy's standard; a farther relative (the long fine-tune against a fine-tune of a
    # fine-tune, both far from their base) far below any level that joins a family: measured -20 here, -15 and -18
    # on rebuilds under other CPU kernels (-38 with phi_MATCH version 1, docs/statistics.md "What it cost").
    direct = {(p, m.id) for m in zoo.models.values() for p in m.parents}
    weak = {pair: round(r.log10_p, 1) for pair, r in results.items()
            if r.log10_p > (-20 if pair in direct or pair[::-1] in direct else -10)}
    assert not weak


def test_phi_match_does_not_confuse_same_data_twins(zoo: Zoo) -> None:
    """Same data, same shape, different seed: independent, so no rejection (a 1% false-failure rate by design)."""
    twin = next(m for m in zoo.models.values() if m.details.get("twin_of"))
    result = compare_models(zoo[twin.details["twin_of"]].path, twin.path, "match")
    assert result.log10_p > -2


def test_retrained_blocks_alone_still_reject(zoo: Zoo) -> None:
    """Paper 4.2.1: only the re-initialised, distilled MLPs, aggregated, against the parent at alpha = 0.01."""
    (remix,) = zoo.with_relation("retrained_mlp")
    result = compare_models(zoo[remix.parents[0]].path, remix.path, "match")
    retrained = remix.details["retrain"]["blocks"]
    assert log10_fisher([result.layers[i].log10_p for i in retrained]) <= -2


def test_phi_u_detects_plain_fine_tunes_and_is_fooled_by_camouflage(zoo: Zoo) -> None:
    for model in zoo.with_relation("finetune"):
        assert compare_models(zoo[model.parents[0]].path, model.path, "up").log10_p <= -20, model.id
    camouflaged = zoo.with_relation("camouflage")
    assert camouflaged
    for model in camouflaged:
        up = compare_models(zoo[model.parents[0]].path, model.path, "up")
        assert up.log10_p > -2, f"{model.id}: phi_U should be fooled by the permutation, got {up.log10_p:.1f}"
        assert compare_models(zoo[model.parents[0]].path, model.path, "match").log10_p <= -20
