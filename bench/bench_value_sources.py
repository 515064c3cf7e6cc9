"""What the weight-value evidence (lineage_graph.value_sources) costs a lineage rebuild, by family size.

    PYTHONPATH=. python bench/bench_value_sources.py [--sizes 100 300 1000]

Each family is one base, fine-tunes of it, and a TIES merge, a linear merge and a model stock among them, as samples
of 4,096 float32 values (what a fingerprint keeps); closeness falls with the samples' distance. Prints the seconds per
family and per member, and checks that the three merges were named.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from lineage_graph.evidence import ModelInfo
from lineage_graph.value_sources import value_sources

N = 4104
LAYOUT = "0123456789abcdef/342"


def family(size: int, seed: int = 0) -> tuple[dict[str, ModelInfo], dict[tuple[str, str], float]]:
    rng = np.random.default_rng(seed)
    base = (0.05 * rng.standard_normal(N)).astype(np.float32)
    samples = {"base": base}
    for k in range(size - 4):
        samples[f"ft{k:05d}"] = (base + 0.005 * rng.standard_normal(N)).astype(np.float32)
    a, b, c = samples["ft00000"], samples["ft00001"], samples["ft00002"]
    keep = rng.random((2, N)) < 0.3
    samples["ties"] = np.where(keep[0], a, np.where(keep[1], b, base)).astype(np.float32)
    samples["linear"] = (0.5 * a + 0.5 * b).astype(np.float32)
    samples["stock"] = (0.2 * (a + b + c) / 3 + 0.8 * base).astype(np.float32)
    ids = sorted(samples)
    stacked = np.stack([samples[m] for m in ids]).astype(np.float64)
    squared = (stacked ** 2).sum(axis=1)
    distance = np.sqrt(np.maximum(squared[:, None] + squared[None, :] - 2 * stacked @ stacked.T, 0.0))
    closeness = {(x, y): 1.0 - float(distance[i, j] / distance.max()) for i, x in enumerate(ids)
                 for j, y in enumerate(ids) if i < j}
    return {m: ModelInfo(m, mlp_values=s.tobytes(), mlp_layout=LAYOUT) for m, s in samples.items()}, closeness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000])
    args = parser.parse_args()
    print("| family members | seconds | ms per member | merges named |")
    print("|---|---|---|---|")
    for size in args.sizes:
        models, closeness = family(size)
        start = time.perf_counter()
        found = value_sources(list(models), models, closeness)
        seconds = time.perf_counter() - start
        named = sorted(m for m in ("ties", "linear", "stock") if m in found.merges)
        print(f"| {size} | {seconds:.1f} | {1000 * seconds / size:.0f} | {', '.join(named)} |", flush=True)


if __name__ == "__main__":
    main()
