"""canonical50 red-team cases (see README.md).

write-split: every unit (k, w) [gated: (k, r, w)] is split into n parts that share its gate exactly and write
different columns a_i (sum a_i = w; a_i = w / n + s_i with random s_i that sum to 0).  Beside each part a decoy
twin pair (D_i, +c_i) and (D_i, -c_i) [gated: (D_i, +v, c_i), (D_i, -v, c_i)] that cancels exactly, with its column
c_i parallel to a_i and LOUD x the layer's largest column (so it leads), and its gate D_i chosen so that its
pre-activation on the MLP's inputs agrees with the unit's to COS (below SAME_FUNCTION_COSINE, above
SAME_GATE_COSINE) at the same length.  The write-column rule (`SAME_WRITE_COSINE`) then joins part i to decoy i and
to nothing else: each real unit becomes n canonical units with the decoys' gates and the random columns a_i.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

import bench.redteam.canonical49.cases as c49
from bench.redteam.case_cli import case_arguments
from scanner.fingerprints.inputs import canonical_inputs
from scanner.reading.architectures.module_tree import decoder_stack
from scanner.reading.architectures.sites import SiteWeights, find_sites, site_weights
from tests.fixtures import adversary as adv

#: read the decoys' cosines on the fingerprint's own canonical tokens (public: a SHAKE-256 stream of a fixed seed)
CANONICAL = True
c49.WORK = Path("/tmp/canonical50")
c49.RESULTS = Path(__file__).with_name("results.jsonl")


@torch.no_grad()
def _mlp_inputs(model, generator):
    """Per layer, per site path: the MLP's input on random tokens (tokens, d), float64."""
    vocab = model.config.get_text_config().vocab_size
    ids = torch.from_numpy(canonical_inputs(vocab).ids) if CANONICAL else torch.randint(0, vocab, (8, 64),
                                                                                         generator=generator)
    found, hooks = {}, []
    for i, layer in enumerate(decoder_stack(model).layers):
        for site in find_sites(layer):
            module = layer.get_submodule(site.path) if site.path else layer

            def hook(_m, args, _out, key=(i, site.path)):
                found[key] = args[0].reshape(-1, args[0].shape[-1]).double()

            hooks.append(module.register_forward_hook(hook))
    model(input_ids=ids, use_cache=False)
    for h in hooks:
        h.remove()
    return found


def _decoy_gate(k, b, x, cosine, generator, has_bias):
    """A gate (D, bD) whose pre-activation on x agrees with (k, b)'s to ``cosine`` at the same length."""
    pk = x @ k + b
    e = torch.randn(k.shape[0], dtype=torch.float64, generator=generator) * k.norm() / math.sqrt(k.shape[0])
    be = torch.randn((), dtype=torch.float64, generator=generator) * float(b.abs()) if has_bias else b * 0
    pe = x @ e + be
    t = (pe @ pk) / (pk @ pk)
    e, be, pe = e - t * k, be - t * b, pe - t * pk
    s = math.tan(math.acos(cosine)) * float(pk.norm() / pe.norm())
    return cosine * (k + s * e), cosine * (b + s * be)


