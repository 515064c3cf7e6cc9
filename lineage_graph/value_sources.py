"""Which family members are made of which others' weight values, and what that says of who derives from whom.

Training moves every weight, so bit-equal MLP weight values (scanner.stats.verbatim) between two float32 models mean
one holds the other's values where it left them unchanged: a sparse edit. TIES and DARE merges are such edits of their
base: they keep the base's values wherever every task vector was trimmed or dropped, and a TIES merge keeps a source's
values where that source alone was kept. Three patterns follow, read from the samples of one family's members:

* **direct**: m and n share values that no third member shares with m there (the share of two merges of one base,
  both equal to it where both kept it, is the base's, not theirs);
* **merge**: m shares values directly with two or more members that share none with each other, though a parent
  with those as sparse edits would have had them share about N s_x s_y values (s: their shares with m): m took values
  from each of them, as only a merge can (a TIES merge of its base and its sources);
* **parent**: m shares values directly with two or more members that share values with each other at that rate, and
  significantly: they are sparse edits of m, each keeping some of its values (the base of several TIES and DARE
  merges). Shares too small for either test (an SCE merge holds each source's values only where that source's change
  alone survived) say neither.

A DARE merge's sources keep no exact value in it (the drops rescale what is kept), but where one source alone was
kept the merge's change from its base is that source's, exactly scaled: m - b = c (x - b) to the rounding of float32,
which no other model's change is (**scaled source**). A sparse edit of b with scaled sources is their merge.

Dense merges keep no value of anyone, but mergekit's linear, SLERP, task-arithmetic and model-stock merges are, tensor
by tensor, fixed combinations of their models: a member whose every sampled matrix is reproduced to float32 rounding
by an average of others (weights in [0, 1] summing to about 1) is their merge (**average**); expressing one of them
back from the merge needs a weight outside [0, 1]. A task-arithmetic merge whose weights sum to more than 1 is no
average (its base gets a negative weight), and four models in such a relation (m + b = x + y) can be read with any
corner as the merge, so it is left to the other evidence.

Each finding is a strong direction vote and links the tree like a declaration (lineage_graph.phylogeny's ``copied``);
a direct pair whose direction none of these patterns gives is left to the other evidence. The absence of a finding
speaks too: every merge method leaves one of these signatures, so a member compared with its relatives that shows none
(**plain**) is no merge of them as made, whatever the distances suggest (a later checkpoint of one training run lies
on the line from its base through the earlier one, between them, as an average of the two would); a merge trained
further is plain too, which the tree allows for. Samples stored in bfloat16
or float16 are left out: such a checkpoint drops updates below its resolution, so its fine-tunes keep many of their
base's values and an equal value marks no sparse edit.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from lineage_graph.evidence import ModelInfo
from scanner.stats.verbatim import (
    Combination,
    coarse_format,
    exact_combination,
    log10_binomial_tail_bound,
    scaled_change_share,
    values_per_matrix,
    verbatim_share,
)

VERBATIM_LEVEL = -10.0
"""log10 p at or below which a share of equal values (or of exactly scaled changes) counts: ten orders below chance.
The family's pairs are far fewer than 10^8, so a Bonferroni bound keeps a false finding per family below 1%; the
merge zoos' findings sit at -60 to -2000, their dense pairs at 0."""
MERGE_DEFICIT = -6.0
"""log10 of the Poisson lower tail at or below which two direct partners of m share too few values for a parent's
sparse edits (expected N s_x s_y): m is their merge. TIES merges measure no shared value where about 70-280 were
expected (log10 far below -30); the base's sparse edits share about the expected number."""
AVERAGE_CANDIDATES = 32
"""A member is tried as an average of its this many nearest relatives (by closeness) at most, so the search costs a
bounded number of fits per member whatever the family's size. A merge's models need not be its nearest: a model-stock
merge of fine-tunes that drifted apart sits by its base, with a merged LoRA source 17th of its 24 relatives (merge
zoo 33); a larger family may hold a merge whose sources lie beyond, which is then left to the geometry."""
BEAM = 3
"""Candidates kept at each step of the search for an average's models: at most 3 + 9 + 27 sets per member, each
fitted on two matrices before the rest."""
MAX_MERGED = 4
"""Most models an average is looked for of (a model-stock merge of three fine-tunes averages them with its base)."""
EXACT_SHARE = 0.9
"""Share of a member's sampled values an average must reproduce to rounding: mergekit's merges measure 1.000."""
CONVEX_SHARE = 0.9
"""Share of matrices whose weights must make an average (Combination.convex_share): 1.00 for the merges measured, 0.00
for a merged model expressed back from its merge."""
MIN_MERGE_WEIGHT = 0.01
"""A fitted weight below this leaves its model out of the merge (a superset of the sources fits with zeros)."""


