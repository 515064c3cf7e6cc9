"""Units that write nothing on any input yet weigh the most by the canonical form's size measure, appended to every
MLP (dense or routed expert) to move the median that the dead-unit bar is a fraction of.

scanner.canonical_mlp marks a unit dead when its size |output column| |up row| |gate row|^degree is below
`DEAD` (1e-6) times the median size over the MLP's units with a non-zero size, and drops it. That median was taken
before units with an all-zero gate row were set aside, and over every stored unit. A gated unit with an all-zero
gate row computes act(0) (r x) w = 0 exactly (SiLU: act(0) = 0) whatever its up row r and output column w, so r and
w may be as large as the copier likes; a plain unit with an all-zero input row and a bias of -B computes act(-B) w,
exactly 0 in float32 for ReLU and GELU once B is a few hundred. Outnumber the real units with such units of size
``loud`` times theirs, and every real unit fell below the bar (found by an independent check of issue 43's claim);
the median now leaves out units that compute exactly nothing on the canonical inputs (scanner.canonical_mlp).
"""

from __future__ import annotations

import torch

from scanner.architectures.sites import SiteWeights
from scanner.testing import adversary as adv

#: Bias of a plain silent unit: act(-SILENT_BIAS) is exactly 0 in float32 for ReLU and both GELU forms.
SILENT_BIAS = 1.0e4


def loud_silent_units(factor: float = 3.0, loud: float = 1.0e8, mix: bool = True) -> adv.Disguise:
    """Append round(factor * h) silent units to every MLP of h units, each of size about ``loud`` times the median
    real unit's (see the module); ``mix``: shuffle them among the real units."""

    def disguise(model, generator):
        plain = adv._plain(model)

        def change(w: SiteWeights, degree) -> SiteWeights:
            h, d = w.up.shape
            n = round(factor * h)
            up, down = w.up.double(), w.down.double()
            out = down.shape[0]
            write = torch.randn(out, n, dtype=torch.float64, generator=generator)
            write = write / write.norm(dim=0) * down.norm(dim=0).median()
            if plain:
                rows = torch.zeros(n, d, dtype=torch.float64)
                bias = torch.full((n,), -SILENT_BIAS, dtype=torch.float64)
                # size |w| |(0, -B)|^degree: reach ``loud`` times the real units' size with the write alone
                real = (down.norm(dim=0) * torch.cat([up, w.up_bias.double()[:, None]], 1).norm(dim=1) ** (degree or 0))
                mine = write.norm(dim=0) * SILENT_BIAS ** (degree or 0)
                write = write * (loud * real.median() / mine.median())
                ups = torch.cat([up, rows])
                biases = torch.cat([w.up_bias.double(), bias])
                downs = torch.cat([down, write], dim=1)
                order = torch.randperm(h + n, generator=generator) if mix else torch.arange(h + n)
                return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), up_bias=biases[order].float())
            reads = torch.randn(n, d, dtype=torch.float64, generator=generator)
            reads = reads / reads.norm(dim=1, keepdim=True) * up.norm(dim=1).median() * loud ** 0.5
            write = write * loud ** 0.5
            gates = torch.cat([w.gate.double(), torch.zeros(n, d, dtype=torch.float64)])
            ups = torch.cat([up, reads])
            downs = torch.cat([down, write], dim=1)
            order = torch.randperm(h + n, generator=generator) if mix else torch.arange(h + n)
            if w.gate_bias is not None or w.up_bias is not None:
                raise adv.UnsupportedDisguise("gated MLPs without biases only")
            return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), gate=gates[order].float())

        return adv._transform_sites(model, change, width=lambda h: h + round(factor * h))

    return disguise
