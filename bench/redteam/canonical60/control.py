"""Controls: an independently trained model (canonical59's ds3-norm seed 2, canonical58's ds4-hash seeds 2/12/2) or
an independently initialised one (random OLMoE, seed 2) against the original and canonical60's copies, both orders.
Usage: control.py INDEPENDENT OTHER..."""
import json
import sys
import time
from pathlib import Path

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-8303dba/"), scanner.__file__
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.reading.architectures.tiny import tiny_config  # noqa: E402

torch.set_num_threads(2)
RESULTS = Path(__file__).with_name("results.jsonl")
independent = Path(sys.argv[1])
if not (independent / "config.json").exists() and independent.name == "independent-olmoe-rand":
    torch.manual_seed(2)
    AutoModelForCausalLM.from_config(tiny_config("olmoe")).eval().save_pretrained(independent)
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
