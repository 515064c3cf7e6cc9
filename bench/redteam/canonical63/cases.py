"""canonical63 red-team cases (see README.md): loud units that cancel across a MoE block's MLPs while their writes
span three directions, so no group of units writing along one direction sums to nothing.

`tri_cancel` (ds3-norm, glm4moe-norm): with a router whose chosen weights sum to a constant s
(norm_topk_prob x routed_scaling_factor), the shared expert is folded into every routed expert (canonical59's
fold_shared_learned), then for each of ``n`` ghost triples (gate row k, up row r, writes w1, w2, w3 = -(w1 + w2)):

* the shared expert holds (k, r, s w1), (r, k, s w2), (2k, r/2, s w3);
* EVERY routed expert holds (-k, r, -w1), (-r, k, -w2), (-2k, r/2, -w3).

With silu(z) - silu(-z) = z each write direction j adds s (kx)(rx) w_j on every token (loud), and the three add
s (kx)(rx) (w1 + w2 + w3) = 0. `scanner.stats.canonical.output_sizes` groups units whose writes agree to 0.9999 and
counts each group for its summed output: the w1 group (shared + 4 routed) sums to s (kx)(rx) w1, not 0. Inside one
MLP no two gates are opposite (k, r, 2k in the shared expert; -k, -r, -2k in every routed one), so `canonical_mlp`
folds nothing either. The routed experts are then rolled (router rows, score-correction biases).

Writes are small integer vectors (entries in [-7, 7]) times a power of two, so -w3 = w1 + w2 and s * w_j are exact in
float32, bfloat16 and float16.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

CODE = os.environ.get("CANONICAL63_CODE", "/tmp/hubtrace-5273ecc/")

import bench.redteam.canonical49.cases as c49  # noqa: E402
import bench.redteam.canonical58.cases as c58  # noqa: E402
import bench.redteam.canonical59.cases as c59  # noqa: E402
import bench.redteam.canonical60.cases_random as c60r  # noqa: E402, F401  (registers earlier kinds)
from bench.redteam.case_cli import case_arguments  # noqa: E402

c49.WORK = Path("/tmp/canonical63")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL63_RESULTS", "results.jsonl"))
CASES: dict = {}


def _coarse(v: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """``v`` rounded to ``bits`` bits of mantissa."""
    mant, exp = torch.frexp(v)
    return torch.ldexp(torch.round(mant * 2 ** bits) / 2 ** bits, exp)


def _scaled(rows: torch.Tensor, x: torch.Tensor, reach: float) -> torch.Tensor:
    """Rows scaled so that their largest |pre-activation| on the block inputs ``x`` is ``reach``, coarsened."""
    return _coarse(rows * reach / (x @ rows.T).abs().max(0).values[:, None])


def _roll(sd: dict, p: str, order: torch.Tensor) -> None:
    """Routed experts of block prefix ``p`` permuted by ``order`` (new expert j = old expert order[j])."""
    for key in ("experts.gate_up_proj", "experts.down_proj", "gate.weight", "gate.e_score_correction_bias"):
        if p + key in sd:
            sd[p + key] = sd[p + key][order].clone()


def _pow2(v: torch.Tensor) -> torch.Tensor:
    return torch.exp2(torch.round(torch.log2(v)))


@torch.no_grad()
def tri_cancel(n: int, loud: float = 3.0, shift: int = 1, reach: float = 3.0, seed: int = 63, dirs: int = 3):
    """n ghost groups as the module says (``dirs`` units per MLP each: writes w_1..w_{dirs-1} and
    w_dirs = -(their sum); unit j uses gate 2^(j//2) k or r, up r / 2^(j//2) or k), then the routed experts rolled by
    ``shift``."""
    per_mlp = dirs * n

    def disguise(model, generator):
        width = model.config.moe_intermediate_size
        m = c58.chain(c58.widen_experts(width + per_mlp), c59.fold_shared_learned())(model, generator)
        s = float(m.config.routed_scaling_factor)
        sd = {key: v.clone() for key, v in m.state_dict().items()}
        inputs = c59.block_inputs(m)
        g = torch.Generator().manual_seed(seed)
        silu = torch.nn.functional.silu
        for i, x in enumerate(inputs):
            p = f"model.layers.{i}.mlp."
            if p + "experts.gate_up_proj" not in sd:
                continue
            gu = sd[p + "experts.gate_up_proj"].double()
            dn = sd[p + "experts.down_proj"].double()
            experts, two, d = gu.shape
            inter = two // 2
            sh = {k: sd[p + f"shared_experts.{k}.weight"].double() for k in ("gate_proj", "up_proj", "down_proj")}
            top = 0.0
            for e in range(experts):
                c = (silu(x @ gu[e, :inter].T) * (x @ gu[e, inter:].T)).norm(dim=0) * dn[e].norm(dim=0)
                top = max(top, float(c.max()))
            k = _scaled(torch.randn(n, d, generator=g, dtype=torch.float64), x, reach)
            r = _scaled(torch.randn(n, d, generator=g, dtype=torch.float64), x, reach)
            hid = ((x @ k.T) * (x @ r.T)).norm(dim=0)  # |(kx)(rx)| over the tokens: each direction's output / s
            ints = [torch.randint(-7, 8, (d, n), generator=g).double() for _ in range(dirs - 1)]
            ints.append(-sum(ints))
            scale = _pow2(loud * top / (hid * ints[0].norm(dim=0)))
            ws = [v * scale for v in ints]
            gates, ups = [], []
            for j in range(dirs):
                f = 2.0 ** (j // 2)
                a, b = (k, r) if j % 2 == 0 else (r, k)
                gates.append(a * f)
                ups.append(b / f)
            routed = (-torch.cat(gates), torch.cat(ups), -torch.cat(ws, dim=1))
            shared = (torch.cat(gates), torch.cat(ups), s * torch.cat(ws, dim=1))
            for e in range(experts):
                used = (gu[e, :inter].abs().sum(1) > 0) | (dn[e].abs().sum(0) > 0)
                slots = torch.nonzero(~used).flatten()[:per_mlp]
                assert slots.numel() == per_mlp
                gu[e, slots], gu[e, inter + slots], dn[e][:, slots] = routed
            free = torch.nonzero(sh["down_proj"].abs().sum(0) == 0).flatten()[:per_mlp]
            assert free.numel() == per_mlp
            sh["gate_proj"][free], sh["up_proj"][free], sh["down_proj"][:, free] = shared
            sd[p + "experts.gate_up_proj"] = gu.float()
            sd[p + "experts.down_proj"] = dn.float()
            for key, v in sh.items():
                sd[p + f"shared_experts.{key}.weight"] = v.float()
            _roll(sd, p, torch.roll(torch.arange(experts), -shift))
            print(f"layer {i}: {dirs}-direction ghosts, {per_mlp} in each of {experts} routed experts and the shared "
                  f"expert (s={s}), per-direction output ~{loud * top:.3g} (largest real {top:.3g}); rolled {shift}",
                  flush=True)
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


CASES["tricancel-ds3-norm"] = ("ds3-norm", lambda: tri_cancel(280))
CASES["tricancel0-ds3-norm"] = ("ds3-norm", lambda: tri_cancel(280, shift=0))
CASES["tricancel-loud30-ds3-norm"] = ("ds3-norm", lambda: tri_cancel(280, loud=30.0))
CASES["tricancel160-ds3-norm"] = ("ds3-norm", lambda: tri_cancel(160))
CASES["quadcancel-ds3-norm"] = ("ds3-norm", lambda: tri_cancel(210, dirs=4))
CASES["tricancel-glm4moe-norm"] = ("glm4moe-norm", lambda: tri_cancel(280))

#: Where the originals come from (earlier rounds' trained tiny models), linked under /tmp/canonical63.
ORIGINALS = {
    "ds3-norm": "/tmp/canonical56/ds3-norm/original",
    "glm4moe-norm": "/tmp/canonical56/glm4moe-norm/original",
}


def link_originals() -> None:
    for kind, source in ORIGINALS.items():
        link = c49.WORK / kind / "original"
        if not link.exists() and Path(source).exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(source)


if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(CODE), scanner.__file__
    link_originals()
    threads, dtype, names = case_arguments(sys.argv[1:])
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
