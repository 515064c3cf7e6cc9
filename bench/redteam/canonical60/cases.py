"""canonical60 red-team cases (see README.md).

8303dba ranks units by `MLPActivations.contribution`: the length of the unit's hidden row on the canonical tokens
(act(gate) * up) times its write size. canonical59's ghost pairs had a tiny gate (eps = 2^-20) and wrote 1e-4 of
their expert, so they now rank last. Here the same pairs are made LOUD: the output column is scaled so that each
ghost's contribution is ``loud`` times the largest contribution of any real unit in its block. A pair
(gate eps*g, up u, down +w), (gate eps*u, up g, down -w) still cancels to second order in eps:
silu(eps a) b - silu(eps b) a = eps^2 a b (a - b) / 4 + O(eps^3), i.e. eps (a - b) / 2 of each ghost's output.
With eps = 2^-20 the residual is ~1e-6 of a ghost's output, so ghosts 30x louder than any real unit leave the logits
within ~1e-5. Contribution is what a unit writes on its own; it cannot see that two units cancel, and the canonical
form does not join them (one column, but gates far below SAME_GATE_COSINE).
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
import bench.redteam.canonical59.cases as c59
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical60")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL60_RESULTS", "results.jsonl"))
CASES: dict = {}
CODE = os.environ.get("CANONICAL60_CODE", "/tmp/hubtrace-8303dba/")


def _largest_real(x, mlps, silu) -> float:
    """The largest |hidden row| x |output column| among the block's real (non-zero) units on inputs ``x``."""
    top = 0.0
    for G, U, D in mlps:
        h = silu(x @ G.T) * (x @ U.T)
        c = h.norm(dim=0) * D.norm(dim=0)
        top = max(top, float(c.max()))
    return top


@torch.no_grad()
def loud_pairs(base, n: int = 4224, eps: float = 2.0 ** -20, loud: float = 30.0, sigma: float = 0.1,
               mimic: bool = True, seed: int = 60):
    """Ghost pairs as canonical59's ``mimic_pairs`` (gates of MLP j's ghosts near real gates of MLP j+1 when
    ``mimic``, random otherwise), each ghost's output column scaled so its contribution (hidden row length on the
    canonical tokens x column length) is ``loud`` x the block's largest real unit's."""

    def disguise(model, generator):
        m = base(model, generator)
        X = c59.block_inputs(m)
        sd = {k: v.clone() for k, v in m.state_dict().items()}
        g = torch.Generator().manual_seed(seed)
        silu = torch.nn.functional.silu
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp."
            if p + "experts.gate_up_proj" not in sd:
                continue
            gu = sd[p + "experts.gate_up_proj"].double()
            dn = sd[p + "experts.down_proj"].double()
            E, two_inter, _ = gu.shape
            inter = two_inter // 2
            mlps = [[gu[e, :inter], gu[e, inter:], dn[e]] for e in range(E)]
            has_shared = p + "shared_experts.gate_proj.weight" in sd
            shared = [sd[p + f"shared_experts.{n}.weight"].double() for n in ("gate_proj", "up_proj", "down_proj")
                      ] if has_shared else None
            if has_shared and shared[2].abs().sum() > 0:
                mlps.append(shared)
            M = len(mlps)
            top = _largest_real(x, mlps, silu)
            real, free = [], []
            for G, U, D in mlps:
                nz = (G.abs().sum(1) > 0) | (U.abs().sum(1) > 0) | (D.abs().sum(0) > 0)
                real.append(G[nz].clone())
                free.append(torch.nonzero(~nz).flatten().tolist())
            per = n // M // 2
            for j, (G, U, D) in enumerate(mlps):
                target = real[(j + 1) % M] if mimic else None
                slots = free[j]
                assert len(slots) >= 2 * per, (len(slots), per)

                def near(k, target=target, x=x):
                    noise = torch.randn(x.shape[1], generator=g, dtype=torch.float64)
                    if target is None:
                        v = noise
                    else:
                        row = target[k % target.shape[0]]
                        row = row / (x @ row).norm()
                        v = row + sigma * noise / (x @ noise).norm()
                    return v / (x @ v).abs().max()

                for q in range(per):
                    ga, ua = near(2 * q), near(2 * q + 1)
                    w = torch.randn(D.shape[0], generator=g, dtype=torch.float64)
                    h1 = (silu(eps * (x @ ga)) * (x @ ua)).norm()
                    h2 = (silu(eps * (x @ ua)) * (x @ ga)).norm()
                    col = w / w.norm() * loud * top / float(min(h1, h2))
                    j1, j2 = slots[2 * q], slots[2 * q + 1]
                    G[j1], U[j1], D[:, j1] = eps * ga, ua, col
                    G[j2], U[j2], D[:, j2] = eps * ua, ga, -col
            print(f"layer {i}: {2 * per * M} loud ghosts in {M} MLPs (largest real contribution {top:.3g})",
                  flush=True)
            sd[p + "experts.gate_up_proj"] = gu.float()
            sd[p + "experts.down_proj"] = dn.float()
            if has_shared:
                for name, t in zip(("gate_proj", "up_proj", "down_proj"), shared, strict=True):
                    sd[p + f"shared_experts.{name}.weight"] = t.float()
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


def _fold():
    return c58.chain(c58.widen_experts(1200), c59.fold_shared_learned())


CASES["loud-fold-ds3-norm"] = ("ds3-norm", lambda: loud_pairs(_fold()))
CASES["loud3-fold-ds3-norm"] = ("ds3-norm", lambda: loud_pairs(_fold(), loud=3.0))
CASES["loud-fold-glm4moe-norm"] = ("glm4moe-norm", lambda: loud_pairs(_fold()))
CASES["loud-widen-moe-softmax"] = ("moe-softmax", lambda: loud_pairs(c59.widen_intermediate(1100)))
CASES["loud-cover3-ds4-hash"] = ("ds4-hash", lambda: loud_pairs(c57.cover_shards(3), mimic=False))
CASES["loud-widen-ds3-norm"] = ("ds3-norm", lambda: loud_pairs(c58.widen_experts(1100)))
CASES["loud16-fold-ds3-norm"] = ("ds3-norm", lambda: loud_pairs(_fold(), eps=2.0 ** -10))
CASES["loud16x3-fold-ds3-norm"] = ("ds3-norm", lambda: loud_pairs(_fold(), eps=2.0 ** -10, loud=3.0))
CASES["loud16x3-cover3-ds4-hash"] = ("ds4-hash", lambda: loud_pairs(c57.cover_shards(3), eps=2.0 ** -10, loud=3.0,
                                                                    mimic=False))

if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(CODE), scanner.__file__
    c56.hash_original(c56.HASH)
    c56.hash_original(c56.V3)
    c56.hash_original(c56.MIXED)
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
