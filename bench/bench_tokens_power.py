"""Benchmark: phi_MATCH power against fingerprint size (input tokens) on the zoo: how many tokens do we need?

    python bench/bench_tokens_power.py                       # 128 ... 4096 tokens (sequences of 64)
    python bench/bench_tokens_power.py --sequences 4 --dtype float32   # the storage dtype's effect

For each token count, every zoo model is fingerprinted once (``fingerprint_model``) and every zoo pair
is compared from fingerprints (``compare_fingerprints``, phi_MATCH, FISHER over blocks). Printed per
token count: the weakest dependent pair's aggregate log10 p, the hard cases (depth prune, retrained
MLPs, long fine-tune, each against aurora-base), the strongest independent pair, how many blocks
``localize`` maps for the hard cases, and the fingerprint size per model. The recommendation is the
smallest count keeping every dependent pair at log10 p <= -20 with no independent pair below -2.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scanner.fingerprints.fingerprint import fingerprint_model
from scanner.fingerprints.inputs import InputSpec
from scanner.pairs.fingerprint_compare import compare_fingerprints
from scanner.pairs.localize import localize
from scanner.zoo import build_zoo

BASE = "aurora-labs/aurora-base"
HARD = {"prune": "kestrel/aurora-lite", "remix": "meridian/aurora-remix", "marathon": "harbor-ai/aurora-marathon"}
GOAL = -20.0


def run(zoo_root: Path, sequences: list[int], seq_len: int, storage_dtype: str) -> None:
    zoo = build_zoo(zoo_root)
    dependent, independent = zoo.pairs(dependent=True), zoo.pairs(dependent=False)
    print(f"# {len(zoo.ids)} zoo models, {len(dependent)} dependent and {len(independent)} independent pairs")
    header = (
        f"{'tokens':>6} {'weakest dep':>11} {'weakest pair':<44} "
        + " ".join(f"{name:>9}" for name in HARD)
        + f" {'best indep':>10} {'dep<=-20':>8} {'localize blocks (prune/remix/marathon)':>38} {'fp s/model':>10}"
    )
    print(header)
    passing = []
    for n_seq in sequences:
        spec = InputSpec(n_sequences=n_seq, seq_len=seq_len)
        start = time.perf_counter()
        fps = {m: fingerprint_model(zoo[m].path, inputs=spec, storage_dtype=storage_dtype) for m in zoo.ids}
        fp_seconds = (time.perf_counter() - start) / len(fps)
        # model_a < model_b, as a scan stores and tests pairs (phi_MATCH is not symmetric in its arguments)
        dep = {pair: compare_fingerprints(fps[min(pair)], fps[max(pair)]).log10_p for pair in dependent}
        ind = {pair: compare_fingerprints(fps[min(pair)], fps[max(pair)]).log10_p for pair in independent}
        hard = {name: compare_fingerprints(fps[BASE], fps[m]).log10_p for name, m in HARD.items()}
        mapped = [
            f"{len(localize(fps[BASE], fps[m]).map)}/{len(fps[m].blocks)}" for m in HARD.values()
        ]
        weakest = max(dep, key=dep.get)
        n_ok = sum(v <= GOAL for v in dep.values())
        best_ind = min(ind.values())
        if n_ok == len(dep) and best_ind > -2:
            passing.append(n_seq * seq_len)
        print(
            f"{n_seq * seq_len:>6} {dep[weakest]:>11.1f} {' vs '.join(weakest):<44} "
            + " ".join(f"{hard[name]:>9.1f}" for name in HARD)
            + f" {best_ind:>10.2f} {n_ok:>4}/{len(dep):<3} {' '.join(mapped):>38} {fp_seconds:>10.2f}",
            flush=True,
        )
    if passing:
        print(f"smallest token count with every dependent pair <= {GOAL} and no independent pair <= -2: {min(passing)}")
    else:
        print(f"no token count tried keeps every dependent pair <= {GOAL}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zoo", type=Path, default=Path(".hubtrace-cache/zoo"))
    parser.add_argument("--sequences", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--seq-len", type=int, default=64, help="tokens per sequence (the zoo's context is 64)")
    parser.add_argument("--dtype", default="float16", choices=("float16", "float32"), help="activation storage")
    args = parser.parse_args()
    run(args.zoo, args.sequences, args.seq_len, args.dtype)


if __name__ == "__main__":
    main()
