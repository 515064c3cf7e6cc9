"""canonical59 red-team cases (see README.md).

ghost pairs: the pooled test keeps a block's 4096 units of largest magnitude, |up view| x |write| (DeepSeek-V4:
|up view| x output column length). The magnitude does not read the gate. A unit with a tiny gate row eps*g computes
silu(eps g.x) (u.x) ~ eps (g.x)(u.x) / 2: its magnitude is 1/eps times what it writes. Two such units in one expert,
(gate eps*g, up u, down +w) and (gate eps*u, up g, down -w), cancel to second order in eps (their gates differ, so the
canonical form neither groups nor joins them), and each is live (writes `frac` of its expert's output). 2112 pairs per
block (4224 units) outweigh every real unit, so the copy pools ghosts only. eps is a power of two, so half-precision
rounding keeps each pair exact (round(eps g) = eps round(g)) where eps*g stays a normal number.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical56.cases as c56
import bench.redteam.canonical57.cases as c57
import bench.redteam.canonical58.cases as c58
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical59")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL59_RESULTS", "results.jsonl"))
CASES: dict = {}
CODE = os.environ.get("CANONICAL59_CODE", "/tmp/hubtrace-4ea8add/")


@torch.no_grad()
def ghost_pairs(base, n: int = 4224, eps: float = 2.0 ** -20, frac: float = 1e-4, seed: int = 59):
    """``base`` first; then ``n`` ghost units (n / 2 pairs) per block in the routed experts' free (all-zero) slots,
    each pair inside one stored expert, pairs spread round-robin over the experts."""

    def disguise(model, generator):
        m = base(model, generator)
        X = c58.mlp_inputs(m)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        d = X[0].shape[1]
        g = torch.Generator().manual_seed(seed)
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp.experts."
            if p + "gate_up_proj" not in sd:
                continue
            gu = sd[p + "gate_up_proj"].double()
            dn = sd[p + "down_proj"].double()
            E, two_inter, _ = gu.shape
            inter = two_inter // 2
            by_e: dict[int, list[int]] = {}
            for e in range(E):
                for j in range(inter):
                    if gu[e, j].abs().sum() == 0 and gu[e, inter + j].abs().sum() == 0 and dn[e, :, j].abs().sum() == 0:
                        by_e.setdefault(e, []).append(j)
            pairs = []
            depth = 0
            while len(pairs) < n // 2:
                grew = False
                for e in sorted(by_e):
                    if 2 * depth + 1 < len(by_e[e]) and len(pairs) < n // 2:
                        pairs.append((e, by_e[e][2 * depth], by_e[e][2 * depth + 1]))
                        grew = True
                depth += 1
                assert grew, ("not enough free slots", len(pairs), n // 2)
            refmax = {}
            for e in range(E):
                h = torch.nn.functional.silu(x @ gu[e, :inter].T) * (x @ gu[e, inter:].T)
                refmax[e] = float((h @ dn[e].T).norm(dim=1).max())
            top = max(refmax.values())
            for e, j1, j2 in pairs:
                ga = torch.randn(d, generator=g, dtype=torch.float64)
                ua = torch.randn(d, generator=g, dtype=torch.float64)
                ga = ga / (x @ ga).abs().max()
                ua = ua / (x @ ua).abs().max()
                w = torch.randn(d, generator=g, dtype=torch.float64)
                hpk = float((torch.nn.functional.silu(eps * (x @ ga)) * (x @ ua)).abs().max())
                ref = refmax[e] if refmax[e] > 0 else top
                col = w / w.norm() * ref * frac / hpk
                gu[e, j1], gu[e, inter + j1], dn[e, :, j1] = eps * ga, ua, col
                gu[e, j2], gu[e, inter + j2], dn[e, :, j2] = eps * ua, ga, -col
            print(f"layer {i}: {2 * len(pairs)} ghosts in {len({e for e, _, _ in pairs})} experts", flush=True)
            sd[p + "gate_up_proj"] = gu.float()
            sd[p + "down_proj"] = dn.float()
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


CASES["ghost-cover3-ds4-hash"] = ("ds4-hash", lambda: ghost_pairs(c57.cover_shards(3)))
CASES["ghost16-cover3-ds4-hash"] = ("ds4-hash", lambda: ghost_pairs(c57.cover_shards(3), eps=2.0 ** -10, frac=1e-3))
CASES["ghost-cover6w-ds4-hash"] = (
    "ds4-hash", lambda: ghost_pairs(c58.chain(c57.cover_shards(6), c58.widen_experts(12))))
CASES["ghost-cover12w-ds4-hash"] = (
    "ds4-hash", lambda: ghost_pairs(c58.chain(c57.cover_shards(12), c58.widen_experts(88))))
CASES["ghost-cover24w-ds4-hash"] = (
    "ds4-hash", lambda: ghost_pairs(c58.chain(c57.cover_shards(24), c58.widen_experts(268))))
CASES["ghost-widen-ds3-norm"] = ("ds3-norm", lambda: ghost_pairs(c58.widen_experts(1100)))
CASES["ghost-widen-ds4-hash"] = ("ds4-hash", lambda: ghost_pairs(c58.widen_experts(1100)))
CASES["ghost-cover3-ds4-mixed"] = ("ds4-mixed", lambda: ghost_pairs(c57.cover_shards(3)))


@torch.no_grad()
def block_inputs(model) -> list[torch.Tensor]:
    """Each layer's MoE block input on the canonical ids (tokens, d), float64."""
    from scanner.fingerprints.inputs import canonical_inputs
    ids = torch.as_tensor(canonical_inputs(model.config.vocab_size).ids)
    got = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        def pre(mod, args, kwargs, i=i):
            h = args[0] if args else kwargs["hidden_states"]
            got[i] = h.detach().reshape(-1, h.shape[-1]).double()
        hooks.append(layer.mlp.register_forward_pre_hook(pre, with_kwargs=True))
    model(input_ids=ids)
    for h in hooks:
        h.remove()
    return [got[i] for i in range(len(model.model.layers))]


