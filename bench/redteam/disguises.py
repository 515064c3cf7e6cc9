"""Output-preserving disguises not in tests.fixtures.adversary, built on one exact identity of odd-symmetric
activations: for act(z) = z s(z) with s(z) + s(-z) = 1 (SiLU, GELU erf and tanh forms, ReLU),

    act(z) - act(-z) = z        for every z.

So a unit's gate (input) row can be negated, act(k x) = act(-k x) + k x, and the linear remainder written with other
units whose gate rows are anything the copier likes: for a gated unit (k, r, w), (k x)(r x) w = [act(r x) - act(-r x)]
(k x) w, i.e. gate r, up k; for a plain unit the remainder (k x + b) w summed over the MLP is one affine map, written
with 2 (d + 1) units along a random orthonormal basis, each pair (a, c), (-a, -c).
"""

from __future__ import annotations

import torch

from scanner.reading.architectures.sites import SiteWeights
from tests.fixtures import adversary as adv


def _haar(n: int, generator: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64, generator=generator))
    return q * torch.sign(torch.diagonal(r))


def gated_flip(fraction: float = 1.0, shuffle: bool = True) -> adv.Disguise:
    """Every chosen gated unit (k, r, w) -> (-k, r, w), (r, k, w), (-r, k, -w) (biases along: gate bias with k, up
    bias with r). Exact: silu(-kx)(rx)w + [silu(rx) - silu(-rx)](kx)w = silu(-kx)(rx)w + (rx)(kx)w = silu(kx)(rx)w.
    Width: h + 2 * chosen; to keep every site's width the same, ``fraction`` 1 flips all units."""

    def disguise(model, generator):
        if adv._plain(model):
            raise adv.UnsupportedDisguise("gated only")

        def change(w: SiteWeights, _degree) -> SiteWeights:
            k, r, d = w.gate.double(), w.up.double(), w.down.double()
            kb = None if w.gate_bias is None else w.gate_bias.double()
            rb = None if w.up_bias is None else w.up_bias.double()
            gates = torch.cat([-k, r, -r])
            ups = torch.cat([r, k, k])
            downs = torch.cat([d, d, -d], dim=1)
            gate_bias = None if kb is None and rb is None else torch.cat([
                -(kb if kb is not None else torch.zeros_like(k[:, 0])),
                rb if rb is not None else torch.zeros_like(k[:, 0]),
                -(rb if rb is not None else torch.zeros_like(k[:, 0]))])
            up_bias = None if kb is None and rb is None else torch.cat([
                rb if rb is not None else torch.zeros_like(k[:, 0]),
                kb if kb is not None else torch.zeros_like(k[:, 0]),
                kb if kb is not None else torch.zeros_like(k[:, 0])])
            order = torch.randperm(gates.shape[0], generator=generator) if shuffle else torch.arange(gates.shape[0])
            def f(t):
                return (None if t is None else t[order].float())
            return SiteWeights(up=f(ups), down=downs[:, order].float(), gate=f(gates), gate_bias=f(gate_bias),
                               up_bias=f(up_bias))

        return adv._transform_sites(model, change, width=lambda h: 3 * h)

    return disguise


