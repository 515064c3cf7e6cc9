"""Family trees with cards, merge configs and dates withheld, on the zoos the rules were fitted on, on held-out zoos
and on final zoos no rule was fitted on: placement (who is linked to whom), directions drawn right, wrong and left
undecided, per zoo, per group and per recipe (the kind of derivation: fine-tune, each merge method, prune, ...), and
a reliability table of the direction confidence per bin.

    PYTHONPATH=. python bench/bench_family_trees.py               # every zoo and SmolLM2 (minutes a zoo to build)
    PYTHONPATH=. python bench/bench_family_trees.py --no-real     # without the SmolLM2 family
    PYTHONPATH=. python bench/bench_family_trees.py --ablations   # also each evidence source removed, per set
    PYTHONPATH=. python bench/bench_family_trees.py --groups final   # one group only

Three groups. **Fitted**: the zoos the direction rules, their reliabilities, the placement and merge margins and the
default level were set on (the default zoo, seed 0; the small zoos of seeds 1-5; the fine-tune chains of seed 0 and
11-13; the held-out recipe, scanner.zoo.held_out, at seeds 11-13) and the merge zoos of scanner.zoo.tool_zoo
(mergekit and PEFT) that the merge, stacking and direction rules of issue 36 were developed on (seeds 21-22).
**Held-out**: the same recipes at seeds no rule was fitted on, looked at once the rules were set (held-out recipe
and chains 14-19, small zoos 6-9, merge zoos 23-27; 17-19, 8-9 and 25-27 were the final zoos until the tree's order
test was made after two wrong arrows in merge zoos 26 and 27). **Final**: the same recipes at seeds built after every
rule was frozen and only measured (20-22, small zoos 10-13, merge zoos 28-33).

A true parent link measured at closeness >= CLONE_CLOSENESS is a *copy*: the same function, whose direction the
weights cannot give, counted apart. Copies are one node at the weights' resolution, so a model is *placed right* when
its tree links join it (in either orientation) to its true parents or to copies of them; a model the data cannot
place ("cannot tell": linked to two candidate parents) is placed right when one of the two is. A merge's true
parents are every model whose weights enter it (the base of a task-vector method too); a merge linked to two of three
is placed right. Every other true link's direction is *drawn right* when the lineage claims it the true way
(confidence at least the level set, and corroborated), *drawn wrong* when it claims the other way, and *undecided*
otherwise. Each zoo's any-order block maps are made as a scan makes them (lineage_graph.block_maps).
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

import networkx as nx
from scipy.stats import binomtest

from lineage_graph import direction, phylogeny
from lineage_graph.direction import DEFAULT_WEIGHING, Weighing
from lineage_graph.evidence import DEFAULT_MIN_DIRECTION_CONFIDENCE, ModelInfo, PairTest
from lineage_graph.lineage import Lineage, compute_lineage
from lineage_graph.persist import activation_scale
from scanner.fingerprints.fingerprint import fingerprint_model, read_fingerprint
from scanner.pairs.block_map import BlockMap
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.stats.sequential import SequentialDesign
from scanner.zoo import ChainSpec, Zoo, ZooModel, build_chain, build_zoo, held_out, method_zoo, tool_zoo
from tests.lineage_support import (
    seed_zoo,
    true_parent_links,
    withhold_cards,
    zoo_block_maps,
    zoo_lineage_inputs,
)

CACHE = Path(__file__).resolve().parent.parent / ".hubtrace-cache"
SIGNALS = ("structure", "depth", "block_map", "activation_rank", "activation_scale")
"""The vote signals that can speak with cards and dates withheld."""
HELD_OUT_SMALL_SEEDS = tuple(range(6, 22))
"""Small zoos of the default recipe looked at once the rules were set (8 and 9 were final until the order test,
10-13 until the weight-value evidence, 14-17 until entangled links were left undecided, 18-21 until the weight values'
veto on merges the distances alone suggest)."""
FINAL_SMALL_SEEDS = (22, 23, 24, 25)
"""Small zoos built after every rule was frozen, only measured."""
BINS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
"""Edges of the reliability table's confidence bins (the last bin includes 1.0)."""