def write_split(n=3, cosine=0.97, loud=2.0, spread=1.0, decoys=True, both=False, mix=0):
    def disguise(model, generator):
        inputs = _mlp_inputs(model, generator)

        def change(i, layer, site, w: SiteWeights) -> SiteWeights:
            x = inputs[(i, site.path)]
            gated = w.gate is not None
            key = (w.gate if gated else w.up).double()
            kb = w.gate_bias if gated else w.up_bias
            h, d = key.shape
            bias = kb.double() if kb is not None else torch.zeros(h, dtype=torch.float64)
            down = w.down.double()
            up = w.up.double()
            ub = w.up_bias.double() if (gated and w.up_bias is not None) else None
            big = float(down.norm(dim=0).max()) * loud
            keys, biases, reads, rbias, cols = [], [], [], [], []
            for j in range(h):
                wj = down[:, j]
                s = torch.randn(n, down.shape[0], dtype=torch.float64, generator=generator)
                s = s - s.mean(dim=0, keepdim=True)
                s = s / max(float(s.norm(dim=1).mean()), 1e-300) * spread * float(wj.norm())
                parts = wj[None, :] / n + s
                part_reads = [up[j]] * n
                if both:  # (w + s, r/2 + t), (w - s, r/2 - t), (s, -2t): sum w r^T, reads unlike r too
                    sv, tv = s[0] * 1.0, torch.randn(d, dtype=torch.float64, generator=generator)
                    tv = tv / tv.norm() * spread * up[j].norm()
                    parts = torch.stack([wj + sv, wj - sv, sv])
                    part_reads = [up[j] / 2 + tv, up[j] / 2 - tv, -2 * tv]
                if mix:  # n columns in an m = n - mix dimensional span: reads r scaled plus the span's null part
                    m = n - mix
                    basis = torch.cat([wj[None, :], s[: m - 1]])
                    coef = torch.randn(n, m, dtype=torch.float64, generator=generator)
                    parts = coef @ basis
                    alpha = torch.linalg.lstsq(parts.T, wj[:, None]).solution[:, 0]
                    null = torch.linalg.svd(parts.T, full_matrices=True)[2][m:]
                    extra = torch.randn(mix, d, dtype=torch.float64, generator=generator)
                    extra = extra / extra.norm(dim=1, keepdim=True) * spread * up[j].norm()
                    part_reads = list(alpha[:, None] * up[j][None, :] + null.T @ extra)
                for a, r_part in zip(parts, part_reads):
                    keys.append(key[j])
                    biases.append(bias[j])
                    cols.append(a)
                    if gated:
                        reads.append(r_part)
                        rbias.append(ub[j] if ub is not None else torch.zeros((), dtype=torch.float64))
                    if not decoys:
                        continue
                    dk, db = _decoy_gate(key[j], bias[j], x, cosine, generator, kb is not None)
                    c = a / a.norm() * big
                    keys += [dk, dk]
                    biases += [db, db]
                    if gated:
                        v = up[j] / up[j].norm() * float(up.norm(dim=1).max()) * loud
                        v = v.roll(1)
                        reads += [v, -v]
                        rbias += [torch.zeros((), dtype=torch.float64)] * 2
                        cols += [c, c]
                    else:
                        cols += [c, -c]
            K, B, W = torch.stack(keys), torch.stack(biases), torch.stack(cols, dim=1)
            order = torch.randperm(K.shape[0], generator=generator)
            if gated:
                R, RB = torch.stack(reads), torch.stack(rbias)
                return SiteWeights(up=R[order].float(), down=W[:, order].float(), gate=K[order].float(),
                                   gate_bias=B[order].float() if w.gate_bias is not None else None,
                                   up_bias=RB[order].float() if w.up_bias is not None else None)
            return SiteWeights(up=K[order].float(), down=W[:, order].float(),
                               up_bias=B[order].float() if w.up_bias is not None else None)

        for i, layer in enumerate(decoder_stack(model).layers):
            for site in find_sites(layer):
                adv._write_site(layer, site, [change(i, layer, site, w) for w in site_weights(layer, site)])
        return adv._rebuilt(model, {key: (lambda hh: hh * n * (3 if decoys else 1)) for key in adv.WIDTH_KEYS})

    return disguise


CASES = {
    "wsplit3-plain-gelu": ("plain-gelu", lambda: write_split(3)),
    "wsplit5-plain-gelu": ("plain-gelu", lambda: write_split(5)),
    "wsplit3-plain-relu": ("plain-relu", lambda: write_split(3)),
    "wsplit3-gated": ("gated", lambda: write_split(3)),
    "wsplit3both-gated": ("gated", lambda: write_split(3, both=True)),
    "wsplit3both-cos0.955-gated": ("gated", lambda: write_split(3, cosine=0.955, both=True)),
    "wsplit5mix2-gated": ("gated", lambda: write_split(5, mix=2)),
    "wsplit5mix2-moe-softmax": ("moe-softmax", lambda: write_split(5, mix=2)),
    "wsplit3both-moe-dense-first": ("moe-dense-first", lambda: write_split(3, both=True)),
    "wsplit3both-spread3-gated": ("gated", lambda: write_split(3, both=True, spread=3.0)),
    "wsplit3both-spread3-loud20-gated": ("gated", lambda: write_split(3, both=True, spread=3.0, loud=20.0)),
    "wsplit3both-moe-softmax": ("moe-softmax", lambda: write_split(3, both=True)),
    "wsplit3both-hybrid": ("hybrid", lambda: write_split(3, both=True)),
    "wsplit1-plain-gelu": ("plain-gelu", lambda: write_split(1)),
    "wsplit3-nodecoy-plain-gelu": ("plain-gelu", lambda: write_split(3, decoys=False)),
    "wsplit3-moe-softmax": ("moe-softmax", lambda: write_split(3)),
    "wsplit3-hybrid": ("hybrid", lambda: write_split(3)),
    "wsplit2-plain-gelu": ("plain-gelu", lambda: write_split(2)),
    "wsplit3-cos0.99-plain-gelu": ("plain-gelu", lambda: write_split(3, cosine=0.99)),
}


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--no-write-rule" in args:  # diagnostic: the write-column rule off (no pairs pass a cosine of 2)
        import scanner.reading.canonical_mlp as cm
        cm.SAME_WRITE_COSINE = 2.0
        args.remove("--no-write-rule")
        c49.RESULTS = Path(__file__).with_name("diagnostic.jsonl")
    threads, dtype, names = case_arguments(args)
    c49.DTYPE = dtype or c49.DTYPE
    for name in names:
        c49.run(name, threads, CASES)
