"""The version of each pair statistic a stored test was made with. A scan re-tests a pair whose stored test an
earlier version made (scanner.store: ``pair_tests.statistic_version``), so a database never mixes a changed
statistic's p-values with the ones it replaced."""

from __future__ import annotations

STATISTIC_VERSIONS: dict[str, int] = {"match": 8}
"""match 8 (2026-11-29): the units a MoE block pools and the weights of its expert pairing read what each unit adds
to the whole block (routed experts weighed by their routing, units of every MLP that put out one function summed
exactly: scanner.reading.activations.block_contributions), from fingerprints of format 9.
match 7 (2026-11-29): a MoE block is also tested on all its MLPs' units pooled (at most 4,096, those that add most
to its output), its p-value the smaller of that and its experts' times two (scanner.stats.pooled_units); the experts
are paired with B's units weighed by what they add (scanner.stats.experts).
match 6 (2026-11-29): read from fingerprints of format 5, whose canonical units and plain sign-free views differ
from format 4's on some models (scanner.fingerprints.fingerprint.FINGERPRINT_FORMAT); the statistic is unchanged, but
a test made on format-4 fingerprints is made again on the new ones.
match 5: a plain MLP whose activation has act(z) - act(-z) = z (fingerprint format 4) is matched in four views, and
a block's p-value is the smaller of two pairs' times two: its first and second views as stored, and its first view
turned to a positive mean with its write view free of the units' signs (scanner.stats.independence, VIEW_PAIRS).
match 4 (2026-11-28): a gated MLP whose fingerprint holds what each unit writes (format 3) is matched by a third
view, the write, and a block's p-value is the smallest of its three view pairs' times three (scanner.stats.independence,
views_log10_p); fingerprints without a write view, and plain MLPs, are tested as in version 3.
match 3 (2026-11-28): units are matched by the greedy matching, and again by the maximum-weight assignment where
that finds a block related (scanner.stats.matching, ``screened``), where versions 1 and 2 took the maximum-weight
assignment everywhere; a scan run with another ``pairs.matching`` notes it in each test's notes.
match 2 (2026-11-26): the up view is matched less its projection on each unit's own gate view (scanner.stats.views);
version 1 matched it as stored. A statistic not listed is at version 1."""


def statistic_version(statistic: str) -> int:
    """The version of ``statistic`` this hubtrace computes."""
    return STATISTIC_VERSIONS.get(statistic, 1)