@torch.no_grad()
def widen_intermediate(extra: int, attr: str = "intermediate_size"):
    """Every routed expert (fused experts.gate_up_proj / experts.down_proj) widened by ``extra`` all-zero units, the
    config's ``attr`` raised to match (Mixtral: intermediate_size)."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        setattr(config, attr, getattr(config, attr) + extra)
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
                inter, new = t.shape[1] // 2, want[1] // 2
                z[:, :inter] = t[:, :inter]
                z[:, new:new + inter] = t[:, inter:]
            else:
                z[tuple(slice(0, k) for k in t.shape)] = t
            state[name] = z
        out.load_state_dict(state)
        return out.eval()

    return disguise


@torch.no_grad()
def mimic_pairs(base, n: int = 4224, eps: float = 2.0 ** -20, frac: float = 1e-4, sigma: float = 0.1,
                seed: int = 59):
    """Ghost pairs (as ``ghost_pairs``) in every MLP of a learned-router block (routed experts and the shared
    expert), ``n`` per block spread evenly over its MLPs; the ghosts of MLP j have gate rows near real gate rows of
    MLP (j + 1) mod M (each its own noise: function cosine ~0.995, so no two ghosts are one gate): the expert pairing
    (scanner.stats.experts: gate views of B's sampled units against A's) then pairs the copy's MLP j with the
    original's MLP j + 1. A ghost's up view is another unit's gate view, so no unit agrees in both views."""

    def disguise(model, generator):
        m = base(model, generator)
        X = block_inputs(m)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        g = torch.Generator().manual_seed(seed)
        silu = torch.nn.functional.silu
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp."
            gu = sd[p + "experts.gate_up_proj"].double()
            dn = sd[p + "experts.down_proj"].double()
            E, two_inter, _ = gu.shape
            inter = two_inter // 2
            mlps = [[gu[e, :inter], gu[e, inter:], dn[e]] for e in range(E)]
            has_shared = p + "shared_experts.gate_proj.weight" in sd
            shared = [sd[p + f"shared_experts.{n}.weight"].double() for n in ("gate_proj", "up_proj", "down_proj")
                      ] if has_shared else None
            if has_shared and shared[2].abs().sum() > 0:  # a folded (all-zero) shared expert takes no part in the cycle
                mlps.append(shared)
            M = len(mlps)
            real = []
            free = []
            refs = []
            for G, U, D in mlps:
                nz = (G.abs().sum(1) > 0) | (U.abs().sum(1) > 0) | (D.abs().sum(0) > 0)
                real.append(G[nz].clone())
                free.append(torch.nonzero(~nz).flatten().tolist())
                refs.append(float((silu(x @ G.T) * (x @ U.T) @ D.T).norm(dim=1).max()))
            per = n // M // 2
            for j, (G, U, D) in enumerate(mlps):
                target = real[(j + 1) % M]
                slots = free[j]
                assert len(slots) >= 2 * per, (len(slots), per)

                def near(k, target=target, x=x):
                    row = target[k % target.shape[0]]
                    row = row / (x @ row).norm()
                    noise = torch.randn(row.shape[0], generator=g, dtype=torch.float64)
                    v = row + sigma * noise / (x @ noise).norm()
                    return v / (x @ v).abs().max()

                for q in range(per):
                    ga, ua = near(2 * q), near(2 * q + 1)
                    w = torch.randn(D.shape[0], generator=g, dtype=torch.float64)
                    hpk = float((silu(eps * (x @ ga)) * (x @ ua)).abs().max())
                    col = w / w.norm() * refs[j] * frac / hpk
                    j1, j2 = slots[2 * q], slots[2 * q + 1]
                    G[j1], U[j1], D[:, j1] = eps * ga, ua, col
                    G[j2], U[j2], D[:, j2] = eps * ua, ga, -col
            print(f"layer {i}: {2 * per * M} ghosts in {M} MLPs", flush=True)
            sd[p + "experts.gate_up_proj"] = gu.float()
            sd[p + "experts.down_proj"] = dn.float()
            if has_shared:
                for name, t in zip(("gate_proj", "up_proj", "down_proj"), shared, strict=True):
                    sd[p + f"shared_experts.{name}.weight"] = t.float()
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


