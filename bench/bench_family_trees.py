"""Family trees with cards and dates withheld, on the zoos the rules were fitted on and on held-out zoos no rule was
fitted on: placement (who is linked to whom), directions drawn right, wrong and left undecided, and a reliability
table of the direction confidence per bin.

    PYTHONPATH=. python bench/bench_family_trees.py               # every zoo and SmolLM2 (about 2 CPU-minutes a zoo)
    PYTHONPATH=. python bench/bench_family_trees.py --no-real     # without the SmolLM2 family
    PYTHONPATH=. python bench/bench_family_trees.py --ablations   # also each evidence source removed, per set

Three groups. **Fitted**: the zoos the direction rules, their reliabilities and the placement and merge margins were
set on (the default zoo, seed 0; the small zoos of seeds 1-3; the fine-tune chain of seed 0). **Held-out**: zoos no
rule was fitted on, where the default level of lineage.min_direction_confidence was chosen: the held-out recipe
(scanner.zoo.held_out: chains of 3-5 fine-tunes, siblings, a retrained MLP of a fine-tune, prunes of fine-tunes,
depth up-scaling, merges of siblings and of a parent with its child, a distilled student) at seeds 11-13, lone
fine-tune chains of lengths 3-5 at seeds 11-13, the default recipe's small zoos at seeds 4-5. **Final**: the same
recipes at seeds 14-16 and 6-7, built after every rule and the level were frozen and only measured.

A true parent link measured at closeness >= CLONE_CLOSENESS is a *copy*: the same function, whose direction the
weights cannot give, counted apart. Copies are one node at the weights' resolution, so a model is *placed right* when
its tree links join it (in either orientation) to its true parents or to copies of them; a model the data cannot
place ("cannot tell": linked to two candidate parents) is placed right when one of the two is. Every other true link's
direction is *drawn right* when the lineage claims it the true way (confidence at least the level set), *drawn
wrong* when it claims the other way, and *undecided* otherwise.
"""

from __future__ import annotations

import argparse
import itertools
import pickle
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import networkx as nx

from lineage_graph import direction, phylogeny
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE, ModelInfo, PairTest
from lineage_graph.lineage import Lineage, compute_lineage
from scanner.fingerprint import read_fingerprint
from scanner.fingerprint_compare import compare_fingerprints
from scanner.stats.sequential import SequentialDesign
from scanner.zoo import ChainSpec, Zoo, build_chain, build_zoo
from scanner.zoo.held_out import FINAL_SEEDS, HELD_OUT_SEEDS, HeldOutSpec, build_held_out_zoo
from tests.lineage_support import seed_zoo, true_parent_links, withhold_cards, zoo_lineage_inputs

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"
SIGNALS = ("structure", "depth", "activation_rank")
"""The vote signals that can speak with cards and dates withheld."""
BINS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""Edges of the reliability table's confidence bins (the last bin includes 1.0)."""

Inputs = tuple[list[PairTest], list[ModelInfo], set[tuple[str, str]]]


@dataclass
class Tally:
    """Counts over true links (and models, for placement) of one or more family sets."""

    placed: int = 0
    links: int = 0
    copies: int = 0
    right: int = 0
    wrong: int = 0
    undecided: int = 0
    wrong_confident: int = 0
    cannot_tell: int = 0  # models linked to two candidate parents ("alternative")
    by_bin: dict[int, list[int]] = field(default_factory=dict)  # bin -> [right, total] of every true link's leaning

    def __add__(self, other: Tally) -> Tally:
        counts = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "by_bin"}
        bins = {k: [a + b for a, b in zip(self.by_bin.get(k, [0, 0]), other.by_bin.get(k, [0, 0]))]
                for k in {*self.by_bin, *other.by_bin}}
        return Tally(**counts, by_bin=bins)


def _zoo_inputs(build: Callable[[], Zoo]) -> Callable[[], Inputs]:
    """The zoo's pair tests and models (cached beside the zoo: fingerprints and tests take longer than a lineage)."""
    def inputs() -> Inputs:
        zoo = build()
        cache = Path(zoo.root) / "lineage-inputs.pkl"
        if cache.is_file():
            tests, models = pickle.loads(cache.read_bytes())  # noqa: S301 - written by this script, beside the zoo
        else:
            tests, models = zoo_lineage_inputs(zoo)
            cache.write_bytes(pickle.dumps((tests, models)))
        return tests, models, true_parent_links(zoo)
    return inputs


