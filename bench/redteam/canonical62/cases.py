"""canonical62 red-team cases (see README.md): loud units that cancel across a MoE block's MLPs although no two of
them read alike.

`odd_cancel` (ds3-norm, glm4moe-norm, ds4-hash): with a router whose chosen weights sum to a constant s
(norm_topk_prob x routed_scaling_factor), the shared expert is folded into every routed expert (canonical59's
fold_shared_learned), then for each of ``n`` ghost quadruples (gate row k, up row r, output column w):

* the shared expert holds (k, r, s w) and (r, k, -s w);
* EVERY routed expert holds (-k, r, -w) and (-r, k, w).

With silu(z) - silu(-z) = z the block adds s w [(silu(kx) - silu(-kx)) (rx) - (silu(rx) - silu(-rx)) (kx)] =
s w [(kx)(rx) - (rx)(kx)] = 0 on every token. No two of the four hidden rows silu(+-kx)(rx), silu(+-rx)(kx) agree
(up to sign) to 0.9999, so `scanner.stats.canonical.output_sizes` groups none of them across MLPs (the routed copies
of one ghost are grouped with each other, and their sum is loud), and inside one MLP the gates (k and r, or -k and
-r) differ, so `canonical_mlp` folds nothing. Every ghost then counts as loud; the block's pool (cap 4096) holds
ghosts only; identical ghosts in every routed expert make the expert pairing's similarity columns equal, and the
routed experts are rolled (router rows, score-correction biases, and for a hash router its tid2eid table).

`same_cancel` (ds4-hash): canonical61's construction (-G in every routed expert, +s G in the shared expert) on
DeepSeek-V4, whose fingerprint has no write view (several residual streams), so contributions are per-MLP net write
sizes and units are never summed across MLPs (the developers' own note on canonical61's fix).
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

CODE = os.environ.get("CANONICAL62_CODE", "/tmp/hubtrace-c8c164a/")

import bench.redteam.canonical49.cases as c49  # noqa: E402
import bench.redteam.canonical58.cases as c58  # noqa: E402
import bench.redteam.canonical59.cases as c59  # noqa: E402
import bench.redteam.canonical60.cases_random as c60r  # noqa: E402, F401  (registers earlier kinds)
from bench.redteam.case_cli import case_arguments  # noqa: E402

c49.WORK = Path("/tmp/canonical62")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL62_RESULTS", "results.jsonl"))
CASES: dict = {}


def _coarse(v: torch.Tensor, bits: int = 3) -> torch.Tensor:
    """``v`` rounded to ``bits`` bits of mantissa (times 2.5 or 1.5 stays exact in bfloat16 and float16)."""
    mant, exp = torch.frexp(v)
    return torch.ldexp(torch.round(mant * 2 ** bits) / 2 ** bits, exp)


def _scaled(rows: torch.Tensor, x: torch.Tensor, reach: float) -> torch.Tensor:
    """Rows scaled so that their largest |pre-activation| on the block inputs ``x`` is ``reach``, coarsened."""
    return _coarse(rows * reach / (x @ rows.T).abs().max(0).values[:, None])


def _roll(sd: dict, p: str, order: torch.Tensor) -> None:
    """Routed experts of block prefix ``p`` permuted by ``order`` (new expert j = old expert order[j])."""
    sd[p + "experts.gate_up_proj"] = sd[p + "experts.gate_up_proj"][order].clone()
    sd[p + "experts.down_proj"] = sd[p + "experts.down_proj"][order].clone()
    sd[p + "gate.weight"] = sd[p + "gate.weight"][order].clone()
    if p + "gate.e_score_correction_bias" in sd:
        sd[p + "gate.e_score_correction_bias"] = sd[p + "gate.e_score_correction_bias"][order].clone()
    if p + "gate.tid2eid" in sd:
        inverse = torch.argsort(order)
        sd[p + "gate.tid2eid"] = inverse[sd[p + "gate.tid2eid"].long()].to(sd[p + "gate.tid2eid"].dtype)


@torch.no_grad()
def ghost_cancel(style: str, n: int, loud: float = 3.0, shift: int = 1, reach: float = 3.0, seed: int = 62):
    """``style`` "odd": n quadruples as the module says (2n ghost units per MLP); "same": canonical61's n ghosts -G in
    every routed expert and +s G in the shared expert. Then the routed experts rolled by ``shift``."""
    per_mlp = 2 * n if style == "odd" else n

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
            if style == "odd":
                hid = (silu(-(x @ k.T)) * (x @ r.T)).norm(dim=0)
            else:
                hid = (silu(x @ k.T) * (x @ r.T)).norm(dim=0)
            w = torch.randn(d, n, generator=g, dtype=torch.float64)
            w = _coarse(w / w.norm(dim=0) * (loud * top / hid))
            if style == "odd":  # (gate, up, write) of the routed and the shared ghosts
                routed = (torch.cat([-k, -r]), torch.cat([r, k]), torch.cat([-w, w], dim=1))
                shared = (torch.cat([k, r]), torch.cat([r, k]), torch.cat([s * w, -s * w], dim=1))
            else:
                routed, shared = (k, r, -w), (k, r, s * w)
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
            print(f"layer {i}: {style} ghosts, {per_mlp} in each of {experts} routed experts and the shared expert "
                  f"(s={s}), contribution {loud * top:.3g} (largest real {top:.3g}); experts rolled by {shift}",
                  flush=True)
        out = copy.deepcopy(m)
        out.load_state_dict(sd)
        return out.eval()

    return disguise


def seed_search(style: str, n: int, kind: str, shift: int = 1, tries: int = 40, loud: float = 3.0):
    """`ghost_cancel` with the first ghost seed whose copy the public expert pairing pairs with no routed expert of the
    original correctly in any block (a copier runs the tool on his own copy; hash-routed DeepSeek-V4 weighs each
    expert's ghosts by its own routing weights, so the pairing is not tied, only decided by the ghosts' draw)."""

    def disguise(model, generator):
        from scanner.fingerprints.fingerprint import fingerprint_model
        from scanner.pairs.fingerprint_compare import pair_blocks

        original = fingerprint_model(str(c49.WORK / kind / "original"))
        for seed in range(62, 62 + tries):
            out = ghost_cancel(style, n, loud=loud, shift=shift, seed=seed)(copy.deepcopy(model), generator)
            folder = c49.save(out, c49.WORK / kind / "seed-search")
            fp = fingerprint_model(str(folder))
            right = 0
            for layer in range(len(fp.blocks)):
                experts = original.meta.routed_experts(layer)
                pairs = pair_blocks(original, fp, (layer, layer)).pairing.pairs
                right += sum(1 for a, b in pairs if a < experts and b == (a - shift) % experts)
            print(f"seed {seed}: {right} routed experts paired right", flush=True)
            if right == 0:
                return out
        raise RuntimeError("no seed found")

    return disguise


CASES["oddcancel-ds3-norm"] = ("ds3-norm", lambda: ghost_cancel("odd", 416))
CASES["oddcancel0-ds3-norm"] = ("ds3-norm", lambda: ghost_cancel("odd", 416, shift=0))
CASES["oddcancel-loud30-ds3-norm"] = ("ds3-norm", lambda: ghost_cancel("odd", 416, loud=30.0))
CASES["oddcancel-reach1-ds3-norm"] = ("ds3-norm", lambda: ghost_cancel("odd", 416, reach=1.0))
CASES["oddcancel256-ds3-norm"] = ("ds3-norm", lambda: ghost_cancel("odd", 256))
CASES["oddcancel-glm4moe-norm"] = ("glm4moe-norm", lambda: ghost_cancel("odd", 416))
CASES["oddcancel-ds4-hash"] = ("ds4-hash", lambda: ghost_cancel("odd", 416))
CASES["samecancel-ds4-hash"] = ("ds4-hash", lambda: ghost_cancel("same", 832))
CASES["samecancel0-ds4-hash"] = ("ds4-hash", lambda: ghost_cancel("same", 832, shift=0))
CASES["samecancel-seeds-ds4-hash"] = ("ds4-hash", lambda: seed_search("same", 832, "ds4-hash"))
CASES["samecancel-loud30-seeds-ds4-hash"] = ("ds4-hash", lambda: seed_search("same", 832, "ds4-hash", loud=30.0))
CASES["oddcancel-seeds-ds4-hash"] = ("ds4-hash", lambda: seed_search("odd", 416, "ds4-hash"))

#: Where the originals come from (earlier rounds' trained tiny models), linked under /tmp/canonical62.
ORIGINALS = {
    "ds3-norm": "/tmp/canonical56/ds3-norm/original",
    "glm4moe-norm": "/tmp/canonical56/glm4moe-norm/original",
    "ds4-hash": "/tmp/canonical60/ds4-hash/original",
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
