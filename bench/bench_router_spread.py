"""How far apart a trained router keeps its experts, against what reads two experts as one.

    python bench/bench_router_spread.py                   # the adversary suite's MoE kinds, seeds 1 and 2
    python bench/bench_router_spread.py --seeds 1 2 3 4   # more trainings

scanner.reading.alike_experts reads two routed experts as one when the block chose them on exactly the same canonical
tokens with weights in a constant ratio. Each of the suite's MoE kinds (tests.adversary_support.KINDS: Mixtral,
DeepSeek-V3 with a dense first block, Llama 4 interleaved, the Jamba hybrid) is trained as the suite trains it and run
on its canonical tokens; every MoE block reports, from the routing its experts module was given (or, for Llama 4,
its router returned), the groups
`alike_groups` forms (experts / groups), the smallest number of tokens on which two experts' choices differ (the pair
nearest to being read as one, out of the tokens), and how many experts were chosen on no token; where no routing is
seen it says so (every expert then stays alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scanner.fingerprints.inputs import canonical_inputs  # noqa: E402
from scanner.reading.alike_experts import Routing, alike_groups, observed_routing, routing_from_scores  # noqa: E402
from scanner.reading.architectures.module_tree import decoder_stack  # noqa: E402
from scanner.reading.architectures.names import ROUTER_NAMES  # noqa: E402
from scanner.reading.architectures.sites import find_sites  # noqa: E402
from tests.adversary_support import KINDS, trained_model  # noqa: E402


def block_routings(model: torch.nn.Module) -> list[Routing | None]:
    """Per MoE block, the routing its experts module was called with on the canonical tokens (None: not seen)."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.from_numpy(canonical_inputs(vocab).ids)
    calls: dict[int, tuple] = {}
    outputs: dict[int, object] = {}
    handles, sites = [], []
    for number, layer in enumerate(decoder_stack(model).layers):
        for site in find_sites(layer):
            if site.experts:
                sites.append((number, site.experts))
                handles.append(layer.get_submodule(site.path).register_forward_pre_hook(
                    lambda _m, args, key=number: calls.setdefault(key, tuple(args) + (None,) * 3) and None))
                parent = layer.get_submodule(site.path.rsplit(".", 1)[0]) if "." in site.path else layer
                handles += [child.register_forward_hook(
                    lambda m, _a, out, key=number: outputs.setdefault(key, (out, getattr(m, "top_k", None))) and None)
                    for name, child in parent.named_children() if name in ROUTER_NAMES]
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    routings = []
    for number, experts in sites:
        output, top_k = outputs.get(number, (None, None))
        routings.append(observed_routing(*calls.get(number, (None,) * 3)[1:3], experts)
                        or routing_from_scores(output, experts, top_k))
    return routings


def describe(routing: Routing | None) -> str:
    if routing is None:
        return "routing not seen"
    chosen = routing.weights != 0
    experts, tokens = chosen.shape
    differ = (chosen[:, None, :] != chosen[None, :, :]).sum(dim=2).double()
    differ.fill_diagonal_(float("inf"))
    groups = len(alike_groups(routing, experts))
    idle = int((~chosen.any(dim=1)).sum())
    return f"{experts}/{groups} groups, nearest pair differs on {int(differ.min())}/{tokens} tokens, {idle} idle"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    for kind in (k for k in KINDS if k.moe):
        for seed in args.seeds:
            cells = "; ".join(describe(r) for r in block_routings(trained_model(kind, seed).eval()))
            print(f"{kind.name:16s} seed {seed}: {cells}", flush=True)


if __name__ == "__main__":
    main()
