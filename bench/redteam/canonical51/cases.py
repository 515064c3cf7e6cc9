"""canonical51 red-team cases (see README.md).

bias-sink: the dead-unit bar (`_written_on_inputs`) measures each unit against what the whole MLP writes on the
canonical inputs, computed as hidden @ down^T: the output map's bias is not part of it (SiteWeights holds none). A
copier adds one constant unit per MLP (gate row 0, gate bias 32: SiLU(32) = 32 exactly in float32; up row 0, up bias
B) whose column is BIG along a coordinate the stream never uses (the stream widened by always-zero coordinates,
tests/fixtures/null_shift.widened / canonical49.widened_any), and an output bias of exactly -32 B BIG there. All
three factors are powers of two, so the sink writes C = 2^e and the bias takes it back exactly: the new coordinate
stays exactly 0 and no other coordinate changes. The MLP's bias-free output on the inputs is then about C, and every
real unit writes less than DEAD = 1e-6 of it.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
from bench.redteam.case_cli import case_arguments

c49.WORK = Path("/tmp/canonical51")
c49.RESULTS = Path(__file__).with_name("results.jsonl")


@torch.no_grad()
def bias_sink(exponent: int = 40, extra: int = 4, sinks: int = 1, mantissa: float = 1.0, every: bool = False):
    """Llama-layout gated MLP: widened by ``extra`` zero coordinates, mlp_bias on (all real biases 0), ``sinks``
    constant units per MLP writing ``mantissa`` x 2^``exponent`` (a few significant bits: exact) along the first new
    coordinate (``every``: along every new coordinate, each 2^``exponent``: float16 holds at most 65504), taken back by
    the output bias."""

    def disguise(model, generator):
        wide = c49.widened_any(model, extra)
        config = copy.deepcopy(wide.config)
        d = model.config.hidden_size
        inter = config.intermediate_size
        config.mlp_bias = True
        config.intermediate_size = inter + sinks
        out = type(wide)(config)
        state = {}
        gate_bias, up_bias = 32.0, 2.0 ** 4
        column = mantissa * 2.0 ** exponent / (gate_bias * up_bias) / sinks
        for name, t in wide.state_dict().items():
            t = t.double()
            if name.endswith("mlp.gate_proj.weight") or name.endswith("mlp.up_proj.weight"):
                t = torch.cat([t, torch.zeros(sinks, t.shape[1], dtype=t.dtype)])
                bias = torch.zeros(inter + sinks, dtype=t.dtype)
                bias[inter:] = gate_bias if "gate_proj" in name else up_bias
                state[name.replace(".weight", ".bias")] = bias.float()
            elif name.endswith("mlp.down_proj.weight"):
                new = torch.zeros(t.shape[0], sinks, dtype=t.dtype)
                new[d:, :] = column if every else 0.0
                new[d, :] = column
                t = torch.cat([t, new], dim=1)
                bias = torch.zeros(t.shape[0], dtype=t.dtype)
                bias[d:] = -mantissa * 2.0 ** exponent if every else 0.0
                bias[d] = -mantissa * 2.0 ** exponent
                state[name.replace(".weight", ".bias")] = bias.float()
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        out = out.eval()
        return _shuffled(out, generator)

    return disguise


def _shuffled(model, generator):
    """Every MLP's units (biases with them) in a random order."""
    for layer in model.model.layers:
        mlp = layer.mlp
        order = torch.randperm(mlp.gate_proj.weight.shape[0], generator=generator)
        for lin in (mlp.gate_proj, mlp.up_proj):
            lin.weight.data = lin.weight.data[order].contiguous()
            if lin.bias is not None:
                lin.bias.data = lin.bias.data[order].contiguous()
        mlp.down_proj.weight.data = mlp.down_proj.weight.data[:, order].contiguous()
    return model


