"""What the members' weight values say (lineage_graph.value_sources), on samples built the way the merge methods
build their weights: every pattern found with exactly its sources, and nothing found among independent or dense
models, nor in a coarse format. Fixed seeds; the statistics behind each finding sit tens to thousands of orders of
magnitude past VERBATIM_LEVEL, so another draw changes no assertion (the synthetic null is checked over 40 models)."""

from __future__ import annotations

import itertools

import numpy as np
import torch

from lineage_graph.evidence import ModelInfo, PairTest
from lineage_graph.lineage import Lineage, compute_lineage
from lineage_graph.value_sources import ValueSources, value_sources

N = 4104
PER_MATRIX = 342
LAYOUT = f"0123456789abcdef/{PER_MATRIX}"


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _base(seed: int = 0) -> np.ndarray:
    return (0.05 * _rng(seed).standard_normal(N)).astype(np.float32)


def _finetune(base: np.ndarray, seed: int, scale: float = 0.005) -> np.ndarray:
    return (base + scale * _rng(seed).standard_normal(N)).astype(np.float32)


def _models(samples: dict[str, np.ndarray], layout: str = LAYOUT) -> dict[str, ModelInfo]:
    return {m: ModelInfo(m, mlp_values=s.astype(np.float32).tobytes(), mlp_layout=layout) for m, s in samples.items()}


def _closeness(samples: dict[str, np.ndarray]) -> dict[tuple[str, str], float]:
    """A stand-in for phi_MATCH's closeness: cosine of the samples' changes from their mean, only their order used."""
    mean = np.mean(list(samples.values()), axis=0)
    out = {}
    for a, b in itertools.combinations(sorted(samples), 2):
        x, y = samples[a] - mean, samples[b] - mean
        out[(a, b)] = float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))
    return out


def _lineage(samples: dict[str, np.ndarray], closeness: dict[tuple[str, str], float],
             rank: dict[str, float] | None = None, with_values: bool = True) -> Lineage:
    """compute_lineage with cards withheld: these members (their samples as values unless ``with_values`` is False,
    activation rank 20 unless given), every pair tested dependent at this closeness."""
    models = [ModelInfo(m, n_layers=4, hidden_size=64, intermediate_size=128,
                        activation_rank=((rank or {}).get(m, 20.0),) * 4,
                        mlp_values=s.tobytes() if with_values else b"", mlp_layout=LAYOUT if with_values else "")
              for m, s in samples.items()]
    return compute_lineage(models, [PairTest(*pair, "match", -50.0, 4, closeness=c) for pair, c in closeness.items()])


def _parents(lineage: Lineage) -> dict[str, set[str]]:
    return {c: {p for p, _ in links} for f in lineage.families for c, links in f.parents.items()}


def _nothing_found(found: ValueSources) -> bool:
    return not (found.merges or found.parents or found.reasons or found.entangled)


def _ties(base: np.ndarray, sources: list[np.ndarray], seed: int, density: float = 0.5) -> np.ndarray:
    """Each source's largest-magnitude changes kept, signs elected, disjoint means: where one source alone is kept the
    merge holds its value, where none is the base's."""
    changes = np.stack([s - base for s in sources])
    kept = np.abs(changes) >= np.quantile(np.abs(changes), 1 - density, axis=1, keepdims=True)
    sign = np.sign((changes * kept).sum(axis=0))
    agree = kept & (np.sign(changes) == sign)
    count = agree.sum(axis=0)
    merged = base + np.where(count > 0, (changes * agree).sum(axis=0) / np.maximum(count, 1), 0.0)
    return merged.astype(np.float32)


def _dare(base: np.ndarray, sources: list[np.ndarray], seed: int, density: float = 0.5) -> np.ndarray:
    """Each source's changes dropped at random, the kept ones rescaled by the realized kept share of each matrix."""
    rng = _rng(seed)
    total = np.zeros(N, dtype=np.float32)
    for s in sources:
        change = s - base
        keep = rng.random(N) < density
        for i in range(0, N, PER_MATRIX):
            part = keep[i:i + PER_MATRIX]
            total[i:i + PER_MATRIX] += np.where(part, change[i:i + PER_MATRIX] / np.float32(part.mean()), 0)
    return (base + total / np.float32(len(sources))).astype(np.float32)


def test_a_ties_merge_is_the_merge_of_its_base_and_sources_and_its_fine_tune_is_nothing() -> None:
    base = _base()
    a, b, c = (_finetune(base, s) for s in (1, 2, 3))
    ties = _ties(base, [a, b], seed=4)
    child = _finetune(ties, 5, scale=0.002)
    found = value_sources(["base", "a", "b", "c", "ties", "child"],
                          _models({"base": base, "a": a, "b": b, "c": c, "ties": ties, "child": child}))
    assert found.merges == {"ties": ("a", "b", "base")}
    assert not found.parents
    assert {link for link in found.reasons} == {("a", "ties"), ("b", "ties"), ("base", "ties")}


