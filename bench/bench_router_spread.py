"""How far apart a trained router keeps its experts, against the bar at which experts are read as one.

    python bench/bench_router_spread.py                   # the adversary suite's MoE kinds, seeds 1 and 2
    python bench/bench_router_spread.py --seeds 1 2 3 4   # more trainings

scanner.reading.alike_experts reads two routed experts as one when their logits' difference varies by at most
SAME_LOGIT (1e-3) over the canonical tokens. Each of the suite's MoE kinds (tests.adversary_support.KINDS: Mixtral,
DeepSeek-V3 with a dense first block, Llama 4 interleaved, the Jamba hybrid) is trained as the suite trains it, and on
its canonical tokens (the block's input as the router reads it) every MoE block reports the smallest such spread over
its expert pairs (the pair nearest to being read as one), and its ratio to SAME_LOGIT: how much room an ordinary
model leaves. Printed per kind, seed and block.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.inputs import canonical_inputs  # noqa: E402
from scanner.reading.alike_experts import SAME_LOGIT  # noqa: E402
from scanner.reading.architectures.module_tree import decoder_stack  # noqa: E402
from scanner.reading.architectures.sites import find_sites, router_rows  # noqa: E402
from tests.adversary_support import KINDS, trained_model  # noqa: E402


def smallest_spreads(model: torch.nn.Module) -> list[float]:
    """Per MoE block, the smallest spread over the tokens of two experts' logit difference."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.from_numpy(canonical_inputs(vocab).ids)
    captured, handles, sites = {}, [], []
    for number, layer in enumerate(decoder_stack(model).layers):
        for site in find_sites(layer):
            if site.experts:
                block = layer.get_submodule(site.path.rsplit(".", 1)[0]) if "." in site.path else layer
                sites.append((number, layer, site))
                handles.append(block.register_forward_pre_hook(_keep_first(captured, number), with_kwargs=True))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    spreads = []
    for number, layer, site in sites:
        x = captured[number].reshape(-1, captured[number].shape[-1]).double()
        logits = router_rows(layer, site).double() @ x.T
        differences = logits[:, None, :] - logits[None, :, :]
        spread = differences.amax(dim=2) - differences.amin(dim=2)
        spread.fill_diagonal_(float("inf"))
        spreads.append(float(spread.min()))
    return spreads


def _keep_first(sink: dict, key: int):
    """A pre-hook that keeps the first input of the block holding a site's experts (what the router reads)."""

    def hook(_module, args, kwargs) -> None:
        sink.setdefault(key, (args[0] if args else kwargs["hidden_states"]).detach())

    return hook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print(f"SAME_LOGIT = {SAME_LOGIT:g}; per MoE block: smallest spread of two experts' logit difference "
          "(times SAME_LOGIT)")
    for kind in (k for k in KINDS if k.moe):
        for seed in args.seeds:
            spreads = smallest_spreads(trained_model(kind, seed).eval())
            cells = "  ".join(f"{s:.3f} ({s / SAME_LOGIT:.0f}x)" for s in spreads)
            print(f"{kind.name:16s} seed {seed}: {cells}", flush=True)


if __name__ == "__main__":
    main()
