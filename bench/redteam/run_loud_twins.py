"""Twins of enormous size whose writes cancel ((k, r, w) and (k, r, -w), 3h of them per MLP, each about 1e8 times a
real unit's size), to move the median the dead-unit bar is a fraction of before the canonical form cancels them.
Not an exact disguise: in float32 the twins' outputs cancel only to about 1e8 x 1e-7 of a real unit's, and the
logits move by 0.85 to 1.3 (relative); twins small enough to cancel exactly move the median too little to matter."""

import torch

from bench.redteam.harness import evaluate, kinds_from_argv
from scanner.reading.architectures.sites import SiteWeights
from tests.fixtures import adversary as adv


def _twins(count: int) -> int:
    return 2 * (count // 2)


def loud_twins(factor: float = 3.0, loud: float = 1e8) -> adv.Disguise:
    """Append about ``factor`` * h twins, each pair of one random gate (input) row, of size about ``loud``."""

    def disguise(model, generator):
        def change(w: SiteWeights, _degree) -> SiteWeights:
            h, width, d = w.up.shape[0], w.up.shape[1], w.down.shape[0]
            n = _twins(round(factor * h)) // 2

            def rows(*shape: int, scale: float = 1.0) -> torch.Tensor:
                return torch.randn(*shape, generator=generator, dtype=torch.float64) * scale

            key, read, write = rows(n, width), rows(n, width, scale=loud ** 0.5), rows(d, n, scale=loud ** 0.5)
            order = torch.randperm(h + 2 * n, generator=generator)
            zeros = torch.zeros(2 * n, dtype=torch.float64)

            def stacked(stored: torch.Tensor | None, added: torch.Tensor) -> torch.Tensor | None:
                return None if stored is None else torch.cat([stored.double(), added, added])[order].float()

            gated = w.gate is not None
            return SiteWeights(
                up=stacked(w.up, read if gated else key), down=torch.cat([w.down.double(), write, -write], 1)[:, order]
                .float(), gate=stacked(w.gate, key), gate_bias=None if w.gate_bias is None else
                torch.cat([w.gate_bias.double(), zeros])[order].float(),
                up_bias=None if w.up_bias is None else torch.cat([w.up_bias.double(), zeros])[order].float())

        return adv._transform_sites(model, change, width=lambda h: h + _twins(round(factor * h)))

    return disguise


for kind in kinds_from_argv(["gated", "plain-relu", "moe-softmax"]):
    evaluate("3h loud twins whose writes cancel, size ~1e8", kind, loud_twins())
