"""canonical58 red-team cases (see README.md).

decoy_cap: a copy's MoE block gets more than POOLED_UNITS (4096) live "decoy" units in its shared expert, whose gate
views peak at the first canonical token(s) of the pooled test's fixed token order (np.random.default_rng(0)
.permutation(tokens)). The copy's pooled prefix then stops at those tokens, so the copy pools (almost) only decoys.
Decoys write ~1e-9 of the stream (exact), yet are live: the dead-unit bar weighs each unit against what its own MLP
writes together, and an MLP of decoys only writes little. Combined with canonical57's cover3 (hash-routed experts cut
into pieces, which leaves the experts' test CANNOT TEST / no evidence).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import numpy as np
import torch

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical56.cases as c56
import bench.redteam.canonical57.cases as c57
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical58")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL58_RESULTS", "results.jsonl"))
CASES: dict = {}
CODE = os.environ.get("CANONICAL58_CODE", "/tmp/hubtrace-36acab2/")


@torch.no_grad()
def mlp_inputs(model) -> list[torch.Tensor]:
    """Each layer's shared-expert input on the canonical ids (tokens, d), float64."""
    from scanner.fingerprints.inputs import canonical_inputs
    ids = torch.as_tensor(canonical_inputs(model.config.vocab_size).ids)
    got = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def pre(mod, args, i=i):
            got[i] = args[0].detach().reshape(-1, args[0].shape[-1]).double()
        hooks.append(layer.mlp.shared_experts.register_forward_pre_hook(pre))
    model(input_ids=ids)
    for h in hooks:
        h.remove()
    return [got[i] for i in range(len(model.model.layers))]


@torch.no_grad()
# Not used for any row: in DeepSeek-V4 the shared expert's width is config.intermediate_size, which the routed
# experts share, so widening it alone fails to load (size mismatch); decoy_experts is what the rows use.
def decoy_cap(base=None, n: int = 4224, ranks: int = 1, write: float = 1e-9, scope: str = "all"):
    """``base``: a disguise applied first (None: the copy as it is). Then the shared expert of every MoE block
    (``scope`` "all") is replaced by ``n`` decoys, the original shared expert kept in front of them where the base
    did not fold it. Decoy gates peak at one of the first ``ranks`` tokens of the pooled test's order."""

    def disguise(model, generator):
        m = base(model, generator) if base is not None else model
        X = mlp_inputs(m)
        tokens = X[0].shape[0]
        order = np.random.default_rng(0).permutation(tokens)
        config = copy.deepcopy(m.config)
        sd = m.state_dict()
        old_inter = sd["model.layers.0.mlp.shared_experts.gate_proj.weight"].shape[0]
        keep_old = any(sd[f"model.layers.{i}.mlp.shared_experts.down_proj.weight"].abs().sum() > 0
                       for i in range(len(X)))
        width = n + (old_inter if keep_old else 0)
        config.intermediate_size = width
        out = type(m)(config)
        d = X[0].shape[1]
        g = torch.Generator().manual_seed(58)
        state = dict(sd)
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp.shared_experts."
            gates, ups, downs = [], [], []
            targets = order[:ranks]
            stream = x.norm(dim=1).median()
            made = 0
            sigma = 0.7
            tries = 0
            while made < n:
                t = int(targets[made % ranks])
                xh = x[t] / x[t].norm()
                cand = xh + sigma * torch.randn(d, generator=g, dtype=torch.float64) / d ** 0.5
                pre = x @ cand
                tries += 1
                if int(pre.abs().argmax()) != t:
                    if tries > 50 * (made + 10):
                        sigma *= 0.8
                    continue
                cand = cand * (2.0 / pre.abs().max())
                gates.append(cand)
                u = torch.randn(d, generator=g, dtype=torch.float64)
                ups.append(u / (x @ u).abs().max())
                w = torch.randn(d, generator=g, dtype=torch.float64)
                downs.append(w / w.norm() * stream * write)
                made += 1
            print(f"layer {i}: {n} decoys, sigma {sigma:.3f}, tries {tries}", flush=True)
            G, U, W = torch.stack(gates), torch.stack(ups), torch.stack(downs, dim=1)
            if keep_old:
                G = torch.cat([sd[p + "gate_proj.weight"].double(), G])
                U = torch.cat([sd[p + "up_proj.weight"].double(), U])
                W = torch.cat([sd[p + "down_proj.weight"].double(), W], dim=1)
            state[p + "gate_proj.weight"] = G.float()
            state[p + "up_proj.weight"] = U.float()
            state[p + "down_proj.weight"] = W.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        return out.eval()

    return disguise