@dataclass(frozen=True)
class ValueSources:
    """What the weight values say: merges (m -> the members it is made of), parents (sparse edit -> the model it
    edits), a reason per (parent, child) link, and the entangled relations."""

    merges: dict[str, tuple[str, ...]] = field(default_factory=dict)
    parents: dict[str, str] = field(default_factory=dict)
    reasons: dict[tuple[str, str], str] = field(default_factory=dict)
    entangled: set[frozenset[str]] = field(default_factory=set)
    """Members in an exact relation no reading of which is an average (m + b = x + y: a task-arithmetic merge whose
    weights sum to more than 1, read with any corner as the merge): which is the merge is beyond the weights, and
    beyond the rank and the scale, which a merge moves as a parent would."""
    plain: set[str] = field(default_factory=set)
    """Members compared with two or more relatives (float32, one layout) that share no value bit for bit with any of
    them and are no exact combination of any: no merge of those relatives as made, by any method."""
    compared: dict[str, str] = field(default_factory=dict)
    """Member -> the layout its sample was compared under (float32 samples only)."""

    def entangled_pair(self, a: str, b: str) -> frozenset[str] | None:
        """The exact relation both a and b are in, if any."""
        return next((r for r in sorted(self.entangled, key=sorted) if a in r and b in r), None)

    def rules_out_merge(self, m: str, sources: Collection[str]) -> bool:
        """Whether the values say m is no merge of ``sources`` as made (it may be one trained further): m is plain and
        each source was compared with it."""
        return m in self.plain and all(self.compared.get(x) == self.compared[m] for x in sources)

    def links(self) -> dict[str, set[str]]:
        """Child -> the members it holds values of (one: a sparse edit; several: a merge of them)."""
        out = {c: {p} for c, p in self.parents.items()}
        for m, sources in self.merges.items():
            out[m] = set(sources)
        return out


def value_sources(members: Collection[str], models: Mapping[str, ModelInfo],
                  closeness: Mapping[tuple[str, str], float] | None = None) -> ValueSources:
    """The weight-value findings among ``members`` whose samples line up (one layout, float32); ``closeness``
    ((a, b) with a < b): the dependent pairs' closeness (a member is tried as an average of its relatives, starting
    from its nearest; no averages are looked for without it)."""
    samples = {m: np.frombuffer(models[m].mlp_values, dtype=np.float32) for m in sorted(members)
               if models[m].mlp_values and models[m].mlp_layout and len(models[m].mlp_values) % 4 == 0}
    # a sample is data from a fingerprint file: one with a value no model holds, or in a coarse format, says nothing
    samples = {m: s for m, s in samples.items() if np.isfinite(s).all() and not coarse_format(s)}
    found = ValueSources()
    for layout, size in sorted({(models[m].mlp_layout, len(s)) for m, s in samples.items()}):
        group = {m: s for m, s in samples.items() if models[m].mlp_layout == layout and len(s) == size}
        if len(group) >= 2:
            equal, rates = _equal_values(group)
            direct = _sparse_edits(group, equal, rates, found)
            _scaled_sources(group, equal, direct, values_per_matrix(layout), found)
            searched = _dense_merges(group, closeness or {}, values_per_matrix(layout), found)
            found.compared.update(dict.fromkeys(group, layout))
            related = {m for pair in equal for m in pair} | set(found.merges) | set().union(*found.entangled)
            found.plain.update(searched - related)
    return found


def _equal_values(samples: dict[str, np.ndarray]
                  ) -> tuple[dict[tuple[str, str], np.ndarray], dict[tuple[str, str], float]]:
    """(a, b) both ways -> where a and b hold the same non-zero value, for the pairs that share significantly many
    (scanner.stats.verbatim.verbatim_share, at VERBATIM_LEVEL), and each such pair's coincidence rate."""
    equal, rates = {}, {}
    for a, b in itertools.combinations(sorted(samples), 2):
        shared = verbatim_share(samples[a], samples[b])
        if _significant(shared.equal, shared.coincidence_rate, len(samples[a])):
            equal[(a, b)] = equal[(b, a)] = (samples[a] == samples[b]) & ((samples[a] != 0) | (samples[b] != 0))
            rates[(a, b)] = rates[(b, a)] = shared.coincidence_rate
    return equal, rates


