"""Family trees with cards and dates withheld: share of tree links right and of directions right, and what each
piece of evidence contributes, on the zoo and on zoos of the same recipe from other seeds.

    python bench/bench_family_trees.py                       # the default zoo and small zoos of seeds 1, 2, 3
    python bench/bench_family_trees.py --seeds 1 2 3 4 5     # more seeds (each built once, ~3 CPU-minutes, cached)

A tree link is right when it joins a child to a true parent (merge links included). A true parent link's
direction is "right" when the lineage points it the true way with confidence above 0.5, "undecided" at 0.5 (a
camouflaged copy and its original: the weights cannot tell them apart), and wrong otherwise. Ablations rerun
the lineage with one signal removed (RELIABILITY set to 0.5, which makes its votes weigh nothing).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from lineage_graph import direction
from lineage_graph.lineage import compute_lineage
from scanner.zoo import build_zoo
from tests.lineage_support import seed_zoo, true_parent_links, withhold_cards, zoo_lineage_inputs

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"


def score(tests, models, truth) -> tuple[int, int, int, int, int]:
    """(tree links right, tree links, directions right, undecided, true links)."""
    lineage = compute_lineage(models, tests)
    links = {(p, c) for f in lineage.families for p, c, _ in f.tree_edges()}
    right = undecided = 0
    for p, c in truth:
        d = lineage.edge(p, c).direction
        if d.confidence <= 0.5 or d.parent is None:
            undecided += 1
        elif d.parent == p:
            right += 1
    return len(links & truth), len(links), right, undecided, len(truth)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    args = parser.parse_args()
    zoos = [("zoo (seed 0)", build_zoo(CACHE / "zoo"))]
    zoos += [(f"small zoo seed {s}", seed_zoo(CACHE, s)) for s in args.seeds]
    signals = [s for s in direction.RELIABILITY if s not in ("declared", "declared_ancestry", "scratch_claim", "dates")]
    header = "| zoo | evidence | tree links right | directions right | undecided |"
    print(header + "\n|---|---|---|---|---|")
    totals: dict[str, list[int]] = {}
    for label, zoo in zoos:
        tests, models = zoo_lineage_inputs(zoo)
        truth = true_parent_links(zoo)
        runs = [("cards", models, None), ("withheld", withhold_cards(models), None)]
        runs += [(f"withheld, without {s}", withhold_cards(models), s) for s in signals]
        for name, infos, dropped in runs:
            saved = dict(direction.RELIABILITY)
            if dropped:
                direction.RELIABILITY[dropped] = 0.5
            try:
                ok, n, right, undecided, n_true = score(tests, infos, truth)
            finally:
                direction.RELIABILITY.update(saved)
            totals.setdefault(name, [0, 0, 0, 0, 0])
            totals[name] = [t + v for t, v in zip(totals[name], (ok, n, right, undecided, n_true))]
            print(f"| {label} | {name} | {ok}/{n} | {right}/{n_true} | {undecided} |")
    for name, (ok, n, right, undecided, n_true) in totals.items():
        print(f"| all | {name} | {ok}/{n} ({ok / n:.0%}) | {right}/{n_true} ({right / n_true:.0%}) | {undecided} |")


if __name__ == "__main__":
    main()
