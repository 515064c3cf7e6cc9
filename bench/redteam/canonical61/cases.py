"""canonical61 red-team cases (see README.md): loud units that cancel ACROSS the MLPs of one MoE block.

`shared_cancel` (the break): with a normalised top-k router (DeepSeek-V3, GLM-4.5: the chosen experts' weights sum to
s), ghosts -G in every routed expert and +s G in the shared expert cancel on every token; identical ghosts make the
expert pairing's similarity columns exactly equal, so the pairing falls back to stored order, and the routed
experts are rolled. `split_ring` (held: scanner.reading.alike_experts joins experts chosen together):
`MLPActivations.contribution` (scanner.stats.canonical.output_sizes) joins units that put out one function only
inside one MLP. Here each original expert e is cut into ``m`` pieces (experts e*m .. e*m+m-1 of the copy) whose
router rows are all copies of e's row: their logits tie exactly, so they are always chosen together (top-k x m) and
get exactly equal weights (p_e / m each, whose sum is the original weight; each piece's real units carry a factor m
on their output columns). Each piece p also holds ``h`` loud ghost units +G_p and the ghosts -G_{p-1} of the piece
before it (a ring within the group): identical gate and up rows, opposite output columns. Since the two experts
always get bit-identical weights the ghosts cancel exactly (only float rounding of the sums remains), in any storage
format. Within its own expert a ghost is an ordinary unit, ``loud`` times the block's largest real unit, so the
pooled units (cap 4096) hold ghosts only, and every expert holds a few real units only.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical58.cases as c58
import bench.redteam.canonical59.cases as c59
import bench.redteam.canonical60.cases_random as c60r  # noqa: F401  (registers the random-init originals)
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical61")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL61_RESULTS", "results.jsonl"))
CODE = os.environ.get("CANONICAL61_CODE", "/tmp/hubtrace-83cea1a/")
CASES: dict = {}

_EXPERTS = ("num_local_experts", "num_experts")
_WIDTH = ("moe_intermediate_size", "intermediate_size")


def _attr(config, names):
    return next(n for n in names if getattr(config, n, None) is not None)


@torch.no_grad()
def split_ring(m: int = 32, h: int = 17, loud: float = 3.0, seed: int = 61):
    """Each expert cut into ``m`` always-together pieces, each piece with ``h`` ghosts +G and ``h`` ghosts -G of its
    neighbour in the group (see the module docstring)."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        e_attr, w_attr = _attr(config, _EXPERTS), _attr(config, _WIDTH)
        E, inter, k = getattr(config, e_attr), getattr(config, w_attr), config.num_experts_per_tok
        assert inter % m == 0, (inter, m)
        s = inter // m
        width = -(-(s + 2 * h) // 8) * 8  # grouped_mm wants rows of a multiple of 16 bytes: zero units pad
        setattr(config, e_attr, E * m)
        setattr(config, w_attr, width)
        config.num_experts_per_tok = k * m
        out = type(model)(config).eval()
        sd_in = model.state_dict()
        sd = {key: v.clone() for key, v in out.state_dict().items()}
        for key, v in sd_in.items():
            if "mlp." not in key:
                sd[key] = v.clone()
        X = c59.block_inputs(model)
        g = torch.Generator().manual_seed(seed)
        silu = torch.nn.functional.silu
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp."
            gu = sd_in[p + "experts.gate_up_proj"].double()  # (E, 2 inter, d)
            dn = sd_in[p + "experts.down_proj"].double()  # (E, d, inter)
            router = sd_in[p + "gate.weight"].double()
            d = gu.shape[2]
            ngu = torch.zeros(E * m, 2 * width, d, dtype=torch.float64)
            ndn = torch.zeros(E * m, d, width, dtype=torch.float64)
            top = 0.0
            for e in range(E):
                G, U, D = gu[e, :inter], gu[e, inter:], dn[e] * m
                c = (silu(x @ G.T) * (x @ U.T)).norm(dim=0) * D.norm(dim=0)
                top = max(top, float(c.max()))
            for e in range(E):
                ghosts = []
                for _ in range(m):
                    ga = torch.randn(h, d, generator=g, dtype=torch.float64)
                    ua = torch.randn(h, d, generator=g, dtype=torch.float64)
                    ga = ga / (x @ ga.T).abs().max(0).values[:, None]
                    ua = ua / (x @ ua.T).abs().max(0).values[:, None]
                    hid = (silu(x @ ga.T) * (x @ ua.T)).norm(dim=0)
                    w = torch.randn(d, h, generator=g, dtype=torch.float64)
                    w = w / w.norm(dim=0) * (loud * top / hid)
                    ghosts.append((ga, ua, w))
                for q in range(m):
                    j = e * m + q
                    sl = slice(q * s, (q + 1) * s)
                    ngu[j, :s], ngu[j, width:width + s] = gu[e, :inter][sl], gu[e, inter:][sl]
                    ndn[j, :, :s] = dn[e][:, sl] * m
                    ga, ua, w = ghosts[q]
                    ngu[j, s:s + h], ngu[j, width + s:width + s + h], ndn[j, :, s:s + h] = ga, ua, w
                    ga, ua, w = ghosts[(q - 1) % m]
                    b = slice(s + h, s + 2 * h)
                    ngu[j, b], ngu[j, width + s + h:width + s + 2 * h], ndn[j, :, b] = ga, ua, -w
            sd[p + "experts.gate_up_proj"] = ngu.float()
            sd[p + "experts.down_proj"] = ndn.float()
            sd[p + "gate.weight"] = router.repeat_interleave(m, dim=0).float()
            print(f"layer {i}: {E * m} experts x {width} units ({s} real, {2 * h} ghosts), top-{k * m}, "
                  f"ghost contribution {loud * top:.3g} (largest real {top:.3g})", flush=True)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


def _coarse(v: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """``v`` rounded to ``bits`` bits of mantissa: such a value times 2.5 (or any 3-bit factor) is exact in bfloat16
    and float16 too."""
    mant, exp = torch.frexp(v)
    return torch.ldexp(torch.round(mant * 2 ** bits) / 2 ** bits, exp)


@torch.no_grad()
def shared_cancel(n: int = 832, loud: float = 3.0, shift: int = 1, seed: int = 61):
    """DeepSeek-V3 / GLM-4.5 with norm_topk_prob (the chosen experts' weights sum to s = routed_scaling_factor):
    the shared expert folded into the routed ones (canonical59's fold_shared_learned); then ``n`` loud ghosts -G in
    EVERY routed expert and +s G in the shared expert: sum_chosen w_e (-G) + s G = 0 on every token. Ghost rows have
    3-bit mantissas, so s G is exact in every storage format. Finally the routed experts (with their router rows and
    score-correction biases) are rolled by ``shift``."""

    def disguise(model, generator):
        width = model.config.moe_intermediate_size
        m = c58.chain(c58.widen_experts(2 * width + n - width), c59.fold_shared_learned())(model, generator)
        s = float(m.config.routed_scaling_factor)
        sd = {key: v.clone() for key, v in m.state_dict().items()}
        X = c59.block_inputs(m)
        g = torch.Generator().manual_seed(seed)
        silu = torch.nn.functional.silu
        for i, x in enumerate(X):
            p = f"model.layers.{i}.mlp."
            if p + "experts.gate_up_proj" not in sd:
                continue
            gu = sd[p + "experts.gate_up_proj"].double()
            dn = sd[p + "experts.down_proj"].double()
            E, two, d = gu.shape
            inter = two // 2
            sh = {k: sd[p + f"shared_experts.{k}.weight"].double() for k in ("gate_proj", "up_proj", "down_proj")}
            top = 0.0
            for e in range(E):
                c = (silu(x @ gu[e, :inter].T) * (x @ gu[e, inter:].T)).norm(dim=0) * dn[e].norm(dim=0)
                top = max(top, float(c.max()))
            ga = torch.randn(n, d, generator=g, dtype=torch.float64)
            ua = torch.randn(n, d, generator=g, dtype=torch.float64)
            ga = _coarse(ga / (x @ ga.T).abs().max(0).values[:, None])
            ua = _coarse(ua / (x @ ua.T).abs().max(0).values[:, None])
            hid = (silu(x @ ga.T) * (x @ ua.T)).norm(dim=0)
            w = torch.randn(d, n, generator=g, dtype=torch.float64)
            w = _coarse(w / w.norm(dim=0) * (loud * top / hid))
            for e in range(E):
                used = (gu[e, :inter].abs().sum(1) > 0) | (dn[e].abs().sum(0) > 0)
                slots = torch.nonzero(~used).flatten()[:n]
                assert slots.numel() == n
                gu[e, slots], gu[e, inter + slots], dn[e][:, slots] = ga, ua, -w
            free = torch.nonzero(sh["down_proj"].abs().sum(0) == 0).flatten()[:n]
            assert free.numel() == n
            sh["gate_proj"][free], sh["up_proj"][free], sh["down_proj"][:, free] = ga, ua, s * w
            order = torch.roll(torch.arange(E), -shift)
            sd[p + "experts.gate_up_proj"] = gu[order].float()
            sd[p + "experts.down_proj"] = dn[order].float()
            sd[p + "gate.weight"] = sd[p + "gate.weight"][order].clone()
            if p + "gate.e_score_correction_bias" in sd:
                sd[p + "gate.e_score_correction_bias"] = sd[p + "gate.e_score_correction_bias"][order].clone()
            for k, v in sh.items():
                sd[p + f"shared_experts.{k}.weight"] = v.float()
            print(f"layer {i}: {n} ghosts in each of {E} routed experts and the shared expert (x{s}), contribution "
                  f"{loud * top:.3g} (largest real {top:.3g}); experts rolled by {shift}", flush=True)
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


CASES["ring32-moe-softmax"] = ("moe-softmax", lambda: split_ring(32, 17))
CASES["ring8-moe-softmax"] = ("moe-softmax", lambda: split_ring(8, 72))
CASES["ring32-olmoe-rand"] = ("olmoe-rand", lambda: split_ring(32, 17))
CASES["ring4-qwen3moe-rand"] = ("qwen3moe-rand", lambda: split_ring(4, 5))
CASES["sharedcancel-ds3-norm"] = ("ds3-norm", lambda: shared_cancel())
CASES["sharedcancel-glm4moe-norm"] = ("glm4moe-norm", lambda: shared_cancel())
CASES["sharedcancel0-ds3-norm"] = ("ds3-norm", lambda: shared_cancel(shift=0))
CASES["sharedcancel512-ds3-norm"] = ("ds3-norm", lambda: shared_cancel(n=512))
CASES["sharedcancel-loud30-ds3-norm"] = ("ds3-norm", lambda: shared_cancel(loud=30.0))

#: Where the originals come from (earlier rounds' trained or random-init tiny models), linked under /tmp/canonical61.
ORIGINALS = {
    "ds3-norm": "/tmp/canonical56/ds3-norm/original",
    "glm4moe-norm": "/tmp/canonical56/glm4moe-norm/original",
    "moe-softmax": "/tmp/canonical49/moe-softmax/original",
    "olmoe-rand": "/tmp/canonical60/olmoe-rand/original",
    "qwen3moe-rand": "/tmp/canonical60/qwen3moe-rand/original",
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