def _sparse_edits(samples: dict[str, np.ndarray], equal: dict[tuple[str, str], np.ndarray],
                  rates: dict[tuple[str, str], float], found: ValueSources) -> list[tuple[str, str]]:
    """The merge and parent patterns of the module docstring, from the pairs that share values directly; returns
    those pairs (a < b)."""
    ids = sorted(samples)
    size = len(next(iter(samples.values())))
    direct: dict[str, list[str]] = {m: [] for m in ids}
    for a, b in itertools.combinations(ids, 2):
        if (a, b) not in equal:
            continue
        own = equal[(a, b)].copy()
        for o in ids:
            if o not in (a, b) and (a, o) in equal:
                own &= ~equal[(a, o)]
        if _significant(int(own.sum()), rates[(a, b)], size):
            direct[a].append(b)
            direct[b].append(a)
    for m in ids:
        partners = direct[m]
        if len(partners) < 2:
            continue
        share = {x: float(equal[(m, x)].mean()) for x in partners}
        deficits = [_deficit(int(equal[(x, y)].sum()) if (x, y) in equal else 0, size * share[x] * share[y])
                    for x, y in itertools.combinations(partners, 2)]
        if all(d <= MERGE_DEFICIT for d in deficits):
            found.merges[m] = tuple(partners)
            for x in partners:
                found.reasons[(x, m)] = (
                    f"verbatim values: {m} holds {share[x]:.1%} of {x}'s sampled MLP weight values bit for bit, and "
                    f"values of {', '.join(p for p in partners if p != x)} that {x} does not share: it took values "
                    "from each, as a merge does")
        elif all(d > MERGE_DEFICIT for d in deficits) and all(
                (x, y) in equal for x, y in itertools.combinations(partners, 2)):
            # they share values with each other too, significantly: not merely too few expected to tell
            for x in partners:
                found.parents.setdefault(x, m)
                found.reasons.setdefault((m, x), (
                    f"verbatim values: {x} holds {share[x]:.1%} of {m}'s sampled MLP weight values bit for bit, "
                    f"as its other sparse edits ({', '.join(p for p in partners if p != x)}) do, sharing them "
                    "where each kept them: a sparse edit of it (a TIES or DARE merge keeps its base's values)"))
    for m in found.merges:
        found.parents.pop(m, None)
    return [(a, b) for a in ids for b in direct[a] if a < b]


def _scaled_sources(samples: dict[str, np.ndarray], equal: dict[tuple[str, str], np.ndarray],
                    direct: list[tuple[str, str]], per_matrix: int, found: ValueSources) -> None:
    """A sparse edit m of b whose changes are, where they can be, other members' changes from b exactly scaled: the
    merge of b and them (a DARE merge, whose sources keep no exact value in it). Tried for each sparse edit of the
    parent pattern over its parent, both ways round for a directly sharing pair no pattern oriented (a lone DARE
    merge and its base), and for each merge of the merge pattern over each of its sources (a DARE merge that holds
    one source's values exactly, where its rescaling happened to be 1). The members tried as sources share no value
    with m, b or m's sources: a sparse edit of the same base would match m's changes wherever both kept the base."""
    ids = sorted(samples)
    oriented = {(b, m) for m, b in found.parents.items()}
    tries = sorted(oriented) + [pair for a, b in direct if (a, b) not in oriented and (b, a) not in oriented
                                and a not in found.merges and b not in found.merges for pair in ((a, b), (b, a))]
    tries += [(b, m) for m, sources in sorted(found.merges.items()) for b in sources]
    for b, m in tries:
        if b not in samples or m not in samples or found.parents.get(b) == m or (
                m not in found.merges and b in found.merges):
            continue
        involved = {m, b, *found.merges.get(m, ())}
        dense = [x for x in ids if x not in involved and not any((x, o) in equal for o in involved)]
        scaled = {x: shared.share for x in dense
                  if (shared := scaled_change_share(samples[m], samples[b], samples[x], per_matrix)).log10_p
                  <= VERBATIM_LEVEL}
        if not scaled:
            continue
        found.merges[m] = tuple(dict.fromkeys((*found.merges.get(m, ()), b, *sorted(scaled))))
        found.parents.pop(m, None)
        for x, share in scaled.items():
            found.reasons[(x, m)] = (
                f"verbatim values: where {m} differs from {b}, {share:.1%} of its sampled changes are {x}'s change "
                f"from {b}, exactly scaled (to float32 rounding): {x}'s task vector entered {m}, a merge on {b}")
        found.reasons.setdefault((b, m), (
            f"verbatim values: {m} holds {b}'s sampled MLP weight values bit for bit where it did not take another "
            f"member's change, scaled: a merge on {b}"))