def test_sparse_edits_of_one_base_are_its_children_and_a_dare_merge_names_its_sources() -> None:
    """Two DARE merges of one base: each keeps the base's values where every change was dropped (the parent
    pattern), and each one's changes are its sources' exactly rescaled (scaled sources)."""
    base = _base(10)
    a, b, c, d = (_finetune(base, s) for s in (11, 12, 13, 14))
    first, second = _dare(base, [a, b], seed=15), _dare(base, [c, d], seed=16)
    found = value_sources(["base", "a", "b", "c", "d", "first", "second"],
                          _models({"base": base, "a": a, "b": b, "c": c, "d": d, "first": first, "second": second}))
    assert {m: set(s) for m, s in found.merges.items()} == {"first": {"base", "a", "b"}, "second": {"base", "c", "d"}}


def test_a_lone_dare_merge_and_its_base_are_oriented_by_the_scaled_sources() -> None:
    base = _base(20)
    a, b, c = (_finetune(base, s) for s in (21, 22, 23))
    dare = _dare(base, [a, b], seed=24)
    found = value_sources(["base", "a", "b", "c", "dare"],
                          _models({"base": base, "a": a, "b": b, "c": c, "dare": dare}))
    assert found.merges == {"dare": ("base", "a", "b")}


def test_averages_are_merges_of_what_they_average_and_nothing_else_is() -> None:
    """A linear merge (0.3, 0.7), a three-way average and a model stock on a base (per-matrix weights) are found with
    their sources; the sources themselves, expressed back from the merge, need weights outside [0, 1] and are not."""
    base = _base(30)
    a, b, c, d = (_finetune(base, s) for s in (31, 32, 33, 34))
    linear = (0.3 * a + 0.7 * b).astype(np.float32)
    three = ((a + c + d) / np.float32(3)).astype(np.float32)
    t = np.repeat(_rng(35).uniform(0.1, 0.5, N // PER_MATRIX), PER_MATRIX).astype(np.float32)
    stock = (t * (b + c + d) / np.float32(3) + (1 - t) * base).astype(np.float32)
    samples = {"base": base, "a": a, "b": b, "c": c, "d": d, "linear": linear, "three": three, "stock": stock}
    found = value_sources(list(samples), _models(samples), _closeness(samples))
    assert {m: set(s) for m, s in found.merges.items()} == {
        "linear": {"a", "b"}, "three": {"a", "c", "d"}, "stock": {"base", "b", "c", "d"}}
    assert not found.parents


def test_a_task_arithmetic_merge_past_an_average_is_entangled_not_named() -> None:
    """m = b + (x - b) + (y - b): every corner of the relation m + b = x + y reproduces the others, none as an
    average, so no merge is named and the four are entangled (the rank and scale then cast no vote between them)."""
    base = _base(50)
    x, y, other = (_finetune(base, s) for s in (51, 52, 53))
    arithmetic = (base + (x - base) + (y - base)).astype(np.float32)
    samples = {"base": base, "x": x, "y": y, "other": other, "arithmetic": arithmetic}
    found = value_sources(list(samples), _models(samples), _closeness(samples))
    assert not found.merges and found.entangled == {frozenset({"base", "x", "y", "arithmetic"})}
    assert found.entangled_pair("base", "x") and found.entangled_pair("other", "x") is None


def test_independent_dense_and_coarse_models_give_no_finding() -> None:
    """40 independent models, fine-tunes of some of them, and bfloat16 copies of a TIES family (where a fine-tune
    keeps its base's values below the format's resolution): nothing is found."""
    samples = {f"m{k}": _base(100 + k) for k in range(40)}
    samples |= {f"ft{k}": _finetune(samples[f"m{k}"], 200 + k) for k in range(10)}
    assert _nothing_found(value_sources(list(samples), _models(samples), _closeness(samples)))
    base = _base(300)
    a, b = _finetune(base, 301), _finetune(base, 302)
    bf16 = lambda x: torch.from_numpy(x).to(torch.bfloat16).float().numpy()  # noqa: E731
    coarse = {"base": bf16(base), "a": bf16(a), "b": bf16(b), "ties": bf16(_ties(base, [a, b], seed=303))}
    assert not value_sources(list(coarse), _models(coarse)).merges


def test_samples_of_other_layouts_or_lying_samples_are_never_compared() -> None:
    """Another layout, a sample of another length under the same layout, a truncated or non-finite one (a
    fingerprint file is data): none is compared, and nothing fails."""
    base = _base(40)
    a, b = _finetune(base, 41), _finetune(base, 42)
    ties = _ties(base, [a, b], seed=43)
    models = _models({"base": base, "a": a, "b": b}) | _models({"ties": ties}, layout=f"fedcba9876543210/{PER_MATRIX}")
    found = value_sources(list(models), models)
    assert _nothing_found(found) and set(found.compared) == {"base", "a", "b"}
    lying = _models({"base": base, "a": a, "b": b, "short": ties[:-8], "inf": np.where(a > 0, np.inf, a)})
    lying["cut"] = ModelInfo("cut", mlp_values=ties.tobytes()[:-3], mlp_layout=LAYOUT)
    found = value_sources(list(lying), lying, _closeness({"base": base, "a": a, "b": b}))
    assert _nothing_found(found) and set(found.compared) == {"base", "a", "b"}


def test_the_lineage_names_merges_from_values_and_leaves_entangled_links_undecided() -> None:
    """Through compute_lineage, cards withheld: a TIES merge and an average are linked to all their parents with the
    values' reason, and no link among the four models of a task-arithmetic relation is claimed, whatever the
    rank and the scale say (here they point every entangled link the wrong way)."""
    base = _base(60)
    x, y, a, b = (_finetune(base, s) for s in (61, 62, 63, 64))
    samples = {"base": base, "x": x, "y": y, "a": a, "b": b, "ties": _ties(base, [a, b], seed=65),
               "linear": (0.4 * a + 0.6 * y).astype(np.float32),
               "arithmetic": (base + (x - base) + (y - base)).astype(np.float32)}
    rank = {"base": 10.0, "x": 20.0, "y": 20.0, "a": 20.0, "b": 20.0, "ties": 30.0, "linear": 30.0, "arithmetic": 5.0}
    lineage = _lineage(samples, {pair: 0.5 + 0.5 * max(c, 0.0) for pair, c in _closeness(samples).items()}, rank)
    parents = _parents(lineage)
    assert parents["ties"] == {"base", "a", "b"} and parents["linear"] == {"a", "y"}
    assert any(r.startswith("verbatim values:") for r in lineage.edge("base", "ties").direction.reasons)
    assert lineage.edge("a", "linear").direction.claimed and lineage.edge("a", "linear").direction.parent == "a"
    relation = {"base", "x", "y", "arithmetic"}
    entangled = [(p, c) for f in lineage.families for p, c, _ in f.tree_edges() if {p, c} <= relation]
    assert len(entangled) >= 2 and not any(lineage.edge(p, c).direction.claimed for p, c in entangled), entangled


def test_a_later_checkpoint_of_one_run_is_no_merge_of_its_neighbours() -> None:
    """A fine-tune trained further on its own data lies on the line from the base through it: the distances put the
    fine-tune between the two as an average of them would be (merge ratio 0.79, below MERGE_RATIO; closeness as
    version 1 of held-out recipe zoo 27 measured it). Without the values the fine-tune is taken for a merge of its base
    and its own child; with them, which show no merge's signature, it is the middle of a chain, and the link to the
    later checkpoint is left undecided (a merge of the two trained further would have come after both). Its exact
    average, made from the same two, is found as their merge."""
    base = _base(70)
    first = _finetune(base, 71)
    later = (first + 0.4 * (first - base) + 0.001 * _rng(72).standard_normal(N)).astype(np.float32)
    sibling, other = _finetune(base, 73), _finetune(base, 74)
    closeness = {("base", "first"): 0.70, ("first", "later"): 0.93, ("base", "later"): 0.58,
                 ("base", "sibling"): 0.75, ("first", "sibling"): 0.55, ("later", "sibling"): 0.45,
                 ("base", "other"): 0.74, ("first", "other"): 0.54, ("later", "other"): 0.44,
                 ("other", "sibling"): 0.56}
    samples = {"base": base, "first": first, "later": later, "sibling": sibling, "other": other}
    # the distances alone: a merge of the two
    assert _parents(_lineage(samples, closeness, with_values=False))["first"] == {"base", "later"}
    read = _lineage(samples, closeness)
    assert _parents(read)["first"] == {"base"} and _parents(read)["later"] == {"first"}
    link = read.edge("first", "later").direction
    assert link.parent == "first" and not link.claimed
    assert any("no known signature" in r for r in link.reasons)
    found = value_sources(list(samples), _models(samples), closeness)
    assert found.rules_out_merge("first", ("base", "later"))
    average = (0.5 * base + 0.5 * later).astype(np.float32)
    with_average = value_sources([*samples, "average"], _models(samples | {"average": average}),
                                 closeness | {("average", "base"): 0.80, ("average", "later"): 0.80,
                                              ("average", "first"): 0.90, ("average", "sibling"): 0.5,
                                              ("average", "other"): 0.5})
    assert set(with_average.merges["average"]) == {"base", "later"}
    assert not with_average.rules_out_merge("average", ("base", "later"))


def test_a_merge_trained_further_is_never_drawn_above_its_sources() -> None:
    """A merge of two siblings trained a little further is plain (it keeps no value and is no exact average), so the
    values name no merge; it still lies between them. Where its activations read as neither an average of the two
    nor their parent (the rank tells it from neither), the tree, which cannot tell it from the middle of a line of
    training, claims no link between it and either of them (both links undecided with the reason); where they read
    as an average of both (a higher rank than either, as averaging gives), it is drawn as their merge, of a method
    that leaves no known signature, below both."""
    base = _base(80)
    x, y, other = _finetune(base, 81), _finetune(base, 82), _finetune(base, 83)
    tuned = (0.5 * x + 0.5 * y + 0.002 * _rng(84).standard_normal(N)).astype(np.float32)
    samples = {"base": base, "x": x, "y": y, "other": other, "tuned": tuned}
    closeness = {("base", "x"): 0.70, ("base", "y"): 0.70, ("x", "y"): 0.50, ("tuned", "x"): 0.80,
                 ("tuned", "y"): 0.80, ("base", "tuned"): 0.78, ("base", "other"): 0.72, ("other", "x"): 0.50,
                 ("other", "y"): 0.50, ("other", "tuned"): 0.55}
    assert value_sources(list(samples), _models(samples), closeness).rules_out_merge("tuned", ("x", "y"))
    lineage = _lineage(samples, closeness)
    for source in ("x", "y"):
        link = lineage.edge("tuned", source).direction
        assert link.parent is not None and not link.claimed, (source, link)
        assert link.parent == source or any("no known signature" in r for r in link.reasons)
    averaged = _lineage(samples, closeness, rank={"tuned": 30.0})
    assert _parents(averaged)["tuned"] == {"x", "y"}
    for source in ("x", "y"):
        link = averaged.edge("tuned", source).direction
        assert link.parent == source, (source, link)


def test_a_permuted_copy_a_half_retrained_model_and_random_values_are_no_exact_combination() -> None:
    """Exact fits cannot be faked: a combination counts only with bounded weights on well-conditioned sources, to a
    tolerance that does not grow with the weights (scanner.stats.verbatim.exact_combination). Among the relatives
    are a soup and the two models it averages, so three of them are collinear to float32 rounding: least squares
    then finds weights of +-1e5 and more that cancel, and a tolerance scaled by them accepted a model half of whose
    matrices are a fine-tune's verbatim and half retrained (the demo on another machine). A permuted copy (each
    matrix's values shuffled, as a unit permutation moves the sampled positions), the half-retrained model and random
    values reproduce at most half of their values, and none is named a merge or entangled; the soup is named the
    average it is."""
    from scanner.stats.verbatim import exact_combination

    base = _base(30)
    chat, sgd = _finetune(base, 31), _finetune(base, 32, scale=0.01)
    soup = (np.float32(0.6) * chat + np.float32(0.4) * sgd).astype(np.float32)
    rng = _rng(33)
    permuted = np.concatenate([rng.permutation(chat[i:i + PER_MATRIX]) for i in range(0, N, PER_MATRIX)])
    half = N // PER_MATRIX // 2 * PER_MATRIX
    remix = np.concatenate([chat[:half], _finetune(base, 34)[half:]]).astype(np.float32)
    noise = (0.05 * rng.standard_normal(N)).astype(np.float32)
    relatives = [chat, sgd, soup, base]
    assert exact_combination(soup, [chat, sgd], PER_MATRIX).share > 0.99  # the control: an average is exact
    for name, sample in (("permuted", permuted), ("remix", remix), ("noise", noise)):
        for sources in (relatives, [chat, base], [chat, sgd, soup]):
            fit = exact_combination(sample, sources, PER_MATRIX)
            assert fit.share <= 0.55, (name, len(sources), fit.share)
    samples = {"base": base, "chat": chat, "sgd": sgd, "soup": soup, "permuted": permuted, "remix": remix,
               "noise": noise}
    closeness = {pair: c for pair, c in _closeness(samples).items()} | {
        pair: 0.9 for pair in itertools.combinations(sorted(samples), 2) if "noise" in pair}
    found = value_sources(list(samples), _models(samples), closeness)
    assert found.merges == {"soup": ("chat", "sgd")}
    assert not any({"permuted", "remix", "noise"} & relation for relation in found.entangled)
