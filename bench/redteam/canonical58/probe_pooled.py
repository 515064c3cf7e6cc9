"""Which units each block pools (scanner.stats.pooled_units.pooled_rows) in the original and the decoy copies."""
import sys

import numpy as np

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-36acab2/"), scanner.__file__
import torch  # noqa: E402

torch.set_num_threads(2)
from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.stats.pooled_units import pooled_rows  # noqa: E402

for path in sys.argv[1:]:
    fp = fingerprint_model(path)
    for layer, mlps in enumerate(fp.blocks):
        gates = [m.gate for m in mlps]
        rows = pooled_rows(gates)
        sizes = [g.shape[0] for g in gates]
        total = sum(sizes)
        keys = np.concatenate([np.abs(g.astype(np.float32)).argmax(axis=1) for g in gates if g.shape[0]])
        order = np.random.default_rng(0).permutation(gates[0].shape[1])
        print(f"{path.split('/')[-1]} block {layer}: {len(mlps)} MLPs, {total} canonical units, pooled {rows.size}; "
              f"units keyed at order[0] (token {order[0]}): {(keys == order[0]).sum()}", flush=True)