def smollm2_inputs() -> Inputs:
    """The SmolLM2 family (scanner.testing.real_model) as a folder of downloads: no cards, no dates; pairs tested
    with the scan's default sequential design on the family's cached fingerprints."""
    from scanner.testing.real_model import PARENTS, smollm2_family, smollm2_gguf

    family = smollm2_family(smollm2_gguf(CACHE), CACHE)
    names = sorted(n for n in family.fingerprints if n != "random")
    prints = {name: read_fingerprint(family.fingerprints[name]) for name in names}
    tests = []
    for a, b in itertools.combinations(names, 2):
        r = compare_fingerprints(prints[a], prints[b], "match", design=SequentialDesign())
        tests.append(PairTest(a, b, "match", r.log10_p, r.n_layers, (), r.inputs or "", closeness=r.closeness))
    models = [ModelInfo(n, "r0", m.architecture, m.n_layers, m.hidden_size, m.intermediate_size, m.n_experts,
                        activation_rank=tuple(m.summaries["activation_effective_rank"]))
              for n, m in ((n, prints[n].meta) for n in names)]
    return tests, models, {(parent, child) for child, parent in PARENTS.items()}


def fitted_sets() -> list[tuple[str, Callable[[], Inputs]]]:
    return [("zoo (seed 0)", _zoo_inputs(lambda: build_zoo(CACHE / "zoo"))),
            *((f"small zoo seed {s}", _zoo_inputs(lambda s=s: seed_zoo(CACHE, s))) for s in (1, 2, 3)),
            ("chain of 3, seed 0", _zoo_inputs(lambda: build_chain(CACHE / "chain", spec=ChainSpec(length=3))))]


def held_out_sets(seeds: tuple[int, ...], chain_seeds: tuple[int, ...], small_seeds: tuple[int, ...]
                  ) -> list[tuple[str, Callable[[], Inputs]]]:
    recipe = [(f"held-out recipe seed {s}",
               _zoo_inputs(lambda s=s: build_held_out_zoo(CACHE / f"held-out-seed{s}", spec=HeldOutSpec(seed=s))))
              for s in seeds]
    chains = [(f"chain of {n}, seed {s}",
               _zoo_inputs(lambda s=s, n=n: build_chain(CACHE / f"chain-seed{s}", spec=ChainSpec(seed=s, length=n))))
              for s, n in zip(chain_seeds, (3, 4, 5))]
    small = [(f"small zoo seed {s}", _zoo_inputs(lambda s=s: seed_zoo(CACHE, s))) for s in small_seeds]
    return [*recipe, *chains, *small]


@contextmanager
def without(source: str | None):
    """Remove one evidence source for the duration: a vote signal or the shape prior."""
    saved, shape = dict(direction.RELIABILITY), phylogeny.SHAPE_PRIOR
    if source == "shape":
        phylogeny.SHAPE_PRIOR = False
    elif source:
        direction.RELIABILITY[source] = 0.5
    try:
        yield
    finally:
        direction.RELIABILITY.update(saved)
        phylogeny.SHAPE_PRIOR = shape


def _bin(confidence: float) -> int:
    return next(k for k in range(len(BINS) - 1) if confidence < BINS[k + 1] or k == len(BINS) - 2)