@torch.no_grad()
def decoy_experts(base, n: int = 4224, ranks: int = 1, write: float = 1e-5):
    """As decoy_cap, but the decoys ride in the routed experts' free (all-zero) unit slots, spread over the stored
    experts; each writes ``write`` of the most its own expert writes on any canonical token (live against the
    expert's own write), and only where its expert is routed."""

    def disguise(model, generator):
        m = base(model, generator)
        X = mlp_inputs(m)
        tokens = X[0].shape[0]
        order = np.random.default_rng(0).permutation(tokens)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        d = X[0].shape[1]
        g = torch.Generator().manual_seed(58)
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp.experts."
            gu = sd[p + "gate_up_proj"].double()
            dn = sd[p + "down_proj"].double()
            E, two_inter, _ = gu.shape
            inter = two_inter // 2
            free = [(e, j) for e in range(E) for j in range(inter)
                    if gu[e, j].abs().sum() == 0 and dn[e, :, j].abs().sum() == 0]
            assert len(free) >= n, (len(free), n)
            # spread over experts: round robin by expert
            by_e = {}
            for e, j in free:
                by_e.setdefault(e, []).append(j)
            slots = []
            depth = 0
            while len(slots) < n:
                for e in sorted(by_e):
                    if depth < len(by_e[e]) and len(slots) < n:
                        slots.append((e, by_e[e][depth]))
                depth += 1
            refmax = {}
            for e in by_e:
                h = torch.nn.functional.silu(x @ gu[e, :inter].T) * (x @ gu[e, inter:].T)
                refmax[e] = float((h @ dn[e].T).norm(dim=1).max())
            made = 0
            tries = 0
            sigma = 0.7
            targets = order[:ranks]
            while made < n:
                t = int(targets[made % ranks])
                xh = x[t] / x[t].norm()
                cand = xh + sigma * torch.randn(d, generator=g, dtype=torch.float64) / d ** 0.5
                pre = x @ cand
                tries += 1
                if int(pre.abs().argmax()) != t:
                    continue
                cand = cand * (2.0 / pre.abs().max())
                u = torch.randn(d, generator=g, dtype=torch.float64)
                u = u / (x @ u).abs().max()
                hpk = float((torch.nn.functional.silu(x @ cand) * (x @ u)).abs().max())
                w = torch.randn(d, generator=g, dtype=torch.float64)
                e, j = slots[made]
                gu[e, j] = cand
                gu[e, inter + j] = u
                dn[e, :, j] = w / w.norm() * refmax[e] * write / hpk
                made += 1
            print(f"layer {i}: {n} decoys in {len(by_e)} experts, tries {tries}", flush=True)
            sd[p + "gate_up_proj"] = gu.float()
            sd[p + "down_proj"] = dn.float()
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


CASES["xdecoy-cover3-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(c57.cover_shards(3)))
CASES["xdecoy3-cover3-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(c57.cover_shards(3), ranks=3))
CASES["xdecoy-cover4-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(c57.cover_shards(4)))

CASES["cover3-ds4-hash"] = ("ds4-hash", lambda: c57.cover_shards(3))  # canonical57 baseline, no decoys

@torch.no_grad()
def widen_experts(extra: int):
    """Every routed expert widened by ``extra`` all-zero units (dead; dropped by the reading); where the shared
    expert's width follows moe_intermediate_size it is zero-padded too."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        config.moe_intermediate_size = config.moe_intermediate_size + extra
        out = type(model)(config)
        target = out.state_dict()
        state = {}
        for name, t in model.state_dict().items():
            want = target[name].shape
            if t.shape == want:
                state[name] = t
                continue
            z = torch.zeros(want, dtype=t.dtype)
            if name.endswith("experts.gate_up_proj"):
                inter = t.shape[1] // 2
                new = want[1] // 2
                z[:, :inter] = t[:, :inter]
                z[:, new:new + inter] = t[:, inter:]
            else:
                z[tuple(slice(0, s) for s in t.shape)] = t
            state[name] = z
        out.load_state_dict(state)
        return out.eval()

    return disguise


def chain(*disguises):
    def disguise(model, generator):
        for d in disguises:
            model = d(model, generator)
        return model
    return disguise


CASES["xdecoy-widen-ds3-norm"] = ("ds3-norm", lambda: decoy_experts(widen_experts(1100)))
CASES["xdecoy-widen-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(widen_experts(1100)))
CASES["xdecoy-widen-ds4-learned"] = ("ds4-learned", lambda: decoy_experts(widen_experts(1100)))

CASES["xdecoy-cover3-ds4-mixed"] = ("ds4-mixed", lambda: decoy_experts(c57.cover_shards(3)))
CASES["xdecoy-cover6w-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(chain(c57.cover_shards(6), widen_experts(12))))
CASES["xdecoy-cover12w-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(chain(c57.cover_shards(12), widen_experts(88))))
CASES["xdecoy-cover24w-ds4-hash"] = ("ds4-hash", lambda: decoy_experts(chain(c57.cover_shards(24), widen_experts(268))))
CASES["cover6w-ds4-hash"] = ("ds4-hash", lambda: chain(c57.cover_shards(6), widen_experts(12)))  # baseline, no decoys
CASES["cover12w-ds4-hash"] = ("ds4-hash", lambda: chain(c57.cover_shards(12), widen_experts(88)))  # baseline

if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(CODE), scanner.__file__
    c56.hash_original(c56.HASH)
    c56.hash_original(c56.V3)
    c56.hash_original(c56.MIXED)
    c56.hash_original(c56.LEARNED)
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
