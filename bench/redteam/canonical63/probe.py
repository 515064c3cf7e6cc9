"""What the pooled test and the expert pairing see in a copy: per block, each MLP's largest and median contribution,
how many of the pooled units come from each MLP, the pairing (B's expert <- A's) with its similarity matrix, and the
block's log10 p. Usage: probe.py ORIGINAL COPY (reads CANONICAL63_CODE like cases.py)."""
import os
import sys

import scanner

CODE = os.environ.get("CANONICAL63_CODE", "/tmp/hubtrace-5273ecc/")
assert scanner.__file__.startswith(CODE), scanner.__file__
import numpy as np  # noqa: E402
import torch  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints, contributions, pair_blocks  # noqa: E402
from scanner.stats.pooled_units import pooled_rows  # noqa: E402

torch.set_num_threads(2)
fa, fb = fingerprint_model(sys.argv[1]), fingerprint_model(sys.argv[2])
for name, fp in (("original", fa), ("copy", fb)):
    for layer in range(len(fp.blocks)):
        sizes = contributions(fp, layer)
        rows = pooled_rows(sizes)
        owner = np.searchsorted(np.cumsum([s.size for s in sizes]), rows, side="right")
        flat = np.concatenate(sizes)
        print(f"{name} block {layer}: MLP units {[s.size for s in sizes]}, max/median contribution "
              f"{[(round(float(s.max()), 3), round(float(np.median(s)), 3)) for s in sizes]}; pooled {rows.size} "
              f"(per MLP {np.bincount(owner, minlength=len(sizes)).tolist()}), smallest pooled "
              f"{float(flat[rows].min()):.3g}")
for layer in range(min(len(fa.blocks), len(fb.blocks))):
    pair = pair_blocks(fa, fb, (layer, layer))
    print(f"block {layer} pairing {pair.pairing.describe()}\n{np.round(pair.pairing.similarity, 4)}")
for order, r in (("forward", compare_fingerprints(fa, fb)), ("backward", compare_fingerprints(fb, fa))):
    print(order, r.log10_p, [(x.layer_a, None if x.log10_p is None else round(float(x.log10_p), 2)) for x in r.layers])
    print("  notes:", " | ".join(n[:300] for n in r.notes))
