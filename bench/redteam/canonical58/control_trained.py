"""Control: a ds4-hash model trained independently (init seed 2, table seed 12, data seed 2; same recipe as
canonical56's hash_original) tested against the original and the canonical58 copies, both orders."""
import json
import sys
import time
from pathlib import Path

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-36acab2/"), scanner.__file__
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import bench.redteam.canonical49.cases as c49  # noqa: E402
import bench.redteam.canonical56.cases as c56  # noqa: E402
from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.reading.architectures.tiny import tiny_config  # noqa: E402

torch.set_num_threads(2)
RESULTS = Path(__file__).with_name("results.jsonl")
folder = Path("/tmp/canonical58/ds4-hash/independent")
if not (folder / "config.json").exists():
    kind = c56.HASH
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(tiny_config(kind.model_type, **kind.extra))
    config = model.config
    generator = torch.Generator().manual_seed(12)
    for layer in model.model.layers:
        table = torch.stack([torch.randperm(config.n_routed_experts, generator=generator)[:config.num_experts_per_tok]
                             for _ in range(config.vocab_size)])
        layer.mlp.gate.tid2eid.copy_(table)
    batch = c56.pattern_batch(config.vocab_size, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=c56.TRAIN_LR)
    model.train()
    for _ in range(c56.TRAIN_STEPS):
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    c49.save(model.eval(), folder)
fi = fingerprint_model(str(folder))
for other in sys.argv[1:]:
    t0 = time.time()
    fo = fingerprint_model(other)
    fwd, bwd = compare_fingerprints(fi, fo), compare_fingerprints(fo, fi)
    def p(r):
        return None if r.log10_p is None else round(float(r.log10_p), 2)
    row = {"case": f"control-trained-independent-vs-{Path(other).name}", "kind": "ds4-hash", "threads": 2,
           "storage": "float32", "forward": p(fwd), "backward": p(bwd), "verdict_forward": fwd.verdict()[:160],
           "verdict_backward": bwd.verdict()[:160], "seconds": round(time.time() - t0, 1),
           "false_dependence": any(x is not None and x < -3 for x in (p(fwd), p(bwd)))}
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