def _dense_merges(samples: dict[str, np.ndarray], closeness: Mapping[tuple[str, str], float], per_matrix: int,
                  found: ValueSources) -> set[str]:
    """A member whose values are, matrix by matrix, an average of two to MAX_MERGED others (weights in [0, 1] summing
    to about 1, reproduced to float32 rounding): their merge. Expressing one of the merged models back from the merge
    needs a weight outside [0, 1], so only the merge is an average. The others are searched for from m's nearest
    relative (by closeness), adding at each step one of the BEAM members whose change from it best matches what the
    chosen ones leave of m's; weights below MIN_MERGE_WEIGHT leave their model out (a base that a task-arithmetic merge
    weighs 0). An exact combination that no member's reading makes an average is kept as ``entangled``. Returns the
    members searched (those with two or more relatives)."""
    ids = sorted(samples)
    relations: set[frozenset[str]] = set()
    searched = set()
    for m in ids:
        near = sorted((x for x in ids if x != m and _key(m, x) in closeness),
                      key=lambda x: (-closeness[_key(m, x)], x))[:AVERAGE_CANDIDATES]
        if m in found.merges or len(near) < 2:
            continue
        searched.add(m)
        beam = [[near[0]]]
        for _ in range(min(MAX_MERGED, len(near)) - 1):
            grown = {frozenset((*chosen, x)): [*chosen, x] for chosen in beam
                     for x in _best_next(samples, m, chosen, [x for x in near if x not in chosen])}
            beam = [grown[key] for key in sorted(grown, key=sorted)]
            fits = [(chosen, fit) for chosen in beam if (fit := _exact_fit(samples, m, chosen, per_matrix))]
            averages = [(chosen, fit) for chosen, fit in fits if fit.convex_share() >= CONVEX_SHARE]
            if averages:
                _record_average(found, m, *max(averages, key=lambda f: (f[1].share, sorted(f[0]))))
            elif fits:
                chosen, fit = fits[0]
                weights = dict(zip(chosen, np.abs(fit.weights).mean(axis=0), strict=True))
                relations.add(frozenset((m, *(x for x in chosen if weights[x] >= MIN_MERGE_WEIGHT))))
            if fits:
                break
    read = {frozenset((m, *sources)) for m, sources in found.merges.items()}
    found.entangled.update(r for r in relations if r not in read and len(r) >= 3)
    return searched


def _exact_fit(samples: dict[str, np.ndarray], m: str, chosen: list[str], per_matrix: int) -> Combination | None:
    """The fit of m as a combination of the chosen, when it reproduces m (exact and significant); the first two
    matrices are fitted first, so a set that does not costs two small fits, not one per matrix."""
    head = 2 * per_matrix if per_matrix else len(samples[m])
    if exact_combination(samples[m][:head], [samples[x][:head] for x in chosen], per_matrix).share < EXACT_SHARE:
        return None
    fit = exact_combination(samples[m], [samples[x] for x in chosen], per_matrix)
    return fit if fit.log10_p <= VERBATIM_LEVEL and fit.share >= EXACT_SHARE else None


def _best_next(samples: dict[str, np.ndarray], m: str, chosen: list[str], others: list[str]) -> list[str]:
    """The BEAM members whose changes from the first chosen one are most aligned with what a least-squares fit on the
    chosen ones leaves of m's change from it (another merge of m's sources may align better than a source)."""
    base = samples[chosen[0]].astype(np.float64)
    target = samples[m] - base
    design = np.stack([samples[x] - base for x in chosen[1:]], axis=1) if len(chosen) > 1 else None
    residual = target if design is None else target - design @ np.linalg.lstsq(design, target, rcond=None)[0]

    def alignment(x: str) -> float:
        change = samples[x] - base
        norm = float(np.linalg.norm(change) * np.linalg.norm(residual))
        return abs(float(change @ residual)) / norm if norm else 0.0

    return sorted(others, key=lambda x: (-alignment(x), x))[:BEAM]


def _record_average(found: ValueSources, m: str, chosen: list[str], fit: Combination) -> None:
    weights = dict(zip(chosen, fit.weights.mean(axis=0), strict=True))
    sources = tuple(x for x in chosen if weights[x] >= MIN_MERGE_WEIGHT)
    if len(sources) < 2:
        return
    found.merges[m] = sources
    found.parents.pop(m, None)
    for x in sources:
        found.reasons[(x, m)] = (
            f"exact average: {fit.share:.0%} of {m}'s sampled MLP weight values are, matrix by matrix, "
            f"{' + '.join(f'{weights[y]:.2f} {y}' for y in sources)} (mean weights) to float32 rounding, as a linear, "
            "SLERP, task-arithmetic or model-stock merge of them is; none of them is such an average of the others")


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _significant(count: int, rate: float, size: int) -> bool:
    """Whether ``count`` equal values of ``size`` are beyond the pair's coincidence rate at VERBATIM_LEVEL."""
    return log10_binomial_tail_bound(count, size, rate) <= VERBATIM_LEVEL


def _deficit(observed: int, expected: float) -> float:
    """log10 of the Poisson probability of at most ``observed`` when ``expected`` are expected."""
    if expected <= 0 or observed >= expected:
        return 0.0
    terms = [k * math.log(expected) - expected - math.lgamma(k + 1) for k in range(observed + 1)]
    top = max(terms)
    return (top + math.log(sum(math.exp(t - top) for t in terms))) / math.log(10)
