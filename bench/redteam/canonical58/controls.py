"""Controls: independently initialised tiny MoE models (many experts, pooled test capped at 4096 units) tested against
each other in both orders; a row per pair in results.jsonl (false dependence if log10 p < -3)."""
import json
import sys
import time
from pathlib import Path

import scanner

assert scanner.__file__.startswith("/tmp/hubtrace-36acab2/"), scanner.__file__
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from scanner.fingerprints.fingerprint import fingerprint_model  # noqa: E402
from scanner.pairs.fingerprint_compare import compare_fingerprints  # noqa: E402
from scanner.reading.architectures.tiny import tiny_config  # noqa: E402

torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
RESULTS = Path(__file__).with_name("results.jsonl")
KINDS = {
    "qwen2_moe-128x48": ("qwen2_moe", dict(num_experts=128, moe_intermediate_size=48, shared_expert_intermediate_size=48,  # noqa: E501
                                           num_experts_per_tok=4, num_hidden_layers=2, vocab_size=128)),
    "deepseek_v3-128x48": ("deepseek_v3", dict(n_routed_experts=128, moe_intermediate_size=48, n_shared_experts=1,
                                               num_experts_per_tok=4, first_k_dense_replace=0, n_group=1,
                                               topk_group=1, num_hidden_layers=2, vocab_size=128)),
    "mixtral-96x48": ("mixtral", dict(num_local_experts=96, intermediate_size=48, num_experts_per_tok=2,
                                      num_hidden_layers=2, vocab_size=128)),
}


def build(kind, seed):
    mt, over = KINDS[kind]
    folder = Path(f"/tmp/canonical58/controls/{kind}-seed{seed}")
    if not (folder / "config.json").exists():
        torch.manual_seed(seed)
        m = AutoModelForCausalLM.from_config(tiny_config(mt, **over)).eval()
        m.save_pretrained(folder)
    return str(folder)


for kind in sys.argv[1].split(","):
    t0 = time.time()
    a, b = build(kind, 1), build(kind, 2)
    fa, fb = fingerprint_model(a), fingerprint_model(b)
    fwd, bwd = compare_fingerprints(fa, fb), compare_fingerprints(fb, fa)
    def p(r):
        return None if r.log10_p is None else round(float(r.log10_p), 2)
    row = {"case": f"control-random-{kind}", "kind": kind, "threads": torch.get_num_threads(), "storage": "float32",
           "forward": p(fwd), "backward": p(bwd), "verdict_forward": fwd.verdict()[:160],
           "verdict_backward": bwd.verdict()[:160], "units_a": fa.meta.summaries.get("canonical_units"),
           "units_b": fb.meta.summaries.get("canonical_units"), "seconds": round(time.time() - t0, 1),
           "false_dependence": any(x is not None and x < -3 for x in (p(fwd), p(bwd)))}
    print(json.dumps(row), flush=True)
    with RESULTS.open("a") as f:
        f.write(json.dumps(row) + "\n")
