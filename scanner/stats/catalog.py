"""What each statistic hubtrace reports is robust to and what defeats it, one line each, as the tests measure it:
the evidence report prints them beside each statistic's value and p-value, so a reader of a dispute sees which
number can be moved by a copier and which cannot."""

from __future__ import annotations

from scanner.stats.weight_statistics import WEIGHT_STATISTIC_NOTES

ROBUSTNESS: dict[str, str] = {
    "match": "phi_MATCH survives T1-T6 camouflage (permutations, rotations, scalings), pruning, fine-tuning and MLP "
             "retraining (tests/test_power_and_validity.py); valid p-value under independence",
    "up": "phi_U is fooled by permuting hidden units or the residual stream",
    "hidden": "phi_H is fooled by permuting hidden units",
    "l2": "phi_l2 is fooled by any rotation of the residual stream; PERMTEST over permutations",
    "jsd": "phi_JSD has no null distribution (it is invariant to every output-preserving change): no p-value",
    **WEIGHT_STATISTIC_NOTES,
}
"""Statistic name (as ``--stat`` and ``pair_tests.statistic`` spell it) -> one line."""
