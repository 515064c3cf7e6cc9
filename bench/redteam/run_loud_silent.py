"""Silent units of enormous size (tests/fixtures/silent_units.py) that move the dead-unit bar's median, on every kind.
A comparison that raises (MoE: every expert left with no units, expert pairing on NaN similarities) is recorded as a
row with its error."""

import copy

from bench.redteam.harness import _record, case, evaluate, kinds_from_argv
from tests.adversary_support import probe_ids
from tests.fixtures import adversary as adv
from tests.fixtures.silent_units import loud_silent_units

ALL = ["gated", "plain-relu", "plain-gelu", "moe-softmax", "moe-dense-first", "moe-interleaved", "hybrid"]


def attempt(label: str, kind: str, disguise: adv.Disguise) -> None:
    try:
        evaluate(label, kind, disguise)
    except Exception as exc:  # the disguise or the comparison failed: no verdict at all
        row = {"disguise": label, "kind": kind, "error": f"{type(exc).__name__}: {exc}"}
        try:
            original = case(kind)[0]
            changed = adv.apply(disguise, copy.deepcopy(original), 7)
            row["max_logit_change"] = float(f"{adv.max_logit_change(original, changed, probe_ids(original)):.3g}")
        except Exception as again:  # the disguised model does not run: not a case
            row["disguise_error"] = f"{type(again).__name__}: {again}"
        row["exact"] = row.get("max_logit_change", 1.0) <= 1e-4
        row.update(claim_holds=False, breaks_claim=row["exact"])
        _record(row)


for kind in kinds_from_argv(ALL):
    attempt("3h silent units of size 1e8 x the median unit", kind, loud_silent_units(3.0, 1e8))
    attempt("1.2h silent units of size 1e7 x the median unit, then permute+rotate", kind,
            adv.compose(loud_silent_units(1.2, 1e7), adv.permute_units, adv.rotate_residual))
