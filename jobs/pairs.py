"""Which pairs a scan tests, and a count of why the others are not tested. Pure: no Ray, no store.

Two fingerprints are comparable when they were taken on the same canonical input set (the same token ids, which
needs the same shared token range) and hold units of the same kind (gated or plain MLPs, read by a decoder or an
encoder); φ_MATCH itself works across widths and depths. Models are grouped by input set and kind, so counting the
incomparable pairs of a hub with thousands of models does not enumerate them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import combinations

from jobs.actors import PairJob
from scanner.store import PairKey


@dataclass(frozen=True)
class Candidate:
    """A model with a current fingerprint for this scan's input spec."""

    model_id: str
    revision: str
    input_set: str
    path: str
    declared_base_models: tuple[str, ...] = ()
    file_sha256: str | None = None
    kind: str = "gated, causal"  # "<mlp kind>, <attention>" (scanner.fingerprints.fingerprint's mlp_kind and attention)


@dataclass
class PairPlan:
    """Pairs to test now, and how many pairs fell into each category (for the run summary)."""

    jobs: list[PairJob] = field(default_factory=list)
    comparable: int = 0                  # comparable pairs among the candidates (tested before or not)
    declared: int = 0                    # pairs a card declares (model, its base), both scanned and comparable
    declared_incomparable: int = 0       # declared pairs on different input sets: not tested
    declared_base_not_scanned: int = 0   # a declared base that is not among the scanned models
    incomparable: Counter = field(default_factory=Counter)   # reason -> pairs
    already_tested: int = 0
    select: str = "all"                  # "candidates": only retrieved comparable pairs (plus declared ones)
    retrieved: int = 0                   # comparable pairs candidate retrieval chose (tested before or not)
    tested_before: int = 0               # comparable pairs with a current test from an earlier run

    @property
    def untested(self) -> int:
        """Comparable pairs that have no test and get none in this run (candidate retrieval did not choose them,
        or ``comparable: false``)."""
        return self.comparable - self.tested_before - len(self.jobs)

    def to_json_dict(self) -> dict:
        return {"to_test": len(self.jobs), "select": self.select, "possible": self.comparable,
                "retrieved": self.retrieved, "comparable": self.comparable, "declared": self.declared,
                "declared_incomparable": self.declared_incomparable,
                "declared_base_not_scanned": self.declared_base_not_scanned,
                "incomparable": dict(self.incomparable), "already_tested": self.already_tested,
                "untested_comparable": self.untested}


def incomparable_reason(a: tuple[str, str], b: tuple[str, str]) -> str | None:
    """Why two groups, each (input set, kind), are not compared; None when they are one group."""
    (input_set_a, kind_a), (input_set_b, kind_b) = a, b
    if input_set_a != input_set_b:
        return f"different canonical input sets ({input_set_a} vs {input_set_b}: token ranges differ)"
    if kind_a != kind_b:
        first, second = sorted((kind_a, kind_b))
        return f"different kinds of units ({first} vs {second} models)"
    return None


def _group(c: Candidate) -> tuple[str, str]:
    return c.input_set, c.kind


def plan_pairs(candidates: Iterable[Candidate], tested: set[PairKey], *, comparable: bool = True,
               declared: bool = True, retrieved: Mapping[PairKey, tuple[tuple[int, int], ...]] | None = None
               ) -> PairPlan:
    """All comparable pairs (if ``comparable``) plus each model with its declared bases (if ``declared``),
    minus the pairs ``tested`` already holds at these revisions; sorted so batches share fingerprints.

    ``retrieved`` (candidate retrieval's pairs, each with its block map) narrows the comparable pairs to those;
    declared pairs are tested whether retrieved or not. None tests every comparable pair."""
    by_id = {c.model_id: c for c in candidates}
    plan = PairPlan(select="all" if retrieved is None else "candidates")
    declared_pairs: set[tuple[str, str]] = set()
    for c in by_id.values():
        for base in c.declared_base_models:
            if base == c.model_id:
                continue
            if base not in by_id:
                plan.declared_base_not_scanned += 1
            elif incomparable_reason(_group(c), _group(by_id[base])) is None:
                declared_pairs.add((min(base, c.model_id), max(base, c.model_id)))
            else:
                plan.declared_incomparable += 1
    plan.declared = len(declared_pairs)

    groups: dict[tuple[str, str], list[Candidate]] = {}
    for c in sorted(by_id.values(), key=lambda c: c.model_id):
        groups.setdefault(_group(c), []).append(c)
    for (group_a, members_a), (group_b, members_b) in combinations(sorted(groups.items()), 2):
        plan.incomparable[incomparable_reason(group_a, group_b)] += len(members_a) * len(members_b)

    current = {(c.model_id, c.revision): c.input_set for c in by_id.values()}
    plan.tested_before = sum(1 for a, ra, b, rb in tested
                             if current.get((a, ra)) is not None and current.get((a, ra)) == current.get((b, rb)))
    for members in groups.values():
        plan.comparable += len(members) * (len(members) - 1) // 2
        for a, b in combinations(members, 2) if retrieved is None else _chosen(members, retrieved, declared_pairs):
            key = (a.model_id, a.revision, b.model_id, b.revision)
            is_declared = (a.model_id, b.model_id) in declared_pairs
            is_retrieved = retrieved is None or key in retrieved
            plan.retrieved += retrieved is not None and key in retrieved
            if not ((comparable and is_retrieved) or (declared and is_declared)):
                continue
            if key in tested:
                plan.already_tested += 1
                continue
            plan.jobs.append(PairJob(a.model_id, a.revision, a.path, b.model_id, b.revision, b.path, a.input_set,
                                     "declared_base" if declared and is_declared else "comparable",
                                     (retrieved or {}).get(key, ()), a.file_sha256, b.file_sha256))
    plan.jobs.sort(key=lambda j: (j.model_a, j.model_b))
    return plan


def _chosen(members: list[Candidate], retrieved: Mapping[PairKey, object],
            declared_pairs: set[tuple[str, str]]) -> list[tuple[Candidate, Candidate]]:
    """The retrieved and declared pairs among one input set's members (never all pairs: a hub has millions)."""
    current = {c.model_id: c for c in members}
    wanted = {(a, b) for a, ra, b, rb in retrieved
              if a in current and b in current and current[a].revision == ra and current[b].revision == rb}
    wanted |= {(a, b) for a, b in declared_pairs if a in current and b in current}
    return [(current[a], current[b]) for a, b in sorted(wanted)]


def batches(jobs: list[PairJob], size: int) -> list[list[PairJob]]:
    return [jobs[i:i + size] for i in range(0, len(jobs), size)]
