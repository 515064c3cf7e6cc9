"""Why sharedcancel breaks the forward order: the expert pairing (similarity columns) and what the pool holds.
Usage: probe.py ORIGINAL COPY"""
import os
import sys

import numpy as np

import scanner

CODE = os.environ.get("CANONICAL61_CODE", "/tmp/hubtrace-83cea1a/")
assert scanner.__file__.startswith(CODE), scanner.__file__
import torch  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import contributions, pair_fingerprint_experts  # noqa: E402
from scanner.stats.pooled_units import pooled_rows  # noqa: E402

torch.set_num_threads(2)
fa, fb = fingerprint_model(sys.argv[1]), fingerprint_model(sys.argv[2])
for layer in range(len(fa.blocks)):
    paired = pair_fingerprint_experts(fa, fb, layer, layer)
    print(f"block {layer}: pairs (A, B) {paired.pairs}")
    print("  similarity rows A, columns B:\n" + np.array2string(paired.similarity, precision=4))
    for name, fp in (("original", fa), ("copy", fb)):
        c = contributions(fp, layer)
        sizes = [x.size for x in c]
        rows = pooled_rows(c)
        owner = np.searchsorted(np.cumsum([0] + sizes), rows, side="right") - 1
        flat = np.concatenate(c)
        print(f"  {name}: MLP sizes {sizes}, pooled {rows.size}, per MLP {np.bincount(owner).tolist()}, "
              f"pooled contribution min {flat[rows].min():.3g}, largest not pooled "
              f"{np.delete(flat, rows).max() if rows.size < flat.size else float('nan'):.3g}")
