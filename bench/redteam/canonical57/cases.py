"""canonical57 red-team cases (see README.md).

cover_shards: DeepSeek-V4 hash-routed experts cut into small blocks, where each token id chooses, for each of its
experts, one of several *different* partitions of the expert's units (not copies of one shard, which cbba292 joins by
function). Every stored expert is a distinct unit subset (so no two compute one function), and no two are chosen on
the same token ids unless their union is still small.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
import bench.redteam.canonical56.cases as c56
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical57")
c49.RESULTS = Path(__file__).with_name(os.environ.get("CANONICAL57_RESULTS", "results.jsonl"))
CASES: dict = {}
CODE = os.environ.get("CANONICAL57_CODE", "/tmp/hubtrace-cbba292/")


def cover_family(inter: int, block: int) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """The stored blocks of one expert of ``inter`` units: their units, their positions, and the partitions.

    k = inter / block positions. Base blocks B_j (units j*block ...) at position j. For i = 1 .. k-1 partition pi_i
    is the base with B_{i-1} and B_i replaced by H_i (B_{i-1} less its first unit, plus B_i's first unit; position
    i-1) and H'_i (B_{i-1}'s first unit plus B_i less its first; position i). pi_0 is the base. Each partition holds one
    block at every position. B_j is chosen on every partition but pi_j and pi_{j+1}; H_i and H'_i only on pi_i (joined
    by the routing, 2 x block units)."""
    k = inter // block
    base = [list(range(j * block, (j + 1) * block)) for j in range(k)]
    blocks = [*base]
    positions = list(range(k))
    partitions = [list(range(k))]
    for i in range(1, k):
        h = base[i - 1][1:] + base[i][:1]
        h2 = base[i - 1][:1] + base[i][1:]
        blocks += [h, h2]
        positions += [i - 1, i]
        part = list(range(k))
        part[i - 1] = len(blocks) - 2
        part[i] = len(blocks) - 1
        partitions.append(part)
    return blocks, positions, partitions


@torch.no_grad()
def cover_shards(block: int = 3, fold_shared: bool = True, seed_partitions: bool = False):
    """See the module docstring. ``fold_shared``: the shared expert is stored as zeros and its units ride along, subset
    p with every stored block at position p (output columns x k / routed_scaling_factor), as canonical56's fold."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        experts = config.n_routed_experts
        inter = config.moe_intermediate_size
        k = inter // block
        assert k * block == inter
        blocks, positions, partitions = cover_family(inter, block)
        per = len(blocks)
        config.n_routed_experts = experts * per
        config.num_experts_per_tok = config.num_experts_per_tok * k
        out = type(model)(config)
        state = {}
        sd = model.state_dict()
        scaling = config.routed_scaling_factor
        for name, t in sd.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                prefix = name.removesuffix("experts.gate_up_proj")
                down_old = sd[prefix + "experts.down_proj"].double()
                gate, up = t.double().chunk(2, dim=1)
                sg = sd[prefix + "shared_experts.gate_proj.weight"].double()
                su = sd[prefix + "shared_experts.up_proj.weight"].double()
                sdn = sd[prefix + "shared_experts.down_proj.weight"].double()
                d = t.shape[-1]
                new_gu = torch.zeros(experts * per, 2 * inter, d, dtype=torch.float64)
                new_dn = torch.zeros(experts * per, down_old.shape[1], inter, dtype=torch.float64)
                for e in range(experts):
                    for b, (units, pos) in enumerate(zip(blocks, positions, strict=True)):
                        s = e * per + b
                        n = len(units)
                        new_gu[s, :n] = gate[e, units]
                        new_gu[s, inter:inter + n] = up[e, units]
                        new_dn[s, :, :n] = down_old[e][:, units] * k
                        if fold_shared:
                            shared = list(range(pos * block, (pos + 1) * block))
                            new_gu[s, n:n + block] = sg[shared]
                            new_gu[s, inter + n:inter + n + block] = su[shared]
                            new_dn[s, :, n:n + block] = sdn[:, shared] * k / scaling
                state[name] = new_gu.float()
                state[prefix + "experts.down_proj"] = new_dn.float()
            elif name.endswith("mlp.experts.down_proj"):
                continue
            elif name.endswith("mlp.gate.weight"):
                state[name] = t.repeat_interleave(per, dim=0).clone()
            elif name.endswith("mlp.gate.e_score_correction_bias"):
                # learned (non-hash) layers: the base blocks of one expert tie and are all chosen; the H blocks carry
                # selection bias -1000 and are never chosen (left out by the grouping).
                never = torch.tensor([0.0] * k + [-1000.0] * (per - k)).repeat(experts)
                state[name] = t.repeat_interleave(per) + never
            elif name.endswith("mlp.gate.tid2eid"):
                vocab, top = t.shape
                table = torch.zeros(vocab, top * k, dtype=t.dtype)
                count = torch.zeros(experts, dtype=torch.int64)
                for tok in range(vocab):
                    for slot in range(top):
                        e = int(t[tok, slot])
                        if seed_partitions:
                            which = int(torch.randint(len(partitions), (1,), generator=generator))
                        else:
                            which = int(count[e]) % len(partitions)
                        count[e] += 1
                        table[tok, slot * k:(slot + 1) * k] = torch.tensor(partitions[which]) + e * per
                state[name] = table
            elif fold_shared and "mlp.shared_experts." in name:
                state[name] = torch.zeros_like(t)
            else:
                state[name] = t
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        return out.eval()

    return disguise


