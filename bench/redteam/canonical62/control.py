"""Controls: an independently trained model (canonical59's ds3-norm/glm4moe-norm seed 2) against the original and
canonical62's copies, both orders. Usage: control.py INDEPENDENT OTHER..."""
import json
import os
import sys
import time
from pathlib import Path

import scanner

CODE = os.environ.get("CANONICAL62_CODE", "/tmp/hubtrace-c8c164a/")
assert scanner.__file__.startswith(CODE), scanner.__file__
import torch  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402

torch.set_num_threads(2)
RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL62_RESULTS", "results.jsonl"))
independent = Path(sys.argv[1])
fi = fingerprint_model(str(independent))


def p(r):
    return None if r.log10_p is None else round(float(r.log10_p), 2)


for other in sys.argv[2:]:
    t0 = time.time()
    fo = fingerprint_model(other)
    fwd, bwd = compare_fingerprints(fi, fo), compare_fingerprints(fo, fi)
    row = {"case": f"control-{independent.parent.name}-{independent.name}-vs-{Path(other).name}", "threads": 2,
           "forward": p(fwd), "backward": p(bwd), "verdict_forward": fwd.verdict()[:160],
           "verdict_backward": bwd.verdict()[:160], "seconds": round(time.time() - t0, 1),
           "false_dependence": any(x is not None and x < -3 for x in (p(fwd), p(bwd)))}
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