@torch.no_grad()
def fold_shared_learned():
    """A learned top-k router whose weights are normalised and scaled (norm_topk_prob, routed_scaling_factor s: the
    chosen experts' weights sum to s): the shared expert's units ride in every routed expert's free (all-zero) slots
    with output columns / s, and the shared expert is stored as zeros. Sum_e w_e shared(x) / s = shared(x)."""

    def disguise(model, generator):
        config = model.config
        assert config.norm_topk_prob
        s = float(config.routed_scaling_factor)
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}.mlp."
            if p + "experts.gate_up_proj" not in sd:
                continue
            gu = sd[p + "experts.gate_up_proj"].double()
            dn = sd[p + "experts.down_proj"].double()
            inter = gu.shape[1] // 2
            sg, su, sdn = (sd[p + f"shared_experts.{n}.weight"].double() for n in ("gate_proj", "up_proj", "down_proj"))
            live = torch.nonzero(sdn.abs().sum(0) > 0).flatten()
            for e in range(gu.shape[0]):
                used = (gu[e, :inter].abs().sum(1) > 0) | (dn[e].abs().sum(0) > 0)
                slots = torch.nonzero(~used).flatten()[:live.numel()]
                assert slots.numel() == live.numel()
                gu[e, slots] = sg[live]
                gu[e, inter + slots] = su[live]
                dn[e][:, slots] = sdn[:, live] / s
            sd[p + "experts.gate_up_proj"] = gu.float()
            sd[p + "experts.down_proj"] = dn.float()
            for n in ("gate_proj", "up_proj", "down_proj"):
                sd[p + f"shared_experts.{n}.weight"] = torch.zeros_like(sd[p + f"shared_experts.{n}.weight"])
        out = copy.deepcopy(model)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


CASES["mimic-fold-ds3-norm"] = (
    "ds3-norm", lambda: mimic_pairs(c58.chain(c58.widen_experts(1200), fold_shared_learned())))
CASES["fold-ds3-norm"] = ("ds3-norm", lambda: c58.chain(c58.widen_experts(1200), fold_shared_learned()))  # baseline
CASES["mimic16-fold-ds3-norm"] = (
    "ds3-norm", lambda: mimic_pairs(c58.chain(c58.widen_experts(1200), fold_shared_learned()), eps=2.0 ** -10,
                                    frac=1e-3))
CASES["mimic-fold-glm4moe-norm"] = (
    "glm4moe-norm", lambda: mimic_pairs(c58.chain(c58.widen_experts(1200), fold_shared_learned())))
CASES["mimic-widen-moe-softmax"] = ("moe-softmax", lambda: mimic_pairs(widen_intermediate(1100)))
CASES["widen-moe-softmax"] = ("moe-softmax", lambda: widen_intermediate(1100))  # baseline
CASES["mimic-widen-ds3-norm"] = ("ds3-norm", lambda: mimic_pairs(c58.widen_experts(1100)))

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