@torch.no_grad()
def loud_twins(log2_scale: int = 14, units: int = 8, fold_shared: bool = True):
    """DeepSeek-V3 (normalised top-k, weights summing to routed_scaling_factor s): every routed expert gets the same
    ``units`` loud units G (gate and up rows random, output columns +-2^log2_scale), and the shared expert gets them
    with output columns x -s, so G cancels on every token (the chosen weights sum to s). Every routed expert's output on
    the canonical tokens is then G plus a part 2^-log2_scale smaller: `same_functions` reads them all as one function
    and joins every routed expert into one. ``fold_shared``: the shared expert's own units ride in every routed expert,
    output columns / s, as canonical56's fold."""

    def disguise(model, generator):
        config = copy.deepcopy(model.config)
        inter = config.moe_intermediate_size
        scaling = config.routed_scaling_factor
        width = inter + (inter if fold_shared else 0) + units
        config.moe_intermediate_size = width
        out = type(model)(config)
        sd = model.state_dict()
        d = config.hidden_size
        g_gate = torch.randn(units, d, generator=generator) / d ** 0.5
        g_up = torch.randn(units, d, generator=generator) / d ** 0.5
        g_down = torch.where(torch.rand(d, units, generator=generator) < 0.5, -1.0, 1.0) * 2.0 ** log2_scale
        state = {}
        for name, t in sd.items():
            if name.endswith("mlp.experts.gate_up_proj"):
                prefix = name.removesuffix("experts.gate_up_proj")
                gate, up = t.chunk(2, dim=1)
                down = sd[prefix + "experts.down_proj"]
                experts = t.shape[0]
                sg, su = sd[prefix + "shared_experts.gate_proj.weight"], sd[prefix + "shared_experts.up_proj.weight"]
                sdn = sd[prefix + "shared_experts.down_proj.weight"]
                gates, ups, downs = [gate], [up], [down]
                if fold_shared:
                    gates.append(sg[None].expand(experts, -1, -1))
                    ups.append(su[None].expand(experts, -1, -1))
                    downs.append((sdn / scaling)[None].expand(experts, -1, -1))
                gates.append(g_gate[None].expand(experts, -1, -1))
                ups.append(g_up[None].expand(experts, -1, -1))
                downs.append(g_down[None].expand(experts, -1, -1))
                state[name] = torch.cat([torch.cat(gates, dim=1), torch.cat(ups, dim=1)], dim=1).clone()
                state[prefix + "experts.down_proj"] = torch.cat(downs, dim=2).clone()
                own = [] if fold_shared else [(sg, su, sdn)]
                zeros = width - units - (0 if fold_shared else inter)
                state[prefix + "shared_experts.gate_proj.weight"] = torch.cat(
                    [*(o[0] for o in own), torch.zeros(zeros, d), g_gate])
                state[prefix + "shared_experts.up_proj.weight"] = torch.cat(
                    [*(o[1] for o in own), torch.zeros(zeros, d), g_up])
                state[prefix + "shared_experts.down_proj.weight"] = torch.cat(
                    [*(o[2] for o in own), torch.zeros(d, zeros), -scaling * g_down], dim=1)
            elif name.endswith("mlp.experts.down_proj") or "mlp.shared_experts." in name:
                continue
            else:
                state[name] = t
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected and not missing, (missing, unexpected)
        return out.eval()

    return disguise


for _s in (10, 14, 17):
    CASES[f"loud{_s}-ds3-norm"] = ("ds3-norm", lambda s=_s: loud_twins(s))
CASES["loud14-nofold-ds3-norm"] = ("ds3-norm", lambda: loud_twins(14, fold_shared=False))
for _b in (2, 3, 4, 6):
    CASES[f"cover{_b}-ds4-hash"] = ("ds4-hash", lambda b=_b: cover_shards(b))
CASES["cover3-ds4-mixed"] = ("ds4-mixed", lambda: cover_shards(3))
CASES["cover3r-ds4-hash"] = ("ds4-hash", lambda: cover_shards(3, seed_partitions=True))
CASES["cover3-nofold-ds4-hash"] = ("ds4-hash", lambda: cover_shards(3, fold_shared=False))
CASES["cover48-nofold-ds4-hash"] = ("ds4-hash", lambda: cover_shards(48, fold_shared=False))
CASES["cover24-ds4-hash"] = ("ds4-hash", lambda: cover_shards(24))
CASES["cover12-ds4-hash"] = ("ds4-hash", lambda: cover_shards(12))
for _name in ("cover3-ds4-hash", "cover48-nofold-ds4-hash"):
    CASES[f"{_name}-streamed"] = CASES[_name]


if __name__ == "__main__":
    import scanner

    assert scanner.__file__.startswith(CODE), scanner.__file__
    c56.hash_original(c56.HASH)
    c56.hash_original(c56.V3)
    c56.hash_original(c56.MIXED)
    threads, dtype, names = case_arguments(sys.argv[1:])
    if any(n.endswith("-streamed") for n in names):
        import scanner.reading.expert_stream as expert_stream

        expert_stream.STREAM_BYTES = 0  # every routed-experts site read expert by expert
    if dtype is not None:
        c49.DTYPE = dtype
    for case in names:
        c49.run(case, threads, CASES)