CASES = {
    "biassink40-gated": ("gated", lambda: bias_sink(40)),
    "biassink20-gated": ("gated", lambda: bias_sink(20)),
    "biassink40x192-gated": ("gated", lambda: bias_sink(40, extra=192)),
}
CASES.update({f"biassink{e}-gated": ("gated", lambda e=e: bias_sink(e)) for e in (4, 6, 8, 10, 12, 14, 16, 17, 18, 19)})
CASES["biassink15every192-gated"] = ("gated", lambda: bias_sink(15, extra=192, every=True))
CASES["biassink15m2every960-gated"] = ("gated", lambda: bias_sink(15, extra=960, every=True, mantissa=65504 / 32768))
CASES["control-widen-bias-nosink-gated"] = ("gated", lambda: bias_sink(40, mantissa=0.0))
MANTISSAS = (1.25, 1.375, 1.4375, 1.5, 1.75)
CASES.update({f"biassink19m{m}-gated": ("gated", lambda m=m: bias_sink(19, mantissa=m)) for m in MANTISSAS})



@torch.no_grad()
def twin_expert_sink(exponent: int = 40, extra: int = 4):
    """Mixtral: widened by ``extra`` zero coordinates; every routed expert appears twice (identical router rows, so the
    two copies are always chosen together with bit-identical weights; top-k doubled, so each copy gets half the
    weight the expert had), and each copy gets one sink unit (gate and up rows
    one power of two on one real coordinate) writing +-2^``exponent`` x its
    hidden value along the first new coordinate. The twins' sinks cancel exactly on every token (each is alone in
    that row of its down map), but the canonical form reads each expert alone, whose own total is then the sink's."""

    def disguise(model, generator):
        wide = c49.widened_any(model, extra)
        config = copy.deepcopy(wide.config)
        d = model.config.hidden_size
        experts = config.num_local_experts
        inter = config.intermediate_size
        config.num_local_experts = 2 * experts
        config.num_experts_per_tok = 2 * config.num_experts_per_tok
        config.intermediate_size = inter + 4  # the grouped matmul wants rows of a multiple of 16 bytes: 3 zero pads
        out = type(wide)(config)
        state = {}
        big = 2.0 ** exponent
        for name, t in wide.state_dict().items():
            t = t.double()
            if name.endswith("mlp.gate.weight"):
                t = torch.cat([t, t])
            elif name.endswith("experts.gate_up_proj"):
                gate, up = t[:, :inter], t[:, inter:]
                scale = float(gate.norm(dim=-1).mean())
                g = torch.zeros(experts, 4, t.shape[-1], dtype=t.dtype)
                u = torch.zeros(experts, 4, t.shape[-1], dtype=t.dtype)
                # one coordinate each, a power of two: x . g is exact in any order the grouped matmul sums it
                pick = torch.randint(0, d, (experts,), generator=generator)
                g[torch.arange(experts), 0, pick] = 2.0 ** round(math.log2(scale))
                u[torch.arange(experts), 0, pick] = 2.0 ** round(math.log2(scale))
                t = torch.cat([gate, g, up, u], dim=1)
                t = torch.cat([t, t])
            elif name.endswith("experts.down_proj"):
                column = torch.zeros(experts, t.shape[1], 4, dtype=t.dtype)
                column[:, d, 0] = big
                t = torch.cat([torch.cat([t, column], dim=2), torch.cat([t, -column], dim=2)])
            state[name] = t.float()
        missing, unexpected = out.load_state_dict(state, strict=False)
        assert not unexpected, unexpected
        assert all("rotary" in m or "inv_freq" in m for m in missing), missing
        return out.eval()

    return disguise


CASES["twinsink40-moe-softmax"] = ("moe-softmax", lambda: twin_expert_sink(40))
CASES["control-twins-nosink-moe-softmax"] = ("moe-softmax", lambda: twin_expert_sink(-2000))


if __name__ == "__main__":
    threads, dtype, names = case_arguments(sys.argv[1:])
    c49.DTYPE = dtype or c49.DTYPE
    for name in names:
        c49.run(name, threads, CASES)