INPUTS_FILE = "lineage-inputs-v7.pkl"
"""Each zoo's pair tests, models and block maps, cached beside it (fingerprints and tests take longer than a
lineage; v3: models carry merge configs and activation scales, block maps made; v4: fingerprint format 2 and the
unit screen of issue 33; v5: phi_MATCH version 2, the up view decoupled from the gate view; v6: models carry their
MLP value samples; v7: kept with the zoo's spec hash, so a zoo rebuilt under a changed recipe is not scored on the
inputs of its former models)."""


@dataclass
class Inputs:
    """What the lineage is computed from, and the truth it is scored against."""

    tests: list[PairTest]
    models: list[ModelInfo]
    truth: set[tuple[str, str]]
    block_maps: dict[tuple[str, str], BlockMap] = field(default_factory=dict)
    recipes: dict[str, str] = field(default_factory=dict)
    """model -> the recipe it was made by (its relation; a merge's method, a tool)."""


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
    """The zoo's pair tests, models and block maps, computed once and cached beside the zoo."""
    def inputs() -> Inputs:
        zoo = build()
        cache = Path(zoo.root) / INPUTS_FILE
        cached = pickle.loads(cache.read_bytes()) if cache.is_file() else None  # noqa: S301 - written by this script
        if cached is not None and cached[0] == zoo.spec_hash:
            _, tests, models, maps = cached
        else:
            prints = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
            tests, models = zoo_lineage_inputs(zoo, prints)
            maps = zoo_block_maps(zoo, tests, models, prints)
            cache.write_bytes(pickle.dumps((zoo.spec_hash, tests, models, maps)))
        return Inputs(tests, models, true_parent_links(zoo), maps, {m.id: recipe(m) for m in zoo.models.values()})
    return inputs


def recipe(model: ZooModel) -> str:
    """The recipe a zoo model was made by, as the per-recipe table names it."""
    tool = model.details.get("tool")
    if "recipe" in model.details:  # the method zoos name each model's recipe family
        parents = f", {len(model.parents)} parents" if model.relation == "merge" and len(model.parents) > 2 else ""
        return model.details["recipe"] + parents
    if model.relation == "merge":
        parents = f", {len(model.parents)} parents" if len(model.parents) > 2 else ""
        return f"merge: {model.details.get('method', 'average')}{parents}" + (" (mergekit)" if tool else "")
    suffix = {"peft": " (LoRA, PEFT)", "mergekit": " (mergekit)"}.get(tool, "")
    return model.relation + suffix


def smollm2_inputs() -> Inputs:
    """The SmolLM2 family (tests.fixtures.real_model) as a folder of downloads: no cards, no dates; pairs tested
    with the scan's default sequential design on the family's cached fingerprints."""
    from tests.fixtures.real_model import PARENTS, smollm2_family, smollm2_gguf

    family = smollm2_family(smollm2_gguf(CACHE), CACHE)
    names = sorted(n for n in family.fingerprints if n != "random")
    prints = {name: read_fingerprint(family.fingerprints[name]) for name in names}
    tests = []
    for a, b in itertools.combinations(names, 2):
        r = compare_fingerprints(prints[a], prints[b], "match", design=SequentialDesign())
        tests.append(PairTest(a, b, "match", r.log10_p, r.n_layers, (), r.inputs or "", closeness=r.closeness))
    models = [ModelInfo(n, "r0", m.architecture, m.n_layers, m.hidden_size, m.intermediate_size, m.n_experts,
                        activation_rank=tuple(m.summaries["activation_effective_rank"]),
                        activation_scale=activation_scale(m.summaries), mlp_values=m.value_sample().tobytes(),
                        mlp_layout=m.mlp_layout)
              for n, m in ((n, prints[n].meta) for n in names)]
    return Inputs(tests, models, {(parent, child) for child, parent in PARENTS.items()},
                  recipes={child: f"SmolLM2 {child}" for child in PARENTS})


