"""Recall of candidate retrieval: on the zoo against the all-pairs scan, and on a synthetic hub grown from the zoo.

    PYTHONPATH=. python bench/bench_retrieval_recall.py [--hub 1000] [--seed 0] [--cache DIR]
    PYTHONPATH=. python bench/bench_retrieval_recall.py --truth .hubtrace-cache/zoo .hubtrace-cache/zoo-small-seed*

Zoo: every pair is tested with φ_MATCH (the `pairs.select: all` baseline: the scan's sequential design), the
dependent ones are those Benjamini-Hochberg keeps at q = 0.05, and the candidates (retrieved pairs and their
families, as the scan forms them) must contain all of them; families from candidates must equal those from all.

Synthetic hub: ``--hub`` models grown at the fingerprint level from the zoo's 16 models (their families are the
zoo's): noisy fine-tunes (Gaussian noise on every activation, 0.1 or 0.3 of each unit's RMS: short and long),
camouflaged copies (units permuted, gate and up of each unit rescaled by factors in [0.3, 3]), width prunes (a
random quarter of every block's units dropped), depth prunes (one or two blocks dropped), merges (0.6/0.4 average
of two members of one family), retrained MLPs (half the blocks replaced by the blocks of an unrelated zoo model
with fresh noise). Children are grown from any earlier member, so chains form. Recall is measured against the
planted truth: an all-pairs φ_MATCH run over ~500,000 pairs does not fit this machine. The hub records where
every block's weights come from, so there are two truths: pairs that share weights (a block origin), and pairs of
one planted family, which also counts pairs that share nothing (a depth prune that kept only the donor blocks of a
retrained-MLP parent is "in the family" of that parent's base). Sharing an origin is more than testing all pairs
can find: a merge that averages a block with an unrelated one at 0.4 keeps a trace of the minor block that
φ_MATCH itself may not see (a zoo block, whose activations are ~0.4 of a synthetic base's, ends as 0.25 of the
merged unit's direction). So each missed weight-sharing pair is tested with φ_MATCH as the all-pairs scan tests it,
and the misses that test calls dependent (Bonferroni over the hub's pairs: what an all-pairs scan would surely
have found) are counted apart.
A zoo block's origin is its base's block at the same depth (a depth prune's kept blocks, from the zoo's ground
truth; an MLP the zoo retrained is an origin of its own): block 0 and block 1 of one family are different weights.

``--truth``: candidates against the ground truth of cached zoos (``truth_recall``), no all-pairs baseline.

Each rule of ``--map-thresholds`` (the cosine down to which a selected pair's hits draw its block map; equal to
the collision threshold 0.6 is the rule before the map threshold existed) runs on the same hub and entries.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

import numpy as np

from scanner.fingerprints.fingerprint import Fingerprint, fingerprint_model
from scanner.reading.activations import MLPActivations
from scanner.retrieval.candidates import MAP_THRESHOLD, MIN_SCORE, scored_pairs, with_wide_block_maps
from scanner.retrieval.hub import family_pairs
from scanner.retrieval.index import RetrievalIndex
from scanner.retrieval.signatures import SIGNATURE_VERSION, SignatureParams, retrieval_entry

KINDS = ("finetune", "long-finetune", "camouflage", "width-prune", "depth-prune", "merge", "retrained-mlp")


def candidates(entries: dict, map_threshold: float = MAP_THRESHOLD) -> tuple[set[tuple[str, str]], float]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        first = next(iter(entries.values()))
        index = RetrievalIndex(folder, first.input_set, first.params)
        index.sync({key: (lambda e=e: e) for key, e in entries.items()})
        found = with_wide_block_maps(scored_pairs(index, entries, MIN_SCORE), entries.__getitem__,
                                     threshold=index.search_params.threshold, map_threshold=map_threshold)
    closed = {(a[0], b[0]) for a, b in family_pairs(((p.model_a, p.revision_a), (p.model_b, p.revision_b),
                                                      p.block_map) for p in found)}
    return closed | {(p.model_a, p.model_b) for p in found}, time.perf_counter() - started


def zoo_recall(fingerprints: dict[str, Fingerprint]) -> None:
    from lineage_graph.multiple_testing import fdr_reject, holm_reject
    from scanner.pairs.fingerprint_compare import compare_fingerprints
    from scanner.stats.sequential import SequentialDesign

    pairs = list(combinations(sorted(fingerprints), 2))
    log10_p = [compare_fingerprints(fingerprints[a], fingerprints[b], design=SequentialDesign()).log10_p
               for a, b in pairs]
    dependent = {pair for pair, keep in zip(pairs, fdr_reject(log10_p, q=0.05)) if keep}
    joins = {pair for pair, keep in zip(pairs, holm_reject(log10_p, alpha=0.05)) if keep}   # what joins families
    got, seconds = candidates({(m, "r"): retrieval_entry(fp) for m, fp in fingerprints.items()})
    missed = dependent - got
    print(f"zoo: {len(pairs)} pairs, {len(dependent)} dependent after BH (all pairs), {len(got)} candidates, "
          f"recall {1 - len(missed) / len(dependent):.4f}, {len(got - dependent)} candidates not dependent, "
          f"families (Holm edges, as the lineage joins them) equal: "
          f"{_components(joins, fingerprints) == _components(got & joins, fingerprints)}, "
          f"retrieval {seconds:.2f} s")
    for pair in sorted(missed):
        print("  missed", pair)


def truth_recall(roots: list[Path]) -> None:
    """Per cached zoo (any folder with a ground truth: the zoo, the small zoos of its recipe from other seeds, zoos
    rebuilt under other CPU kernels): dependent pairs the candidates miss, independent pairs retrieved directly
    (chance links), independent pairs of two families of several models joined by the closure, the largest score of
    an independent pair, and the smallest best score a model has with any of its relatives (the margin of the
    weakest-linked derivative over ``MIN_SCORE``)."""
    from scanner.zoo import Zoo

    for root in roots:
        zoo = Zoo.load(root)
        entries = {(m, "r"): retrieval_entry(fingerprint_model(zoo[m].path)) for m in zoo.ids}
        with tempfile.TemporaryDirectory() as folder:
            index = RetrievalIndex(folder, next(iter(entries.values())).input_set)
            index.sync({key: (lambda e=e: e) for key, e in entries.items()})
            scored = scored_pairs(index, entries)
        score = {(p.model_a, p.model_b): p.score for p in scored}
        retrieved = [p for p in scored if p.score >= MIN_SCORE]
        direct = {(p.model_a, p.model_b) for p in retrieved}
        closed = {(a[0], b[0]) for a, b in family_pairs(((p.model_a, "r"), (p.model_b, "r"), p.block_map)
                                                         for p in retrieved)}
        dependent = {tuple(sorted(p)) for p in zoo.pairs(dependent=True)}
        size = Counter(zoo[m].family for m in zoo.ids)
        chained = [p for p in (closed | direct) - dependent if min(size[zoo[p[0]].family], size[zoo[p[1]].family]) > 1]
        independent = [score.get(tuple(sorted(p)), 0) for p in zoo.pairs(dependent=False)]
        related = {m for pair in dependent for m in pair}
        best_link = [max(score.get(p, 0) for p in dependent if m in p) for m in related]
        print(f"{root}: {len(dependent - closed - direct)} of {len(dependent)} dependent pairs missed, "
              f"{len(direct - dependent)} chance links, {len(chained)} pairs of two families chained, largest "
              f"independent score {max(independent, default=0)}, weakest best link {min(best_link, default=0)}")


def _components(edges: set[tuple[str, str]], models) -> set[frozenset[str]]:
    groups = {frozenset({m}) for m in models}
    for a, b in edges:
        ga, gb = next(g for g in groups if a in g), next(g for g in groups if b in g)
        if ga != gb:
            groups -= {ga, gb}
            groups.add(ga | gb)
    return groups


def zoo_block_origins(zoo) -> dict[str, list[frozenset]]:  # noqa: ANN001 - a scanner.zoo.Zoo
    """Where each zoo block's weights come from: (base, depth) of the family base's block it descends from, the
    union of both parents' for a merge, an origin of its own for an MLP the zoo retrained."""
    origins: dict[str, list[frozenset]] = {}
    for name in zoo.ids:   # parents come before their children
        model = zoo[name]
        parent = [origins[p] for p in model.parents]
        if model.relation == "base":
            origins[name] = [frozenset({(name, i)}) for i in range(model.arch.num_layers)]
        elif model.relation == "merge":
            origins[name] = [a | b for a, b in zip(*parent)]
        elif model.relation == "prune_depth":
            origins[name] = [parent[0][i] for i in model.details["kept_blocks"]]
        elif model.relation == "retrained_mlp":
            retrained = set(model.details["retrain"]["blocks"])
            origins[name] = [frozenset({(name, i)}) if i in retrained else o for i, o in enumerate(parent[0])]
        else:
            origins[name] = list(parent[0])
    return origins


