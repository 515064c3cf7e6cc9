"""Control: a ds3-norm (or glm4moe-norm) trained independently (init seed 2, data seed 2; canonical56's recipe, whose
originals use seed 1; saved under /tmp/canonical63/KIND/independent) tested against the given models, both orders.
Usage: control.py KIND MODEL..."""
import json
import os
import sys
import time
from pathlib import Path

import scanner

CODE = os.environ.get("CANONICAL63_CODE", "/tmp/hubtrace-5273ecc/")
assert scanner.__file__.startswith(CODE), scanner.__file__
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import bench.redteam.canonical49.cases as c49  # noqa: E402
import bench.redteam.canonical56.cases as c56  # noqa: E402
from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.reading.architectures.tiny import tiny_config  # noqa: E402

torch.set_num_threads(2)
RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL63_RESULTS", "results.jsonl"))
kind = {"ds3-norm": c56.V3, "glm4moe-norm": c56.GLM}[sys.argv[1]]
folder = Path(f"/tmp/canonical63/{kind.name}/independent")
if not (folder / "config.json").exists():
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(tiny_config(kind.model_type, **kind.extra))
    batch = c56.pattern_batch(model.config.vocab_size, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c56.TRAIN_LR)
    model.train()
    for _ in range(c56.TRAIN_STEPS):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    c49.save(model.eval(), folder)
fi = fingerprint_model(str(folder))


def p(r):
    return None if r.log10_p is None else round(float(r.log10_p), 2)


for other in sys.argv[2:]:
    t0 = time.time()
    fo = fingerprint_model(other)
    fwd, bwd = compare_fingerprints(fi, fo), compare_fingerprints(fo, fi)
    row = {"case": f"control-{kind.name}-independent-vs-{Path(other).name}", "kind": kind.name, "threads": 2,
           "forward": p(fwd), "backward": p(bwd), "verdict_forward": fwd.verdict()[:160],
           "verdict_backward": bwd.verdict()[:160], "seconds": round(time.time() - t0, 1),
           "false_dependence": any(x is not None and x < -3 for x in (p(fwd), p(bwd)))}
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