def recipe_sets(recipe_seeds: tuple[int, ...], small_seeds: tuple[int, ...], merge_seeds: tuple[int, ...]
                ) -> list[tuple[str, Callable[[], Inputs]]]:
    """The held-out recipe and lone chains of 3, 4 and 5 fine-tunes (in turn) at recipe_seeds, the default recipe's
    small zoos at small_seeds and the merge zoos at merge_seeds."""
    recipe = [(f"held-out recipe seed {s}", _zoo_inputs(lambda s=s: held_out.build_held_out_zoo(
        CACHE / f"held-out-seed{s}", spec=held_out.HeldOutSpec(seed=s)))) for s in recipe_seeds]
    chains = [(f"chain of {n}, seed {s}",
               _zoo_inputs(lambda s=s, n=n: build_chain(CACHE / f"chain-seed{s}", spec=ChainSpec(seed=s, length=n))))
              for s, n in zip(recipe_seeds, itertools.cycle((3, 4, 5)))]
    small = [(f"small zoo seed {s}", _zoo_inputs(lambda s=s: seed_zoo(CACHE, s))) for s in small_seeds]
    merges = [(f"merge zoo seed {s}", _zoo_inputs(lambda s=s: tool_zoo.build_merge_zoo(
        CACHE / f"merge-zoo-seed{s}", spec=tool_zoo.MergeZooSpec(seed=s)))) for s in merge_seeds]
    return [*recipe, *chains, *small, *merges]


def groups() -> dict[str, list[tuple[str, Callable[[], Inputs]]]]:
    fitted = [("zoo (seed 0)", _zoo_inputs(lambda: build_zoo(CACHE / "zoo"))),
              *((f"small zoo seed {s}", _zoo_inputs(lambda s=s: seed_zoo(CACHE, s))) for s in (1, 2, 3)),
              ("chain of 3, seed 0", _zoo_inputs(lambda: build_chain(CACHE / "chain", spec=ChainSpec(length=3))))]
    methods = [(f"method zoo seed {s}", _zoo_inputs(lambda s=s: method_zoo.build_method_zoo(
        CACHE / f"method-zoo-seed{s}", spec=method_zoo.MethodZooSpec(seed=s)))) for s in method_zoo.SEEDS]
    return {"fitted": fitted + recipe_sets(held_out.FITTED_SEEDS, (4, 5), tool_zoo.FITTED_SEEDS),
            "held-out": recipe_sets(held_out.HELD_OUT_SEEDS, HELD_OUT_SMALL_SEEDS, tool_zoo.HELD_OUT_SEEDS),
            "final": recipe_sets(held_out.FINAL_SEEDS, FINAL_SMALL_SEEDS, tool_zoo.FINAL_SEEDS),
            "methods": methods}


def _bin(confidence: float) -> int:
    return next(k for k in range(len(BINS) - 1) if confidence < BINS[k + 1] or k == len(BINS) - 2)


def score(lineage: Lineage, inputs: Inputs) -> dict[str, Tally]:
    """Per recipe (of the child): placement over the drawn tree links, directions over the true links, and every true
    link's leaning (the way its confidence points, decided or not) in its confidence bin."""
    closeness = {(t.model_a, t.model_b): t.closeness or 0.0 for t in inputs.tests}
    truth = inputs.truth
    is_copy = {(p, c): closeness.get((min(p, c), max(p, c)), 0.0) >= phylogeny.CLONE_CLOSENESS for p, c in truth}
    groups = nx.Graph([link for link, copy in is_copy.items() if copy])
    group = {m: min(g) for g in nx.connected_components(groups) for m in g}
    g = lambda m: group.get(m, m)  # noqa: E731 - a short alias in one expression
    true_pairs = {frozenset((g(p), g(c))) for p, c in truth if not is_copy[(p, c)]}
    linked: dict[str, list[tuple[str, str]]] = {}
    for f in lineage.families:
        for p, c, kind in f.tree_edges():
            linked.setdefault(c, []).append((p, kind))
    tallies: dict[str, Tally] = {}

    def of(model: str) -> Tally:
        return tallies.setdefault(inputs.recipes.get(model, "other"), Tally())

    for c, parents in linked.items():
        right = {kind: g(p) == g(c) if kind == "copy" else frozenset((g(p), g(c))) in true_pairs
                 for p, kind in parents}
        tally = of(c)
        tally.links += 1
        tally.cannot_tell += "alternative" in right
        tally.placed += (right["tree"] or right["alternative"]) if "alternative" in right else all(right.values())
    for p, c in truth:
        tally = of(c)
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
    return tallies


