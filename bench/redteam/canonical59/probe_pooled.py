"""Which units each block pools (scanner.stats.pooled_units.pooled_rows, by magnitude) in an original and its copies:
how many of a copy's pooled units are larger than the original's largest unit (ghosts), and the per-block outcome."""
import sys

import numpy as np

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-4ea8add/"), scanner.__file__
import torch  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.stats.pooled_units import pooled_rows  # noqa: E402

torch.set_num_threads(2)
original = fingerprint_model(sys.argv[1])
top = [max(float(m.magnitude().max()) for m in mlps if m.gate.shape[0]) for mlps in original.blocks]
for path in sys.argv[1:]:
    fp = fingerprint_model(path)
    for layer, mlps in enumerate(fp.blocks):
        sizes = np.concatenate([m.magnitude() for m in mlps])
        rows = pooled_rows([m.magnitude() for m in mlps])
        big = int((sizes[rows] > top[layer]).sum())
        print(f"{path.split('/')[-1]} block {layer}: {len(mlps)} MLPs, {sizes.size} canonical units, "
              f"pooled {rows.size}, of them above the original's largest ({top[layer]:.3g}): {big}; smallest pooled "
              f"{float(sizes[rows].min()):.3g}", flush=True)
    if path != sys.argv[1]:
        for a, b in ((original, fp), (fp, original)):
            r = compare_fingerprints(a, b)
            blocks = [(x.layer_a, x.layer_b, None if x.log10_p is None else round(float(x.log10_p), 2), x.n_units,
                       x.cannot_test) for x in r.layers]
            print("  layers (a, b, log10 p, units, cannot test):", blocks, "->", r.verdict()[:100], flush=True)
            for note in r.notes:
                print("  note:", note[:300], flush=True)