def grow_hub(zoo_fps: dict[str, Fingerprint], family_of: dict[str, str], zoo_origins: dict[str, list[frozenset]],
             n: int, seed: int, family_size: int = 10):  # noqa: ANN201
    """The zoo plus independent synthetic bases (units iid given the model, a shared low-rank component as
    training on the same data gives) until there is one family per ``family_size`` models; each new model grows
    from a random member of a random family that is not yet full."""
    rng = np.random.default_rng(seed)
    members = {name: (fp, family_of[name], "zoo") for name, fp in zoo_fps.items()}
    # where each block's weights come from: a zoo base's block or a synthetic base's block; a pair that shares no
    # origin shares no weights a pair test could see
    origins = {name: list(zoo_origins[name]) for name in zoo_fps}
    template = next(iter(zoo_fps.values()))
    units, tokens = template.blocks[0][0].gate.shape
    shared = rng.standard_normal((4, tokens)).astype(np.float32)
    families = Counter(family_of.values())
    for f in range(max(5, n // family_size - len(families))):
        def part() -> np.ndarray:
            return (0.1 * rng.standard_normal((units, 4)) @ shared
                    + rng.standard_normal((units, tokens))).astype(np.float32)
        blocks = [[MLPActivations(part(), part())] for _ in range(len(template.blocks))]
        name = f"synth/base-{f:04d}"
        members[name] = (Fingerprint(dataclasses.replace(template.meta, model=name), blocks), name, "base")
        origins[name] = [frozenset({(name, i)}) for i in range(len(blocks))]
        families[name] = 1
    names = list(members)
    while len(members) < n:
        open_families = [f for f, size in families.items() if size < family_size]
        family = open_families[rng.integers(len(open_families))]
        in_family = [m for m in names if members[m][1] == family]
        parent_name = in_family[rng.integers(len(in_family))]
        parent = members[parent_name][0]
        origin = list(origins[parent_name])
        families[family] += 1
        kind = KINDS[len(members) % len(KINDS)]
        blocks = [[MLPActivations(e.gate.astype(np.float32), e.up.astype(np.float32)) for e in experts]
                  for experts in parent.blocks]
        if kind in ("finetune", "long-finetune"):
            level = 0.1 if kind == "finetune" else 0.3
            blocks = [[_noisy(e, level, rng) for e in experts] for experts in blocks]
        elif kind == "camouflage":
            blocks = [[_camouflaged(e, rng) for e in experts] for experts in blocks]
        elif kind == "width-prune":
            blocks = [[_kept(e, rng.permutation(e.gate.shape[0])[: 3 * e.gate.shape[0] // 4]) for e in experts]
                      for experts in blocks]
        elif kind == "depth-prune" and len(blocks) > 2:
            drop = set(rng.permutation(len(blocks))[: 1 + rng.integers(2) if len(blocks) > 3 else 1].tolist())
            blocks = [b for i, b in enumerate(blocks) if i not in drop]
            origin = [o for i, o in enumerate(origin) if i not in drop]
        elif kind == "merge":
            same = [m for m in names if members[m][1] == family and m != parent_name
                    and len(members[m][0].blocks) == len(blocks)
                    and members[m][0].blocks[0][0].gate.shape == blocks[0][0].gate.shape]
            if same:
                other_name = same[rng.integers(len(same))]
                other = members[other_name][0]
                origin = [o | p for o, p in zip(origin, origins[other_name])]
                blocks = [[MLPActivations(0.6 * e.gate + 0.4 * o.gate.astype(np.float32),
                                          0.6 * e.up + 0.4 * o.up.astype(np.float32))
                           for e, o in zip(experts, other_experts)]
                          for experts, other_experts in zip(blocks, other.blocks)]
        elif kind == "retrained-mlp":
            donors = [m for m in names if members[m][1] != family]
            donor_name = donors[rng.integers(len(donors))]
            donor = members[donor_name][0]
            for i in range(1, len(blocks), 2):
                if i < len(donor.blocks) and donor.blocks[i][0].gate.shape == blocks[i][0].gate.shape:
                    blocks[i] = [_noisy(e, 0.5, rng, to_float=True) for e in donor.blocks[i]]
                    origin[i] = origins[donor_name][i]
        name = f"synth/{kind}-{len(members):05d}"
        meta = dataclasses.replace(parent.meta, model=name, n_layers=len(blocks))
        members[name] = (Fingerprint(meta, blocks), family, kind)
        origins[name] = origin
        names.append(name)
    return members, origins


def missed_tests(hub: dict, missed: set[tuple[str, str]], pairs_possible: int) -> None:
    """φ_MATCH on each missed weight-sharing pair, as the all-pairs scan would test it (its sequential design):
    how many of the misses that scan would have called dependent at Bonferroni 0.05 over every pair of the hub."""
    from scanner.pairs.fingerprint_compare import compare_fingerprints
    from scanner.stats.sequential import SequentialDesign

    level = np.log10(0.05 / pairs_possible)
    tested = {pair: compare_fingerprints(hub[pair[0]][0], hub[pair[1]][0], design=SequentialDesign()).log10_p
              for pair in sorted(missed)}
    found = [pair for pair, log10_p in tested.items() if log10_p <= level]
    print(f"  missed weight-sharing pairs that φ_MATCH calls dependent (log10 p <= {level:.1f}): {len(found)} of "
          f"{len(missed)}")
    for (a, b), log10_p in tested.items():
        print(f"    {a} -- {b}: log10 p {log10_p:.1f}")


def _noisy(acts: MLPActivations, level: float, rng: np.random.Generator, to_float: bool = False) -> MLPActivations:
    def noisy(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32)
        rms = np.sqrt((x**2).mean(axis=1, keepdims=True))
        return x + level * rms * rng.standard_normal(x.shape).astype(np.float32)
    return MLPActivations(noisy(acts.gate), noisy(acts.up))


def _camouflaged(acts: MLPActivations, rng: np.random.Generator) -> MLPActivations:
    perm = rng.permutation(acts.gate.shape[0])
    scale = rng.uniform(0.3, 3.0, size=(acts.gate.shape[0], 1)).astype(np.float32)
    return MLPActivations(acts.gate[perm] * scale, acts.up[perm] / scale)


def _kept(acts: MLPActivations, rows: np.ndarray) -> MLPActivations:
    return MLPActivations(acts.gate[np.sort(rows)], acts.up[np.sort(rows)])


def main() -> None:
    from scanner.zoo import build_zoo

    parser = argparse.ArgumentParser()
    parser.add_argument("--hub", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-zoo", action="store_true", help="only the synthetic hub")
    parser.add_argument("--truth", type=Path, nargs="+", default=[],
                        help="cached zoo folders to check against their ground truth (read, never built), then stop")
    parser.add_argument("--signature-version", type=int, choices=(1, SIGNATURE_VERSION), default=SIGNATURE_VERSION,
                        help=f"1: whole signatures; {SIGNATURE_VERSION} (default): less the unit-choosing direction")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("HUBTRACE_TEST_CACHE") or ".hubtrace-cache"),
                        help="where the zoo is cached (default: HUBTRACE_TEST_CACHE, else .hubtrace-cache)")
    parser.add_argument("--map-thresholds", type=float, nargs="+", default=[MAP_THRESHOLD],
                        help="cosines down to which selected pairs' hits draw their block maps; one run each "
                             "(0.6, the collision threshold: the rule before the map threshold)")
    args = parser.parse_args()
    if args.truth:
        truth_recall(args.truth)
        return
    zoo = build_zoo(args.cache / "zoo")
    fps = {m: fingerprint_model(zoo[m].path) for m in zoo.ids}
    if not args.skip_zoo:
        zoo_recall(fps)

    hub, origins = grow_hub(fps, {m: zoo[m].family for m in zoo.ids}, zoo_block_origins(zoo), args.hub, args.seed)
    started = time.perf_counter()
    params = SignatureParams(version=args.signature_version)
    entries = {(name, "r"): retrieval_entry(fp, params) for name, (fp, _, _) in hub.items()}
    entry_seconds = time.perf_counter() - started
    family = {name: fam for name, (_, fam, _) in hub.items()}
    kind = {name: k for name, (_, _, k) in hub.items()}
    held = {name: frozenset().union(*blocks) for name, blocks in origins.items()}
    truth = {(a, b) for a, b in combinations(sorted(hub), 2) if family[a] == family[b]}
    sharing = {(a, b) for a, b in combinations(sorted(hub), 2) if held[a] & held[b]}
    print(f"synthetic hub: {len(hub)} models, {len(hub) * (len(hub) - 1) // 2} pairs possible, mean family size "
          f"{np.mean([sum(family[m] == family[x] for x in hub) for m in hub]):.1f}, entries {entry_seconds:.1f} s, "
          f"load average {os.getloadavg()[0]:.1f}")
    for map_threshold in args.map_thresholds:
        got, seconds = candidates(entries, map_threshold)
        print(f"map threshold {map_threshold}: {len(got)} candidates ({2 * len(got) / len(hub):.2f} per model), "
              f"{len(got - sharing)} candidates sharing no weights, {len(got - truth)} outside the planted families; "
              f"retrieval {seconds:.1f} s, load average {os.getloadavg()[0]:.1f}")
        for what, pairs in (("pairs sharing weights", sharing), ("pairs of one planted family", truth)):
            missed = pairs - got
            print(f"  {what}: {len(pairs)}, recall {1 - len(missed) / len(pairs):.5f} ({len(missed)} missed; "
                  f"{len(missed - sharing)} of them share no weights)")
            print("    missed by kind:", dict(Counter("/".join(sorted((kind[a], kind[b]))) for a, b in missed)))
        missed_tests(hub, sharing - got, len(hub) * (len(hub) - 1) // 2)


if __name__ == "__main__":
    main()
