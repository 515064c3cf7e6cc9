"""Family trees with cards and dates withheld: share of tree links right and of directions right, and what each
piece of evidence contributes, on the zoo, on zoos of the same recipe from other seeds, on the fine-tune chain and on
the real-weight SmolLM2-135M derivatives.

    python bench/bench_family_trees.py                       # zoo, small zoos of seeds 1-3, chain, SmolLM2
    python bench/bench_family_trees.py --seeds 1 --no-real   # fewer (each small zoo is built once, ~3 CPU-minutes)

A true parent link is a *copy* when its closeness is at least CLONE_CLOSENESS (a camouflaged copy, a dequantized
GGUF): the same function, whose direction the weights cannot give; the tree links it with no direction claimed
(confidence 0.5) and the table counts it apart. Copies are one node at the weights' resolution, so a tree link is
right when it joins a child to its true parent or to a copy of it (merge links included), and a copy link when it
joins two copies. Every other true link's direction is "right" when the lineage points it the true way with
confidence above 0.5, "undecided" at 0.5 and wrong otherwise. Ablations rerun the lineage with one source removed:
a vote signal (RELIABILITY set to 0.5, so its votes weigh nothing) or the shape prior of the root
(phylogeny.SHAPE_PRIOR off).

SmolLM2 pairs are tested as a scan tests them by default (the sequential design: 4 screening blocks, stopping when
they settle it), on the family's cached fingerprints (.hubtrace-cache/smollm2/family-*/fingerprints, those the tests
read).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import networkx as nx

from lineage_graph import direction, phylogeny
from lineage_graph.evidence import ModelInfo, PairTest
from lineage_graph.lineage import compute_lineage
from scanner.fingerprint import read_fingerprint
from scanner.fingerprint_compare import compare_fingerprints
from scanner.stats.sequential import SequentialDesign
from scanner.zoo import ChainSpec, build_chain, build_zoo
from tests.lineage_support import seed_zoo, true_parent_links, withhold_cards, zoo_lineage_inputs

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"
SIGNALS = ("structure", "activation_rank")
"""The vote signals that can speak with cards and dates withheld."""


def smollm2_inputs() -> tuple[list[PairTest], list[ModelInfo], set[tuple[str, str]]]:
    """The SmolLM2 family (scanner.testing.real_model) as a folder of downloads: no cards, no dates."""
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


def score(tests: list[PairTest], models: list[ModelInfo], truth: set[tuple[str, str]]) -> list[int]:
    """[tree links right, tree links, copies, directions right, undecided, wrong] over the true links.

    Copies are one node at the weights' resolution: a true link measured at CLONE_CLOSENESS or above makes its two
    ends one group, a copy link is right when it joins two members of one group, and any other link is right when
    it joins the groups of a true parent and its child (hanging a fine-tune under a copy of its parent is right)."""
    lineage = compute_lineage(models, tests)
    closeness = {(t.model_a, t.model_b): t.closeness or 0.0 for t in tests}
    is_copy = {(p, c): closeness[(min(p, c), max(p, c))] >= phylogeny.CLONE_CLOSENESS for p, c in truth}
    groups = nx.Graph([link for link, copy in is_copy.items() if copy])
    group = {m: min(g) for g in nx.connected_components(groups) for m in g}
    g = lambda m: group.get(m, m)  # noqa: E731 - a short alias in one expression
    true_groups = {(g(p), g(c)) for p, c in truth if not is_copy[(p, c)]}
    links = [(p, c, kind) for f in lineage.families for p, c, kind in f.tree_edges()]
    ok = sum(g(p) == g(c) if kind == "copy" else (g(p), g(c)) in true_groups for p, c, kind in links)
    copies = right = undecided = wrong = 0
    for p, c in truth:
        d = lineage.edge(p, c).direction
        if is_copy[(p, c)]:
            copies += 1
        elif d.parent is None or d.confidence <= 0.5:
            undecided += 1
        elif d.parent == p:
            right += 1
        else:
            wrong += 1
    return [ok, len(links), copies, right, undecided, wrong]


def row(label: str, name: str, v: list[int], share: bool = False) -> str:
    ok, n, copies, right, undecided, wrong = v
    directed = right + undecided + wrong

    def pct(x: int, total: int) -> str:
        return f"{x}/{total} ({x / total:.0%})" if share and total else f"{x}/{total}"

    return f"| {label} | {name} | {pct(ok, n)} | {pct(right, directed)} | {undecided} | {wrong} | {copies} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--no-real", action="store_true", help="leave out the SmolLM2 family")
    args = parser.parse_args()
    Inputs = Callable[[], tuple[list[PairTest], list[ModelInfo], set[tuple[str, str]]]]

    def zoo_source(build) -> Inputs:
        def inputs():
            zoo = build()
            return (*zoo_lineage_inputs(zoo), true_parent_links(zoo))
        return inputs

    named: list[tuple[str, Inputs]] = [("zoo (seed 0)", zoo_source(lambda: build_zoo(CACHE / "zoo")))]
    named += [(f"small zoo seed {s}", zoo_source(lambda s=s: seed_zoo(CACHE, s))) for s in args.seeds]
    named += [("chain base-ft1-ft2-ft3", zoo_source(lambda: build_chain(CACHE / "chain", spec=ChainSpec(length=3))))]
    if not args.no_real:
        named += [("SmolLM2-135M family", smollm2_inputs)]
    print("| family set | evidence | tree links right | directions right (copies aside) | undecided | wrong | copies |")
    print("|---|---|---|---|---|---|---|")
    totals: dict[str, list[int]] = {}
    for label, source in named:
        tests, models, truth = source()
        runs = [("withheld", None)] + [(f"withheld, without {s}", s) for s in (*SIGNALS, "shape")]
        if any(m.declares_base for m in models):
            runs.insert(0, ("cards", None))
        for name, dropped in runs:
            with without(dropped):
                v = score(tests, models if name == "cards" else withhold_cards(models), truth)
            totals[name] = [t + x for t, x in zip(totals.get(name, [0] * 6), v)]
            print(row(label, name, v), flush=True)
    for name, v in totals.items():
        print(row("all", name, v, share=True))


if __name__ == "__main__":
    main()