def total(tallies: dict[str, Tally]) -> Tally:
    return sum(tallies.values(), Tally())


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


def recipe_family(recipe_name: str) -> str:
    """The family a recipe belongs to for held-out-recipe figures: its method or derivation, whatever the number of
    its parents (a NuSLERP merge with and without a base is one family)."""
    return re.sub(r", \d+ parents", "", recipe_name)


def weak_votes(inputs: Inputs) -> list[tuple[str, str, bool]]:
    """Each weak signal's vote on each true parent link whose child is no merge (the tree leaves them out of merge
    links): (recipe family of the child, signal, whether it names the true parent)."""
    by_id = {m.model_id: m for m in withhold_cards(inputs.models)}
    closeness = {(t.model_a, t.model_b): t.closeness for t in inputs.tests}
    out = []
    for p, c in sorted(inputs.truth):
        family = recipe_family(inputs.recipes.get(c, "other"))
        if family.startswith("merge") or p not in by_id or c not in by_id:
            continue
        pair = (min(p, c), max(p, c))
        for vote in direction.votes(by_id[pair[0]], by_id[pair[1]], {}, inputs.block_maps.get(pair),
                                    closeness.get(pair)):
            if vote.signal in direction.NOT_ALONE:
                out.append((family, vote.signal, vote.parent == p))
    return out


def held_out_weighing(votes: list[tuple[str, str, bool]], left_out: str) -> Weighing:
    """The weak signals' reliabilities measured on every recipe family but ``left_out``: the Wilson 95% lower bound of
    the share of their votes that named the true parent (0.5, no vote, where it is lower), the strong signals' as
    assumed."""
    reliability = dict(DEFAULT_WEIGHING.reliability)
    for signal in sorted(direction.NOT_ALONE):
        right = [ok for family, s, ok in votes if s == signal and family != left_out]
        if right:
            low = binomtest(sum(right), len(right)).proportion_ci(method="wilson").low
            reliability[signal] = max(0.5, low)
    return Weighing(reliability=reliability)


def held_out_recipes(sets: list[tuple[str, Inputs]], level: float) -> dict[str, tuple[Tally, Weighing]]:
    """Leave-one-recipe-family-out: for each recipe family, every zoo that holds it is drawn with the weak signals'
    reliabilities measured on the other families alone, and that family's links are scored."""
    votes = [v for _, inputs in sets for v in weak_votes(inputs)]
    families = sorted({recipe_family(r) for _, inputs in sets for r in inputs.recipes.values()})
    out = {}
    for family in families:
        weighing = held_out_weighing(votes, family)
        tally = Tally()
        for _, inputs in sets:
            if family not in {recipe_family(r) for r in inputs.recipes.values()}:
                continue
            lineage = compute_lineage(withhold_cards(inputs.models), inputs.tests, weighing=weighing,
                                      min_direction_confidence=level, block_maps=inputs.block_maps)
            for recipe_name, t in score(lineage, inputs).items():
                if recipe_family(recipe_name) == family:
                    tally = tally + t
        out[family] = (tally, weighing)
    return out


GOALS = "placement >= 95%, no wrong arrow at >= 0.9, undecided <= 25%"


