"""Which units each block pools at 8303dba (pooled_rows over MLPActivations.contribution) in an original and its copies:
how many of a copy's pooled units contribute more than the original's largest unit (loud ghosts), the expert pairing,
and the per-block outcome in both orders."""
import sys

import numpy as np

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-8303dba/"), scanner.__file__
import torch  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints, contributions, pair_fingerprint_experts  # noqa: E402
from scanner.stats.pooled_units import pooled_rows  # noqa: E402

torch.set_num_threads(2)
original = fingerprint_model(sys.argv[1])
top = [max(float(c.max()) for c in contributions(original, layer) if c.size) for layer in range(len(original.blocks))]
for path in sys.argv[1:]:
    fp = fingerprint_model(path)
    for layer, mlps in enumerate(fp.blocks):
        sizes = np.concatenate(contributions(fp, layer))
        rows = pooled_rows(contributions(fp, layer))
        big = int((sizes[rows] > top[layer]).sum())
        print(f"{path.split('/')[-1]} block {layer}: {len(mlps)} MLPs, {sizes.size} canonical units, "
              f"pooled {rows.size}, of them contributing more than the original's largest ({top[layer]:.3g}): {big}; "
              f"smallest pooled {float(sizes[rows].min()):.3g}", flush=True)
        if path != sys.argv[1] and len(mlps) <= 16:
            print("  pairing (forward, B=copy):", pair_fingerprint_experts(original, fp, layer, layer).describe(),
                  flush=True)
    if path != sys.argv[1]:
        for a, b in ((original, fp), (fp, original)):
            r = compare_fingerprints(a, b)
            blocks = [(x.layer_a, x.layer_b, None if x.log10_p is None else round(float(x.log10_p), 2), x.n_units,
                       x.cannot_test) for x in r.layers]
            print("  layers (a, b, log10 p, units, cannot test):", blocks, "->", r.verdict()[:100], flush=True)
