"""Benchmark: phi_MATCH the paper's way versus fingerprint-then-compare, on zoo models, in one process.

    python bench/bench_paper_vs_fingerprint.py                          # aurora-base vs aurora-chat
    python bench/bench_paper_vs_fingerprint.py --hub-pairs 120          # amortized: every zoo pair

The paper's way, per pair: load both models, and for every block run a full forward pass of each
model to capture that block's MLP input, compute gate and up activations, and match them with scipy's
dense ``linear_sum_assignment``; Spearman, then FISHER. hubtrace's way: ``fingerprint_model`` reads
each checkpoint once (streamed block by block), ``compare_fingerprints`` matches from the fingerprints
with the certified sparse assignment. Part 1 times one dependent pair both ways and checks that the
p-values agree; part 2 is the hub case: N models fingerprinted once and N(N-1)/2 pairs compared,
against the paper's per-pair cost (measured on ``--paper-pairs`` pairs and scaled to all pairs).
"""

from __future__ import annotations

import argparse
import itertools
import time
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.fingerprints.inputs import InputSpec, canonical_inputs, shared_token_range
from scanner.pairs.compare import open_model
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.reading.activations import glu_activations, load_causal_lm, mlp_inputs
from scanner.stats.logp import log10_fisher, log10_matching_p
from scanner.stats.matching import cosine_similarity_matrix, spearman
from scanner.zoo import build_zoo


def _dense_match(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The paper's MATCH: scipy's dense Hungarian on the cosine matrix; the wider side's unit per narrower-side unit."""
    similarity = cosine_similarity_matrix(a, b)
    _, cols = linear_sum_assignment(similarity if a.shape[0] <= b.shape[0] else similarity.T, maximize=True)
    return cols


def paper_way(path_a: Path, path_b: Path, spec: InputSpec) -> list[float]:
    """Per-block log10 p of phi_MATCH as the paper's code computes it: a forward pass per block per model."""
    a, b = open_model(path_a), open_model(path_b)
    ids = canonical_inputs(shared_token_range(a.token_range, b.token_range), spec).ids
    lm_a, lm_b = load_causal_lm(a.checkpoint), load_causal_lm(b.checkpoint)
    per_block = []
    for layer in range(min(a.adapter.shape.n_layers, b.adapter.shape.n_layers)):
        (act_a,) = glu_activations(mlp_inputs(lm_a, a.adapter, ids)[layer], a.adapter.mlp(layer),
                                   activation=a.adapter.shape.hidden_act)
        (act_b,) = glu_activations(mlp_inputs(lm_b, b.adapter, ids)[layer], b.adapter.mlp(layer),
                                   activation=b.adapter.shape.hidden_act)
        by_gate, by_up = _dense_match(act_a.gate, act_b.gate), _dense_match(act_a.up, act_b.up)
        rho = spearman(by_gate.astype(float), by_up.astype(float))
        per_block.append(log10_matching_p(rho, by_gate.size))
    return per_block


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def one_pair(zoo, model_a: str, model_b: str, spec: InputSpec, repeats: int) -> None:
    print(f"## one dependent pair: {model_a} vs {model_b}, {spec.n_sequences * spec.seq_len} tokens")
    paper_times, ours_times = [], []
    for _ in range(repeats):
        paper, seconds = _timed(paper_way, zoo[model_a].path, zoo[model_b].path, spec)
        paper_times.append(seconds)
        start = time.perf_counter()
        fp_a = fingerprint_model(zoo[model_a].path, inputs=spec)
        fp_b = fingerprint_model(zoo[model_b].path, inputs=spec)
        fp_seconds = time.perf_counter() - start
        ours, cmp_seconds = _timed(compare_fingerprints, fp_a, fp_b)
        ours_times.append(fp_seconds + cmp_seconds)
    paper_s, ours_s = min(paper_times), min(ours_times)
    diff = max(abs(x - y.log10_p) for x, y in zip(paper, ours.layers))
    print(
        f"paper way    : {paper_s:.3f} s   log10 p = {log10_fisher(paper):.2f}  "
        f"per block {[round(x, 2) for x in paper]}"
    )
    print(
        f"fingerprints : {ours_s:.3f} s (last run: fingerprints {fp_seconds:.3f} s, compare {cmp_seconds:.3f} s)   "
        f"log10 p = {ours.log10_p:.2f}  per block {[round(x.log10_p, 2) for x in ours.layers]}"
    )
    print(
        f"ratio {paper_s / ours_s:.1f}x (fastest of {repeats} runs each); "
        f"max |per-block log10 p difference| {diff:.2e}"
    )


def hub(zoo, spec: InputSpec, paper_pairs: int) -> None:
    models = list(zoo.ids)
    pairs = list(itertools.combinations(models, 2))
    print(f"## hub: {len(models)} models, {len(pairs)} pairs, {spec.n_sequences * spec.seq_len} tokens")
    start = time.perf_counter()
    fps = {m: fingerprint_model(zoo[m].path, inputs=spec) for m in models}
    fp_seconds = time.perf_counter() - start
    start = time.perf_counter()
    results = {(a, b): compare_fingerprints(fps[a], fps[b]) for a, b in pairs}
    cmp_seconds = time.perf_counter() - start
    sample = pairs[:: max(1, len(pairs) // paper_pairs)][:paper_pairs]
    start = time.perf_counter()
    agree = [abs(log10_fisher(paper_way(zoo[a].path, zoo[b].path, spec)) - results[(a, b)].log10_p) for a, b in sample]
    paper_per_pair = (time.perf_counter() - start) / len(sample)
    paper_total = paper_per_pair * len(pairs)
    ours_total = fp_seconds + cmp_seconds
    print(f"fingerprints : {fp_seconds:.2f} s ({fp_seconds / len(models):.3f} s per model)")
    print(f"compare      : {cmp_seconds:.2f} s ({1000 * cmp_seconds / len(pairs):.1f} ms per pair)")
    print(
        f"paper way    : {paper_per_pair:.3f} s per pair (mean of {len(sample)} pairs) "
        f"-> {paper_total:.1f} s for all pairs"
    )
    print(
        f"ratio {paper_total / ours_total:.1f}x; "
        f"max |aggregate log10 p difference| on the sampled pairs {max(agree):.2e}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=Path(".hubtrace-cache/zoo"))
    parser.add_argument("--a", default="aurora-labs/aurora-base")
    parser.add_argument("--b", default="finch-nlp/aurora-chat")
    parser.add_argument("--sequences", type=int, default=InputSpec.n_sequences)
    parser.add_argument("--seq-len", type=int, default=InputSpec.seq_len)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paper-pairs", type=int, default=12, help="pairs timed the paper's way in part 2")
    args = parser.parse_args()
    zoo = build_zoo(args.zoo)
    spec = InputSpec(n_sequences=args.sequences, seq_len=args.seq_len)
    one_pair(zoo, args.a, args.b, spec, args.repeats)
    hub(zoo, spec, args.paper_pairs)


if __name__ == "__main__":
    main()