def meets_goals(t: Tally) -> bool:
    true_links = t.right + t.wrong + t.undecided
    return ((not t.links or t.placed >= 0.95 * t.links) and t.wrong_confident == 0
            and (not true_links or t.undecided <= 0.25 * true_links))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-real", action="store_true", help="leave out the SmolLM2 family")
    parser.add_argument("--ablations", action="store_true", help="also remove each evidence source in turn")
    parser.add_argument("--groups", nargs="+", choices=("fitted", "held-out", "final", "methods"),
                        default=["fitted", "held-out", "final", "methods"], help="which groups of zoos (default: all)")
    parser.add_argument("--level", type=float, default=DEFAULT_MIN_DIRECTION_CONFIDENCE,
                        help="lineage.min_direction_confidence (default: hubtrace's)")
    parser.add_argument("--held-out-recipes", action="store_true",
                        help="also leave each recipe family out in turn: the weak signals' reliabilities measured on "
                             "the other families, that family scored")
    args = parser.parse_args()
    chosen = {name: sets for name, sets in groups().items() if name in args.groups}
    if not args.no_real:
        chosen["real"] = [("SmolLM2-135M family", smollm2_inputs)]
    runs = [("withheld", None)] + ([(f"withheld, without {s}", s) for s in (*SIGNALS, "shape")] if args.ablations
                                   else [])
    print(f"min_direction_confidence = {args.level}\n")
    print("| family set | evidence | placed right | cannot tell | directions drawn right | drawn wrong | "
          "wrong at >= 0.9 | undecided | copies |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[tuple[str, str], Tally] = {}
    by_recipe: dict[str, dict[str, Tally]] = {}
    loaded: list[tuple[str, Inputs]] = []
    for group, sets in chosen.items():
        for label, source in sets:
            inputs = source()
            loaded.append((label, inputs))
            for name, dropped in runs:
                weighing = DEFAULT_WEIGHING.without(dropped) if dropped else DEFAULT_WEIGHING
                lineage = compute_lineage(withhold_cards(inputs.models), inputs.tests, weighing=weighing,
                                          min_direction_confidence=args.level, block_maps=inputs.block_maps)
                tallies = score(lineage, inputs)
                t = total(tallies)
                totals[(group, name)] = totals.get((group, name), Tally()) + t
                if dropped is None:
                    for recipe_name, tally in tallies.items():
                        mine = by_recipe.setdefault(group, {})
                        mine[recipe_name] = mine.get(recipe_name, Tally()) + tally
                print(row(label, name, t), flush=True)
    for (group, name), t in totals.items():
        print(row(f"**all {group}**", name, t))
    print()
    print("\n".join(reliability_table({group: totals[(group, "withheld")] for group in chosen})))
    for group, tallies in by_recipe.items():
        print(f"\nPer recipe, {group}:\n")
        print("| recipe | placed right | cannot tell | directions drawn right | drawn wrong | wrong at >= 0.9 | "
              "undecided | copies |")
        print("|---|---|---|---|---|---|---|---|")
        for recipe_name in sorted(tallies):
            print(row(recipe_name, "", tallies[recipe_name]).replace(" |  | ", " | ", 1))
    if args.held_out_recipes:
        print(f"\nEach recipe family held out (the weak signals' reliabilities measured on the others), {GOALS}:\n")
        print("| recipe family | evidence | placed right | cannot tell | directions drawn right | drawn wrong | "
              "wrong at >= 0.9 | undecided | copies | rank r | scale r | goals |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        held = held_out_recipes(loaded, args.level)
        for family, (t, weighing) in held.items():
            r = weighing.reliability
            print(f"{row(family, 'held out', t)} {r['activation_rank']:.2f} | {r['activation_scale']:.2f} | "
                  f"{'met' if meets_goals(t) else 'not met'} |")
        print(row("**all, each held out**", "", sum((t for t, _ in held.values()), Tally())))


if __name__ == "__main__":
    main()
