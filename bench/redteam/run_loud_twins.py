"""Twins of enormous size whose writes cancel ((k, r, w) and (k, r, -w), 3h of them per MLP, each about 1e8 times a
real unit's size), to move the median the dead-unit bar is a fraction of before the canonical form cancels them.
Not an exact disguise: in float32 the twins' outputs cancel only to about 1e8 x 1e-7 of a real unit's, and the
logits move by 0.85 to 1.3 (relative); twins small enough to cancel exactly move the median too little to matter."""

import torch

from bench.redteam.harness import evaluate
from scanner.architectures.sites import SiteWeights
from scanner.testing import adversary as adv


def loud_twins(factor=3.0, loud=1e8):
    def disguise(model, generator):
        def change(w, _degree):
            h = w.up.shape[0]; n = int(round(factor * h)) // 2
            d = w.down.shape[0]; width = w.up.shape[1]
            g = torch.randn(n, width, generator=generator, dtype=torch.float64)
            r = torch.randn(n, width, generator=generator, dtype=torch.float64) * loud ** 0.5
            wr = torch.randn(d, n, generator=generator, dtype=torch.float64) * loud ** 0.5
            gate = None if w.gate is None else torch.cat([w.gate.double(), g, g]).float()
            up = torch.cat([w.up.double(), r, r]).float() if w.gate is not None else torch.cat([w.up.double(), g, g]).float()
            down = torch.cat([w.down.double(), wr, -wr], dim=1).float()
            ub = None if w.up_bias is None else torch.cat([w.up_bias.double(), torch.zeros(2 * n, dtype=torch.float64)]).float()
            gb = None if w.gate_bias is None else torch.cat([w.gate_bias.double(), torch.zeros(2 * n, dtype=torch.float64)]).float()
            order = torch.randperm(h + 2 * n, generator=generator)
            pick = lambda t: None if t is None else t[order]
            return SiteWeights(up=up[order], down=down[:, order], gate=pick(gate), gate_bias=pick(gb), up_bias=pick(ub))
        return adv._transform_sites(model, change, width=lambda h: h + 2 * (int(round(factor * h)) // 2))
    return disguise

for kind in ["gated", "plain-relu", "moe-softmax"]:
    evaluate("3h loud twins whose writes cancel, size ~1e8", kind, loud_twins())