def score(lineage: Lineage, tests: list[PairTest], truth: set[tuple[str, str]]) -> Tally:
    """Placement over the drawn tree links, directions over the true links, and every true link's leaning (the way
    its confidence points, decided or not) in its confidence bin."""
    closeness = {(t.model_a, t.model_b): t.closeness or 0.0 for t in tests}
    is_copy = {(p, c): closeness.get((min(p, c), max(p, c)), 0.0) >= phylogeny.CLONE_CLOSENESS for p, c in truth}
    groups = nx.Graph([link for link, copy in is_copy.items() if copy])
    group = {m: min(g) for g in nx.connected_components(groups) for m in g}
    g = lambda m: group.get(m, m)  # noqa: E731 - a short alias in one expression
    true_pairs = {frozenset((g(p), g(c))) for p, c in truth if not is_copy[(p, c)]}
    linked: dict[str, list[tuple[str, str]]] = {}
    for f in lineage.families:
        for p, c, kind in f.tree_edges():
            linked.setdefault(c, []).append((p, kind))
    tally = Tally(links=len(linked))
    for c, parents in linked.items():
        right = {kind: g(p) == g(c) if kind == "copy" else frozenset((g(p), g(c))) in true_pairs
                 for p, kind in parents}
        tally.cannot_tell += "alternative" in right
        tally.placed += (right["tree"] or right["alternative"]) if "alternative" in right else all(right.values())
    for p, c in truth:
        edge = lineage.edge(p, c)
        d = edge.direction if edge is not None else None
        if is_copy[(p, c)]:
            tally.copies += 1
            continue
        if d is None or d.parent is None:
            tally.undecided += 1
            continue
        leaning_right = d.parent == p
        counts = tally.by_bin.setdefault(_bin(d.confidence), [0, 0])
        counts[0] += leaning_right
        counts[1] += 1
        if not d.claimed:
            tally.undecided += 1
        elif leaning_right:
            tally.right += 1
        else:
            tally.wrong += 1
            tally.wrong_confident += d.confidence >= 0.9
    return tally


def _pct(x: int, total: int) -> str:
    return f"{x}/{total} ({x / total:.0%})" if total else "0/0"


def row(label: str, name: str, t: Tally) -> str:
    directed = t.right + t.wrong
    true_links = directed + t.undecided
    return (f"| {label} | {name} | {_pct(t.placed, t.links)} | {t.cannot_tell} | {_pct(t.right, directed)} | "
            f"{t.wrong} | {t.wrong_confident} | {_pct(t.undecided, true_links)} | {t.copies} |")


def reliability_table(totals: dict[str, Tally]) -> list[str]:
    names = list(totals)
    lines = ["| confidence | " + " | ".join(f"{name}: right / links" for name in names) + " |",
             "|---" * (len(names) + 1) + "|"]
    for k in range(len(BINS) - 1):
        lo, hi = BINS[k], BINS[k + 1]
        label = f"[{lo:.2f}, {hi:.2f}{']' if k == len(BINS) - 2 else ')'}"
        lines.append(f"| {label} | " + " | ".join(_pct(*totals[n].by_bin.get(k, [0, 0])) for n in names) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-real", action="store_true", help="leave out the SmolLM2 family")
    parser.add_argument("--ablations", action="store_true", help="also remove each evidence source in turn")
    parser.add_argument("--level", type=float, default=DEFAULT_MIN_DIRECTION_CONFIDENCE,
                        help="lineage.min_direction_confidence (default: hubtrace's)")
    args = parser.parse_args()
    groups = {"fitted": fitted_sets(), "held-out": held_out_sets(HELD_OUT_SEEDS, HELD_OUT_SEEDS, (4, 5)),
              "final": held_out_sets(FINAL_SEEDS, FINAL_SEEDS, (6, 7))}
    if not args.no_real:
        groups["real"] = [("SmolLM2-135M family", smollm2_inputs)]
    runs = [("withheld", None)] + ([(f"withheld, without {s}", s) for s in (*SIGNALS, "shape")] if args.ablations
                                   else [])
    print(f"min_direction_confidence = {args.level}\n")
    print("| family set | evidence | placed right | cannot tell | directions drawn right | drawn wrong | "
          "wrong at >= 0.9 | undecided | copies |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[tuple[str, str], Tally] = {}
    for group, sets in groups.items():
        for label, source in sets:
            tests, models, truth = source()
            for name, dropped in runs:
                with without(dropped):
                    lineage = compute_lineage(withhold_cards(models), tests,
                                              min_direction_confidence=args.level)
                t = score(lineage, tests, truth)
                totals[(group, name)] = totals.get((group, name), Tally()) + t
                print(row(label, name, t), flush=True)
    for (group, name), t in totals.items():
        print(row(f"**all {group}**", name, t))
    print()
    print("\n".join(reliability_table({group: totals[(group, "withheld")] for group in groups})))


if __name__ == "__main__":
    main()