def plain_flip(scale: float = 1.0, shuffle: bool = True) -> adv.Disguise:
    """Every plain unit (k, b, w) -> (-k, -b, w); the affine remainder sum_i w_i (k_i x + b_i) = L [x; 1] written as
    2 (d + 1) units (s a_j, s beta_j; L a_j / s) and (-s a_j, -s beta_j; -L a_j / s) for a random orthonormal basis a_j
    of R^(d+1) (``scale`` s: any positive number; the identity holds at any scale)."""

    def disguise(model, generator):
        if not adv._plain(model):
            raise adv.UnsupportedDisguise("plain only")

        def change(w: SiteWeights, _degree) -> SiteWeights:
            k, d = w.up.double(), w.down.double()
            b = torch.zeros(k.shape[0], dtype=torch.float64) if w.up_bias is None else w.up_bias.double()
            aug = torch.cat([k, b[:, None]], dim=1)  # (h, d+1)
            linear = d @ aug  # (out, d+1): the affine remainder
            basis = _haar(aug.shape[1], generator)  # columns a_j
            writes = linear @ basis / scale  # (out, d+1): column j = L a_j / s
            rows = basis.T * scale  # (d+1, d+1): row j = s a_j
            ins = torch.cat([-aug, rows, -rows])
            outs = torch.cat([d, writes, -writes], dim=1)
            order = torch.randperm(ins.shape[0], generator=generator) if shuffle else torch.arange(ins.shape[0])
            return SiteWeights(up=ins[order, :-1].float(), down=outs[:, order].float(),
                               up_bias=ins[order, -1].float())

        def widen(h: int) -> int:
            return h + 2 * (model.config.get_text_config().hidden_size + 1)

        return adv._transform_sites(model, change, width=widen)

    return disguise


def gated_flip_some(fraction: float) -> adv.Disguise:
    """`gated_flip` on round(fraction * h) randomly chosen units of each MLP, the rest left as they are."""

    def disguise(model, generator):
        if adv._plain(model):
            raise adv.UnsupportedDisguise("gated only")

        def change(w: SiteWeights, _degree) -> SiteWeights:
            h = w.up.shape[0]
            chosen = torch.randperm(h, generator=generator)[:round(fraction * h)]
            kept = torch.ones(h, dtype=torch.bool)
            kept[chosen] = False
            k, r, d = w.gate.double(), w.up.double(), w.down.double()
            kc, rc, dc = k[chosen], r[chosen], d[:, chosen]
            gates = torch.cat([k[kept], -kc, rc, -rc])
            ups = torch.cat([r[kept], rc, kc, kc])
            downs = torch.cat([d[:, kept], dc, dc, -dc], dim=1)
            order = torch.randperm(gates.shape[0], generator=generator)
            return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), gate=gates[order].float())

        return adv._transform_sites(model, change, width=lambda h: h + 2 * round(fraction * h))

    return disguise


def gated_flip_squares(seed_scale: bool = True) -> adv.Disguise:
    """Every gated unit (k, r, w) -> (-k, r, w) and the remainder (kx)(rx)w = [(ux)^2 - (vx)^2] w / 4 with u = k + r,
    v = k - r, each square (ux)^2 = [silu(ux) - silu(-ux)](ux): units (su, u, w/4s), (-su, u, -w/4s), (tv, v, -w/4t),
    (-tv, v, w/4t) for random positive s, t. No remainder unit's gate row is a stored up or gate row."""

    def disguise(model, generator):
        if adv._plain(model):
            raise adv.UnsupportedDisguise("gated only")

        def change(w: SiteWeights, _degree) -> SiteWeights:
            if w.gate_bias is not None or w.up_bias is not None:
                raise adv.UnsupportedDisguise("no biases in this variant")
            k, r, d = w.gate.double(), w.up.double(), w.down.double()
            h = k.shape[0]
            u, v = k + r, k - r
            s = torch.exp(torch.randn(h, dtype=torch.float64, generator=generator)) if seed_scale else torch.ones(h)
            t = torch.exp(torch.randn(h, dtype=torch.float64, generator=generator)) if seed_scale else torch.ones(h)
            gates = torch.cat([-k, s[:, None] * u, -s[:, None] * u, t[:, None] * v, -t[:, None] * v])
            ups = torch.cat([r, u, u, v, v])
            downs = torch.cat([d, d / (4 * s), -d / (4 * s), -d / (4 * t), d / (4 * t)], dim=1)
            order = torch.randperm(gates.shape[0], generator=generator)
            return SiteWeights(up=ups[order].float(), down=downs[:, order].float(), gate=gates[order].float())

        return adv._transform_sites(model, change, width=lambda h: 5 * h)

    return disguise
