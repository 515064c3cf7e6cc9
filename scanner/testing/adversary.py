"""Disguises a copier who has read hubtrace's code would try: changes to a model's weights that leave its outputs
unchanged, for any architecture whose MLPs the module tree finds (gated, plain, mixture-of-experts, hybrid).

Each disguise takes a transformers model and a seeded generator and returns the disguised model (the same object when
no shape changes, a rebuilt one when the MLP widths do). Nothing here is trusted: `max_logit_change` measures what a
disguise did to the logits, and the adversary suite (tests/test_adversary.py) checks every disguise and composition
on them before it fingerprints the result.

MLP units (per dense MLP and per routed expert, read and written through `scanner.architectures.sites`):
  permute    units reordered (their input rows and biases, their output columns).
  rescale    each unit's up row times c, its output column divided by c, for c spread log-uniformly over the given
             range with a random sign; where the activation is positively homogeneous (ReLU, squared ReLU) the gate
             row (gated) or the input row (plain) is rescaled too, by c > 0, and the output column by c^degree.
  split      each unit replaced by k copies whose output columns share the original's (positive weights summing to
             one), optionally with jitter on the copies' input rows (then the outputs change by about the jitter;
             with ``antithetic`` jitter the copies share equally and their jitters sum to zero, so the outputs change
             only to second order: the copier's best way to make copies look unlike one another).
  dead       units appended whose input rows are random and whose output columns are zero (they compute, never write).
  zeros      units appended that are zero throughout.
  split unlike   each unit split into parts that share its gate (input) row but are not copies of one another: up
             rows u/k + v_j with one output column, output columns w/k + e_j with one up row, or three parts that
             differ in both (w + e, u/2 + v), (w - e, u/2 - v), (-2e, v); the v_j (e_j) sum to zero and are
             ``spread`` times the share's size, so each part looks like some other unit.
  dead chain  units appended between every two units (in a random cycle), whose rows step from one unit's to the
             next and whose output columns are zero; ``twins``: each step a pair of units whose writes cancel.
  flip gates  where act(z) - act(-z) = z (SiLU, GELU, ReLU), each unit's gate (input) row negated and the linear
             remainder written with other units: a gated unit (k, r, w) becomes (-k, r, w), (r, k, w), (-r, k, -w);
             a plain MLP's units (k, b; w) become (-k, -b; w) and its affine remainder, one map, is written as pairs
             (a_j, w_j), (-a_j, -w_j) along a random orthonormal basis a_j of its input rows and bias.
Routed experts: `permute_experts` reorders experts with their router rows (and a router's per-expert biases);
`duplicate_experts` appends copies of experts that the router never selects, where the router has a selection bias
to make sure of that (DeepSeek-V3's and GLM-4.5's e_score_correction_bias). Under a softmax top-k router without one,
no duplicate leaves the outputs unchanged (it takes a routing slot or a share of the weights), so none is made.
Residual stream: `rotate_residual` re-expresses it in a random orthonormal basis (or a permutation of coordinates),
folding every norm's gain (and bias) into the maps that read it and giving the norms new gains.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.pytorch_utils import Conv1D

from scanner.architectures.module_tree import decoder_stack
from scanner.architectures.names import ROUTER_NAMES
from scanner.architectures.sites import MLPSite, SiteWeights, find_sites, site_weights
from scanner.canonical_mlp import HOMOGENEOUS_DEGREE, odd_linear

#: Config keys holding the routed-expert count.
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts")
#: Selection bias given to a duplicated expert: far below any sigmoid score, so it is never among the top k.
NEVER_SELECTED = -1.0e4
#: Config keys holding an MLP width; a width-changing disguise changes every one the config has.
WIDTH_KEYS = ("intermediate_size", "intermediate_size_mlp", "moe_intermediate_size", "shared_expert_intermediate_size",
              "n_inner", "ffn_dim", "ffn_hidden_size", "d_ff", "shared_intermediate_size",
              "moe_shared_expert_intermediate_size")

Disguise = Callable[[PreTrainedModel, torch.Generator], PreTrainedModel]
#: A module and how it reads or writes the residual stream: "weight" (its weight), "experts" (the experts' input
#: maps) or "experts:<down name>:<transposed>" (their output maps).
Part = tuple[nn.Module, str]


class UnsupportedDisguise(ValueError):
    """The disguise cannot be applied to this architecture while keeping its outputs (said why)."""


@dataclass(frozen=True)
class UnitPlan:
    """How one MLP's h units become h' units: unit k of the result is unit ``source[k]`` of the original (-1: a new
    unit), its input rows times ``read_scale[k]`` (gate rows times ``gate_scale[k]``) plus ``jitter`` times Gaussian
    noise of the rows' own scale, its output column times ``write_scale[k]``. New units read ``fresh`` rows."""

    source: torch.Tensor  # (h',) long
    read_scale: torch.Tensor  # (h',) float64
    gate_scale: torch.Tensor  # (h',) float64
    write_scale: torch.Tensor  # (h',) float64
    jitter: float = 0.0
    antithetic: bool = False  # the jitter of the units made from one source sums to zero
    fresh: str = "zero"  # "zero" or "random": the input rows of new units

    @property
    def width(self) -> int:
        return int(self.source.numel())


def identity_plan(units: int) -> UnitPlan:
    ones = torch.ones(units, dtype=torch.float64)
    return UnitPlan(torch.arange(units), ones, ones.clone(), ones.clone())


# -- the disguises -------------------------------------------------------------------------------------------------


def permute_units(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
    """Every MLP's units in a random order."""

    def plan(units: int, _degree: int | None) -> UnitPlan:
        order = torch.randperm(units, generator=generator)
        base = identity_plan(units)
        return UnitPlan(order, base.read_scale, base.gate_scale, base.write_scale)

    return _remap_units(model, plan, generator)


def rescale_units(low: float = 1e-30, high: float = 1e30) -> Disguise:
    """Every unit rescaled by its own factor, log-uniform on [low, high] with a random sign (see the module)."""

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        def plan(units: int, degree: int | None) -> UnitPlan:
            up = _log_uniform(units, low, high, generator) * _signs(units, generator)
            gate = _log_uniform(units, low, high, generator) if degree else torch.ones(units, dtype=torch.float64)
            base = identity_plan(units)
            if _plain(model) and not degree:
                raise UnsupportedDisguise(f"{mlp_activation(model)!r} is not positively homogeneous: a plain MLP's "
                                          "units cannot be rescaled without changing its outputs")
            if _plain(model):  # one input map: its rows carry the homogeneous scale, c > 0
                return UnitPlan(base.source, up.abs(), base.gate_scale, 1.0 / up.abs() ** degree)
            return UnitPlan(base.source, up, gate, 1.0 / (up * gate ** (degree or 0)))

        return _remap_units(model, plan, generator)

    return disguise


def split_units(copies: int = 2, jitter: float = 0.0, antithetic: bool = False) -> Disguise:
    """Every unit split into ``copies`` units, shuffled among the others (see the module)."""

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        def plan(units: int, _degree: int | None) -> UnitPlan:
            if antithetic:
                shares = torch.full((units, copies), 1.0 / copies, dtype=torch.float64)
            else:
                shares = -torch.log(torch.rand(units, copies, generator=generator, dtype=torch.float64))
                shares = shares / shares.sum(dim=1, keepdim=True)  # Dirichlet(1): positive, summing to one
            source = torch.arange(units).repeat_interleave(copies)
            order = torch.randperm(units * copies, generator=generator)
            ones = torch.ones(units * copies, dtype=torch.float64)
            return UnitPlan(source[order], ones, ones.clone(), shares.reshape(-1)[order], jitter=jitter,
                            antithetic=antithetic)

        return _remap_units(model, plan, generator, width=lambda w: w * copies)

    return disguise


def append_units(count: int, fresh: str = "random") -> Disguise:
    """``count`` units appended to every MLP, shuffled in: reading random rows and writing nothing (``random``), or
    zero throughout (``zero``)."""

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        def plan(units: int, _degree: int | None) -> UnitPlan:
            source = torch.cat([torch.arange(units), torch.full((count,), -1)])
            order = torch.randperm(units + count, generator=generator)
            ones = torch.ones(units + count, dtype=torch.float64)
            return UnitPlan(source[order], ones, ones.clone(), ones.clone(), fresh=fresh)

        return _remap_units(model, plan, generator, width=lambda w: w + count)

    return disguise


def split_unlike(parts: int = 2, spread: float = 3.0, differ: str = "reads") -> Disguise:
    """Every unit split into ``parts`` units that share its gate row and are not copies (see the module): ``differ``
    "reads" (up rows differ, one output column), "writes" (output columns differ, one up row; a plain MLP's only
    kind) or "both" (three parts)."""
    if differ not in ("reads", "writes", "both") or (differ == "both" and parts != 3):
        raise ValueError(f"differ is reads, writes or both (both: 3 parts), got {differ!r} with {parts} parts")

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        if _plain(model) and differ != "writes":
            raise UnsupportedDisguise("a plain MLP's unit has one input row: only its output column can be split")

        def change(w: SiteWeights, _degree: int | None) -> SiteWeights:
            units = w.up.shape[0]
            source = torch.arange(units).repeat_interleave(parts)
            order = torch.randperm(units * parts, generator=generator)
            up, down = w.up.double()[source], w.down.double()[:, source]
            if differ == "both":
                e = _zero_sum_noise(w.down.double().T, 1, spread, generator)[:, 0]  # one e per unit
                v = _zero_sum_noise(w.up.double(), 1, spread, generator)[:, 0]
                third = torch.arange(units) * 3
                up[third], up[third + 1], up[third + 2] = w.up / 2 + v, w.up / 2 - v, v
                down[:, third], down[:, third + 1], down[:, third + 2] = (w.down + e.T), (w.down - e.T), -2 * e.T
            elif differ == "reads":
                up = up / parts + _zero_sum_noise(w.up.double() / parts, parts, spread, generator).reshape(up.shape)
            else:
                noise = _zero_sum_noise(w.down.double().T / parts, parts, spread, generator)
                down = down / parts + noise.reshape(-1, down.shape[0]).T

            def rows(t: torch.Tensor | None) -> torch.Tensor | None:
                return None if t is None else t[source][order]

            gated = w.gate is not None
            return SiteWeights(up=(up[order] if gated else w.up[source][order]).float(), down=down[:, order].float(),
                               gate=rows(w.gate), gate_bias=rows(w.gate_bias), up_bias=rows(w.up_bias))

        return _transform_sites(model, change, width=lambda h: h * parts)

    return disguise


def dead_chain(steps: int, twins: bool = False) -> Disguise:
    """``steps`` units that write nothing between every two units of a random cycle through them, their rows stepping
    from one unit's to the next (``twins``: each step two units whose output columns cancel; see the module)."""

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        copies = 2 if twins else 1

        def change(w: SiteWeights, _degree: int | None) -> SiteWeights:
            units = w.up.shape[0]
            cycle = torch.randperm(units, generator=generator)
            start, end = cycle, cycle.roll(-1)
            t = (torch.arange(1, steps + 1, dtype=torch.float64) / (steps + 1)).repeat(units)
            a, b = start.repeat_interleave(steps), end.repeat_interleave(steps)

            def between(m: torch.Tensor | None) -> torch.Tensor | None:
                if m is None:
                    return None
                x = m.double()
                step = x[a] * (1 - t[:, None] if x.ndim == 2 else 1 - t) + x[b] * (t[:, None] if x.ndim == 2 else t)
                return torch.cat([x, step.repeat_interleave(copies, dim=0)]).float()

            chain = units * steps * copies
            parts = [between(m) for m in (w.up, w.gate, w.gate_bias, w.up_bias)]
            if twins:
                write = torch.randn(w.down.shape[0], units * steps, dtype=torch.float64, generator=generator)
                # each twin's write scaled to the median size of a real unit's product (after a rescale, units span
                # sixty decades: a write sized for the mean would overflow float32 against a large read row)
                real = _unit_gain(w.up.double(), None if w.gate is None else w.gate.double(), _degree)
                gain = _unit_gain(parts[0].double(), None if parts[1] is None else parts[1].double(), _degree)
                gain = torch.where(gain > 0, gain, real.median())[units::copies]  # a step between zero units reads 0
                write = write / write.norm(dim=0) * (real * w.down.double().norm(dim=0)).median() / gain
                writes = torch.stack([write, -write], dim=2).reshape(w.down.shape[0], chain)
            else:
                writes = torch.zeros(w.down.shape[0], chain, dtype=torch.float64)
            order = torch.randperm(units + chain, generator=generator)
            down = torch.cat([w.down.double(), writes], dim=1)[:, order].float()
            up, gate, gate_bias, up_bias = (None if m is None else m[order] for m in parts)
            return SiteWeights(up=up, down=down, gate=gate, gate_bias=gate_bias, up_bias=up_bias)

        return _transform_sites(model, change, width=lambda h: h * (1 + steps * copies))

    return disguise


def flip_gates(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
    """Every unit's gate (input) row negated, the linear remainder written with other units (see the module)."""
    if not odd_linear(mlp_activation(model)):
        raise UnsupportedDisguise(f"{mlp_activation(model)!r} does not satisfy act(z) - act(-z) = z: a gate row's sign "
                                  "cannot be turned without changing the outputs")
    if _plain(model):
        hidden = model.config.get_text_config().hidden_size
        return _transform_sites(model, lambda w, _degree: _flipped_plain(w, generator),
                                width=lambda h: h + 2 * (hidden + 1))
    return _transform_sites(model, lambda w, _degree: _flipped_gated(w, generator), width=lambda h: 3 * h)


def _flipped_gated(w: SiteWeights, generator: torch.Generator) -> SiteWeights:
    """(k, r, w) -> (-k, r, w), (r, k, w), (-r, k, -w), biases along with their rows: act(-z) + z = act(z), and
    (k x)(r x) = [act(r x) - act(-r x)](k x). Shuffled."""
    zeros = torch.zeros(w.up.shape[0], dtype=torch.float64)
    k, r, d = w.gate.double(), w.up.double(), w.down.double()
    kb = zeros if w.gate_bias is None else w.gate_bias.double()
    rb = zeros if w.up_bias is None else w.up_bias.double()
    order = torch.randperm(3 * k.shape[0], generator=generator)

    def rows(*parts: torch.Tensor) -> torch.Tensor:
        return torch.cat(parts)[order].float()

    biased = w.gate_bias is not None or w.up_bias is not None
    return SiteWeights(up=rows(r, k, k), down=torch.cat([d, d, -d], dim=1)[:, order].float(), gate=rows(-k, r, -r),
                       gate_bias=rows(-kb, rb, -rb) if biased else None, up_bias=rows(rb, kb, kb) if biased else None)


def _flipped_plain(w: SiteWeights, generator: torch.Generator) -> SiteWeights:
    """(k, b; w) -> (-k, -b; w), and the remainder sum_i w_i (k_i x + b_i) = L [x; 1] as units (a_j; L a_j) and
    (-a_j; -L a_j) for a random orthonormal basis a_j of [x; 1] (act(z) - act(-z) = z). Shuffled."""
    bias = torch.zeros(w.up.shape[0], dtype=torch.float64) if w.up_bias is None else w.up_bias.double()
    rows = torch.cat([w.up.double(), bias[:, None]], dim=1)
    remainder = w.down.double() @ rows
    basis, triangle = torch.linalg.qr(torch.randn(rows.shape[1], rows.shape[1], dtype=torch.float64,
                                                  generator=generator))
    basis = basis * torch.sign(torch.diagonal(triangle))
    inputs = torch.cat([-rows, basis.T, -basis.T])
    outputs = torch.cat([w.down.double(), remainder @ basis, -(remainder @ basis)], dim=1)
    order = torch.randperm(inputs.shape[0], generator=generator)
    return SiteWeights(up=inputs[order, :-1].float(), down=outputs[:, order].float(), up_bias=inputs[order, -1].float())


def _unit_gain(up: torch.Tensor, gate: torch.Tensor | None, degree: int | None) -> torch.Tensor:
    """How much each unit's read side scales its output: |up row| (a plain unit's to its homogeneous degree), times
    |gate row|^degree where the gate is positively homogeneous (a non-homogeneous gate saturates: no gain)."""
    gain = up.norm(dim=1)
    if gate is None:  # a plain unit's one input row carries the homogeneous degree
        return gain ** (degree or 1)
    return gain * gate.norm(dim=1) ** (degree or 0)


def _zero_sum_noise(rows: torch.Tensor, parts: int, spread: float, generator: torch.Generator) -> torch.Tensor:
    """(units, parts, dims): for each row, ``parts`` Gaussian vectors that sum to zero (one: any vector), scaled
    together so that their mean length is ``spread`` times the row's."""
    noise = torch.randn(rows.shape[0], parts, rows.shape[1], dtype=torch.float64, generator=generator)
    if parts > 1:
        noise = noise - noise.mean(dim=1, keepdim=True)
    noise = noise / noise.norm(dim=2).mean(dim=1).clamp_min(1e-300)[:, None, None]
    return noise * spread * rows.norm(dim=1)[:, None, None]


@torch.no_grad()
def permute_experts(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
    """Every MoE block's routed experts in a random order, with the router's rows (and per-expert biases)."""
    for experts, site, block in _expert_sites(model):
        if site.stacked:
            raise UnsupportedDisguise("experts stacked by row (DBRX) are not reordered by this suite")
        order = torch.randperm(site.experts, generator=generator)
        _replace_per_expert(experts, site.experts, lambda parameter, order=order: parameter[order].clone())
        _permute_router(block, site.experts, order)
    return model


def _expert_sites(model: PreTrainedModel, required: bool = True) -> list[tuple[nn.Module, MLPSite, nn.Module]]:
    """(experts module, site, the block holding its router) of every site with routed experts; a model without any
    cannot wear an expert disguise (refused where ``required``)."""
    stack = decoder_stack(model)
    sites = [(layer.get_submodule(site.path), site,
              layer.get_submodule(site.path.rsplit(".", 1)[0]) if "." in site.path else layer)
             for layer in stack.layers for site in find_sites(layer) if site.experts]
    if required and not sites:
        raise UnsupportedDisguise(f"{type(model).__name__} has no routed experts")
    return sites


def _replace_per_expert(experts: nn.Module, count: int, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Each of the module's own parameters indexed by expert (first dimension ``count``) replaced by ``change``
    of it."""
    for name, parameter in list(experts.named_parameters(recurse=False)):
        if parameter.shape[:1] == (count,):
            setattr(experts, name, nn.Parameter(change(parameter.detach()), requires_grad=False))


@torch.no_grad()
def rotate_residual(model: PreTrainedModel, generator: torch.Generator, *, permutation_only: bool = False,
                    new_gains: bool = True) -> PreTrainedModel:
    """The residual stream in a random orthonormal basis Q (a coordinate permutation when ``permutation_only``):
    embeddings and every map into the stream times Q, every map reading a norm's output folded with that norm's gain
    and bias and times Q^T, the norms given random non-zero gains (``new_gains``) that the readers undo.

    Which maps read which norm is observed on a forward pass (their input is the norm's output tensor); every map
    whose output has the residual's width and that reads no norm writes into the stream. LayerNorm subtracts the
    mean, so for models with one the basis keeps the all-ones direction (a rotation of its complement).
    """
    hidden = model.get_input_embeddings().weight.shape[1]
    head = model.get_output_embeddings()
    if head.weight is model.get_input_embeddings().weight:  # tied: the head gets a copy of its own to fold into
        head.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
    model.config.tie_word_embeddings = False
    model.config.get_text_config().tie_word_embeddings = False
    readers, norms, writers = _residual_roles(model, hidden)
    centred = any(isinstance(norm, nn.LayerNorm) or hasattr(norm, "bias") and norm.bias is not None
                  for norm in norms)
    basis = _residual_basis(hidden, generator, permutation_only, centred)
    for norm in norms:
        gain, bias = _norm_affine(norm, hidden)
        new_gain = _random_gains(hidden, generator) if new_gains else torch.ones(hidden, dtype=torch.float64)
        for reader in readers[norm]:
            _fold_reader(reader, gain, bias, basis, new_gain)
        _set_norm_affine(norm, new_gain, hidden)
    for module, part in writers:
        _rotate_writer(module, part, basis)
    for embedding in _embeddings(model, hidden):
        embedding.weight.copy_((embedding.weight.double() @ basis.T).to(embedding.weight.dtype))
    return model


def duplicate_experts(count: int = 1) -> Disguise:
    """``count`` routed experts of every MoE block appended again as copies the router never selects (their
    selection bias `NEVER_SELECTED`); only for routers with a per-expert selection bias (see the module)."""

    @torch.no_grad()
    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        for experts, site, block in _expert_sites(model):
            router = next((c for n, c in block.named_children() if n in ROUTER_NAMES), None)
            bias = getattr(router, "e_score_correction_bias", None)
            if bias is None or site.stacked:
                raise UnsupportedDisguise(f"{type(model).__name__}'s router has no selection bias: a duplicated "
                                          "expert would change which experts are chosen")
            picks = torch.randperm(site.experts, generator=generator)[:count]
            _replace_per_expert(experts, site.experts, lambda parameter, picks=picks: torch.cat([parameter,
                                                                                                  parameter[picks]]))
            router.weight = nn.Parameter(torch.cat([router.weight.detach(), router.weight.detach()[picks]]),
                                         requires_grad=False)
            router.e_score_correction_bias = torch.cat([bias, torch.full((count,), NEVER_SELECTED, dtype=bias.dtype)])
        return _rebuilt(model, {key: lambda e: e + count for key in EXPERT_KEYS})

    return disguise


def compose(*disguises: Disguise) -> Disguise:
    """The disguises one after another, each with the same generator."""

    def disguise(model: PreTrainedModel, generator: torch.Generator) -> PreTrainedModel:
        for step in disguises:
            model = step(model, generator)
        return model

    return disguise


@torch.no_grad()
def max_logit_change(before: PreTrainedModel, after: PreTrainedModel, ids: torch.Tensor) -> float:
    """The largest change of any logit on ``ids``, relative to the largest logit magnitude."""
    reference = before(input_ids=ids, use_cache=False).logits.double()
    changed = after(input_ids=ids, use_cache=False).logits.double()
    return float((changed - reference).abs().max() / reference.abs().max().clamp_min(1e-30))


# -- MLP units -----------------------------------------------------------------------------------------------------


def _remap_units(model: PreTrainedModel, plan: Callable[[int, int | None], UnitPlan], generator: torch.Generator,
                 width: Callable[[int], int] | None = None) -> PreTrainedModel:
    """Apply a unit plan to every MLP (dense, or each routed expert; one plan per MLP)."""
    return _transform_sites(model, lambda w, degree: _remapped(w, plan(w.up.shape[0], degree), generator), width)


@torch.no_grad()
def _transform_sites(model: PreTrainedModel, change: Callable[[SiteWeights, int | None], SiteWeights],
                     width: Callable[[int], int] | None = None) -> PreTrainedModel:
    """Every MLP's weights (dense, or each routed expert) replaced by ``change`` of them (given the activation's
    homogeneity degree, None if it has none); the model rebuilt from its config when the widths change."""
    degree = HOMOGENEOUS_DEGREE.get(mlp_activation(model))
    seen = False
    for layer in decoder_stack(model).layers:
        for site in find_sites(layer):
            if site.stacked:
                raise UnsupportedDisguise("experts stacked by row (DBRX) are not remapped by this suite")
            seen = True
            _write_site(layer, site, [change(w, degree) for w in site_weights(layer, site)])
    if not seen:
        raise UnsupportedDisguise(f"{type(model).__name__} has no MLP the module tree finds")
    return model if width is None else _rebuilt(model, {key: width for key in WIDTH_KEYS})


def _remapped(weights: SiteWeights, plan: UnitPlan, generator: torch.Generator) -> SiteWeights:
    """One MLP's weights after the plan, float64 arithmetic, float32 out."""
    source = plan.source.clamp_min(0)
    new = plan.source < 0

    def rows(matrix: torch.Tensor | None, scale: torch.Tensor, noisy: bool) -> torch.Tensor | None:
        if matrix is None:
            return None
        m = matrix.double()
        out = m[source] * (scale[:, None] if m.ndim == 2 else scale)
        if m.ndim == 2:
            spread = m.std().clamp_min(1e-30)
            if plan.fresh == "random":
                out[new] = spread * torch.randn(int(new.sum()), m.shape[1], dtype=torch.float64, generator=generator)
            else:
                out[new] = 0.0
            if noisy and plan.jitter:
                noise = torch.randn(out.shape, dtype=torch.float64, generator=generator)
                if plan.antithetic:  # each source's copies: noise less its mean over the copies
                    mean = torch.zeros(m.shape, dtype=torch.float64).index_add_(0, source, noise)
                    mean /= torch.bincount(source, minlength=m.shape[0]).clamp_min(1)[:, None]
                    noise = noise - mean[source]
                spread = m[source].norm(dim=1, keepdim=True) / math.sqrt(m.shape[1])
                out[~new] += (plan.jitter * spread * noise)[~new]
        else:
            out[new] = 0.0
        return out.float()

    down = weights.down.double()[:, source] * plan.write_scale
    down[:, new] = 0.0
    return SiteWeights(
        up=rows(weights.up, plan.read_scale, noisy=True),
        down=down.float(),
        gate=rows(weights.gate, plan.gate_scale, noisy=True),
        gate_bias=rows(weights.gate_bias, plan.gate_scale, noisy=False),
        up_bias=rows(weights.up_bias, plan.read_scale, noisy=False),
    )


def _write_site(layer: nn.Module, site: MLPSite, weights: list[SiteWeights]) -> None:
    """The inverse of `site_weights`: each layout's tensors made anew (they may change shape) from (out, in) maps."""
    if site.experts:
        _write_experts(layer.get_submodule(site.path), site, weights)
        return
    (w,) = weights
    if site.fused:
        _set_linear(layer.get_submodule(_join(site.path, site.up)), _fuse(w.gate, w.up, site.fused),
                    None if w.up_bias is None else _fuse(w.gate_bias, w.up_bias, site.fused))
    else:
        _set_linear(layer.get_submodule(_join(site.path, site.up)), w.up, w.up_bias)
        if site.gate is not None:
            _set_linear(layer.get_submodule(_join(site.path, site.gate)), w.gate, w.gate_bias)
    down = layer.get_submodule(_join(site.path, site.down))
    _set_linear(down, w.down, getattr(down, "bias", None))


def _write_experts(module: nn.Module, site: MLPSite, weights: list[SiteWeights]) -> None:
    if site.fused:
        up = torch.stack([_fuse(w.gate, w.up, site.fused) for w in weights])
    else:
        up = torch.stack([w.up for w in weights])
    down = torch.stack([w.down for w in weights])
    if site.transposed:
        up, down = up.transpose(1, 2), down.transpose(1, 2)
    _set_tensor(module, site.up, up)
    _set_tensor(module, site.down, down)
    if site.gate is not None:
        gate = torch.stack([w.gate for w in weights])
        _set_tensor(module, site.gate, gate.transpose(1, 2) if site.transposed else gate)
    if getattr(module, f"{site.up}_bias", None) is not None:
        biases = [_fuse(w.gate_bias, w.up_bias, site.fused) if site.fused else w.up_bias for w in weights]
        _set_tensor(module, f"{site.up}_bias", torch.stack(biases))


def _fuse(gate: torch.Tensor | None, up: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "interleaved":
        return torch.stack([gate, up], dim=1).reshape(-1, *up.shape[1:])
    return torch.cat([gate, up])


def _set_linear(module: nn.Module, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """Give a linear map (Linear, Conv1D or any module with a 2-D weight) an (out, in) weight of any shape."""
    dtype = module.weight.dtype
    stored = weight.T if isinstance(module, Conv1D) else weight
    module.weight = nn.Parameter(stored.contiguous().to(dtype), requires_grad=False)
    if bias is not None:
        module.bias = nn.Parameter(bias.contiguous().to(dtype), requires_grad=False)
    sizes = (("out_features", weight.shape[0]), ("in_features", weight.shape[1]), ("nf", weight.shape[0]))
    for attribute, value in sizes:
        if hasattr(module, attribute):
            setattr(module, attribute, int(value))


def _set_tensor(module: nn.Module, name: str, value: torch.Tensor) -> None:
    current = getattr(module, name)
    if isinstance(current, nn.Module):  # JetMoE's parallel experts hold the tensor as a child's weight
        current.weight = nn.Parameter(value.contiguous().to(current.weight.dtype), requires_grad=False)
    else:
        setattr(module, name, nn.Parameter(value.contiguous().to(current.dtype), requires_grad=False))


def _rebuilt(model: PreTrainedModel, changes: dict[str, Callable[[int], int]]) -> PreTrainedModel:
    """A model of the same class from a config whose integer fields ``changes`` names are changed as it says (the
    keys the config has), holding the model's present weights."""
    config = model.config
    text = config.get_text_config()
    before = {key: getattr(text, key, None) for key in changes}  # read all first: some keys alias one another
    if before.get("n_inner", 0) is None and hasattr(text, "n_embd"):
        before["n_inner"] = 4 * text.n_embd  # GPT-2's default inner width
    changed = {key: changes[key](value) for key, value in before.items() if isinstance(value, int) and value > 0}
    for key, value in changed.items():
        setattr(text, key, value)
    if not changed:
        raise UnsupportedDisguise(f"{type(model).__name__}'s config names none of {sorted(changes)}")
    rebuilt, state = type(model)(config), model.state_dict()
    missing, unexpected = rebuilt.load_state_dict(state, strict=False)
    for key in unexpected:  # a bias that folding a norm's bias gave a map built without one
        path, name = key.rsplit(".", 1)
        module = rebuilt.get_submodule(path)
        if name != "bias" or getattr(module, "bias", None) is not None:
            missing.append(key)
            continue
        module.bias = nn.Parameter(state[key].clone(), requires_grad=False)
    if missing:
        raise RuntimeError(f"{type(model).__name__} rebuilt wider does not hold {sorted(missing)}")
    return rebuilt.eval()


def _permute_router(block: nn.Module, experts: int, order: torch.Tensor) -> None:
    """Reorder a router's per-expert rows and vectors (weights (E, d), biases and score corrections (E,))."""
    routers = [child for name, child in block.named_children() if name in ROUTER_NAMES]
    if not routers:
        raise UnsupportedDisguise(f"no router beside the experts of {type(block).__name__}")
    for router in routers:
        for tensor in [*router.parameters(recurse=False), *router.buffers(recurse=False)]:
            if tensor.shape[:1] == (experts,):
                tensor.copy_(tensor[order])
        linear = getattr(router, "linear", None) or getattr(router, "layer", None)  # routers that wrap a Linear
        if isinstance(linear, nn.Linear) and linear.weight.shape[0] == experts:
            linear.weight.copy_(linear.weight[order])
            if linear.bias is not None:
                linear.bias.copy_(linear.bias[order])


# -- the residual stream -------------------------------------------------------------------------------------------


def _residual_roles(model: PreTrainedModel,
                    hidden: int) -> tuple[dict[nn.Module, list[Part]], list[nn.Module], list[Part]]:
    """(readers of each residual norm, the norms, the writers) observed on one forward pass: a reader is a map (or the
    block holding routed experts, for the experts' input maps) whose input is a norm's output; a writer is a map whose
    output has the residual's width and that reads no norm, and every experts module's output map."""
    stack = decoder_stack(model)
    parents = [*stack.layers, stack.base]
    norms = [child for parent in parents for child in parent.children() if _is_norm(child, hidden)]
    if not norms:
        raise UnsupportedDisguise(f"{type(model).__name__}: no residual norm found")
    maps = [m for m in stack.layers.modules() if _is_map(m)] + [model.get_output_embeddings()]
    experts = _expert_sites(model, required=False)
    alive: list[torch.Tensor] = []  # norm outputs kept referenced, so no later tensor reuses their memory
    produced: dict[int, nn.Module] = {}
    read: dict[int, nn.Module] = {}

    def norm_hook(module: nn.Module, _args: tuple, out: torch.Tensor) -> None:
        alive.append(out)
        produced[out.data_ptr()] = module

    def map_hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
        norm = produced.get(_first_tensor(args, kwargs).data_ptr())
        if norm is not None:
            read.setdefault(id(module), norm)

    hooks = [norm.register_forward_hook(norm_hook) for norm in norms]
    hooks += [m.register_forward_pre_hook(map_hook, with_kwargs=True) for m in {*maps, *(b for _, _, b in experts)}]
    try:
        model(input_ids=torch.arange(8).reshape(1, 8) % model.config.get_text_config().vocab_size, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    readers: dict[nn.Module, list[Part]] = {norm: [] for norm in norms}
    writers: list[Part] = []
    expert_modules = {id(m) for m, _, _ in experts}
    for module in maps:
        if id(module) in read:
            readers[read[id(module)]].append((module, "weight"))
        elif _out_width(module) == hidden and not _inside(module, expert_modules, stack):
            writers.append((module, "weight"))
    for module, site, block in experts:
        if id(block) not in read:
            raise UnsupportedDisguise(f"{type(model).__name__}: the experts at {site.path} read no residual norm")
        readers[read[id(block)]].append((module, "experts"))
        writers.append((module, f"experts:{site.down}:{int(site.transposed)}"))
    missing = [type(n).__name__ for n in norms if not readers[n]]
    if missing:
        raise UnsupportedDisguise(f"{type(model).__name__}: norms {missing} feed no linear map directly")
    return readers, norms, writers


def _inside(module: nn.Module, containers: set[int], stack) -> bool:
    """Whether a map belongs to an experts module (its maps are handled through the module)."""
    return any(id(parent) in containers and any(m is module for m in parent.modules())
               for parent in stack.layers.modules())


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor:
    if args and isinstance(args[0], torch.Tensor):
        return args[0]
    return next(v for v in kwargs.values() if isinstance(v, torch.Tensor))


def _is_norm(module: nn.Module, hidden: int) -> bool:
    weight = getattr(module, "weight", None)
    named = "norm" in type(module).__name__.lower()
    return named and (weight is None or tuple(weight.shape) == (hidden,))


def _is_map(module: nn.Module) -> bool:
    """A linear map: Linear, GPT-2's Conv1D, or a router-like module holding one 2-D weight (DeepSeek's top-k
    router)."""
    if isinstance(module, (nn.Linear, Conv1D)):
        return True
    weight = getattr(module, "weight", None)
    return (isinstance(weight, nn.Parameter) and weight.ndim == 2 and not isinstance(module, nn.Embedding)
            and not list(module.children()))


def _out_width(module: nn.Module) -> int:
    weight = module.weight
    return int(weight.shape[1] if isinstance(module, Conv1D) else weight.shape[0])


def _residual_basis(hidden: int, generator: torch.Generator, permutation_only: bool, centred: bool) -> torch.Tensor:
    """An orthogonal (hidden, hidden) float64 matrix Q; Q 1 = 1 when ``centred`` (LayerNorm commutes with it then)."""
    if permutation_only:
        return torch.eye(hidden, dtype=torch.float64)[torch.randperm(hidden, generator=generator)]
    if not centred:
        return _haar(hidden, generator)
    ones = torch.full((hidden, 1), 1.0 / math.sqrt(hidden), dtype=torch.float64)
    frame, _ = torch.linalg.qr(torch.cat([ones, torch.randn(hidden, hidden - 1, generator=generator,
                                                            dtype=torch.float64)], dim=1))
    frame[:, 0] = ones[:, 0]  # QR may flip the first column's sign
    inner = torch.eye(hidden, dtype=torch.float64)
    inner[1:, 1:] = _haar(hidden - 1, generator)
    return frame @ inner @ frame.T


def _haar(n: int, generator: torch.Generator) -> torch.Tensor:
    """A Haar-random n x n orthogonal matrix (QR of a Gaussian with the sign fix), float64."""
    q, r = torch.linalg.qr(torch.randn(n, n, generator=generator, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _random_gains(hidden: int, generator: torch.Generator) -> torch.Tensor:
    """Non-zero gains of random sign, magnitude log-uniform on [1/2, 2]."""
    return _log_uniform(hidden, 0.5, 2.0, generator) * _signs(hidden, generator)


def _norm_affine(norm: nn.Module, hidden: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The norm's effective gain (as its forward applies it: Gemma's 1 + w included) and bias, float64."""
    weight = getattr(norm, "weight", None)
    bias = getattr(norm, "bias", None)
    bias_value = None if bias is None else bias.detach().double().clone()
    if weight is None:
        return torch.ones(hidden, dtype=torch.float64), bias_value
    return weight.detach().double() + _gain_offset(norm, hidden), bias_value


def _gain_offset(norm: nn.Module, hidden: int) -> float:
    """0 for a norm that multiplies by its weight w, 1 for one that multiplies by 1 + w (Gemma's RMSNorm)."""
    probe = torch.randn(3, hidden, generator=torch.Generator().manual_seed(0))
    saved = [p.detach().clone() for p in (norm.weight, getattr(norm, "bias", None)) if p is not None]
    try:
        if getattr(norm, "bias", None) is not None:
            norm.bias.zero_()
        norm.weight.fill_(1.0)
        unit = norm(probe).double()
        norm.weight.fill_(0.0)
        zero = norm(probe).double()
    finally:
        for parameter, value in zip([p for p in (norm.weight, getattr(norm, "bias", None)) if p is not None], saved):
            parameter.copy_(value)
    if zero.abs().max() <= 1e-6 * unit.abs().max():
        return 0.0
    if torch.allclose(zero, unit / 2, rtol=1e-4, atol=1e-6):
        return 1.0
    raise UnsupportedDisguise(f"{type(norm).__name__}'s gain is neither w nor 1 + w")


def _set_norm_affine(norm: nn.Module, gain: torch.Tensor, hidden: int) -> None:
    weight = getattr(norm, "weight", None)
    if weight is not None:
        weight.copy_((gain - _gain_offset(norm, hidden)).to(weight.dtype))
    elif not torch.equal(gain, torch.ones_like(gain)):
        raise UnsupportedDisguise(f"{type(norm).__name__} has no gain to give new values")
    bias = getattr(norm, "bias", None)
    if bias is not None:
        bias.zero_()


def _fold_reader(reader: tuple[nn.Module, str], gain: torch.Tensor, bias: torch.Tensor | None, basis: torch.Tensor,
                 new_gain: torch.Tensor) -> None:
    """W x_norm -> W' x'_norm with x'_norm = new_gain * (Q normalised x): W' = W diag(gain) Q^T diag(1/new_gain), and
    the old norm bias moved into the map's bias."""
    module, part = reader
    fold = torch.diag(gain) @ basis.T @ torch.diag(1.0 / new_gain)
    if part == "experts":
        for site in find_sites_of(module):
            for name in [n for n in (site.up, site.gate) if n]:
                tensor = getattr(module, name)
                t = tensor.double()
                folded = (t @ fold) if not site.transposed else (fold.T @ t)
                if bias is not None:
                    raise UnsupportedDisguise("a LayerNorm bias cannot be folded into experts without biases")
                tensor.copy_(folded.to(tensor.dtype))
        return
    weight = module.weight
    matrix = weight.double().T if isinstance(module, Conv1D) else weight.double()
    if bias is not None:
        shift = matrix @ bias
        if getattr(module, "bias", None) is None:
            module.bias = nn.Parameter(shift.to(weight.dtype), requires_grad=False)
        else:
            module.bias.copy_((module.bias.double() + shift).to(weight.dtype))
    folded = matrix @ fold
    weight.copy_((folded.T if isinstance(module, Conv1D) else folded).to(weight.dtype))


def find_sites_of(experts: nn.Module) -> list[MLPSite]:
    """The expert sites of an experts module itself (its own 3-D tensors)."""
    return [site for site in find_sites(experts) if site.experts and site.path == ""]


def _rotate_writer(module: nn.Module, part: str, basis: torch.Tensor) -> None:
    """W -> Q W for a map writing into the residual stream (its bias too)."""
    if part.startswith("experts:"):
        _, name, transposed = part.split(":")
        tensor = getattr(module, name)
        t = tensor.double()
        tensor.copy_((t @ basis.T if transposed == "1" else basis @ t).to(tensor.dtype))
        bias = getattr(module, f"{name}_bias", None)
        if bias is not None:  # (E, d)
            bias.copy_((bias.double() @ basis.T).to(bias.dtype))
        return
    weight = module.weight
    matrix = weight.double().T if isinstance(module, Conv1D) else weight.double()
    rotated = basis @ matrix
    weight.copy_((rotated.T if isinstance(module, Conv1D) else rotated).to(weight.dtype))
    if getattr(module, "bias", None) is not None:
        module.bias.copy_((basis @ module.bias.double()).to(module.bias.dtype))


def _embeddings(model: PreTrainedModel, hidden: int) -> list[nn.Embedding]:
    """Token and absolute position embeddings of the residual's width (GPT-2's wte and wpe)."""
    base = decoder_stack(model).base
    return [m for m in base.children() if isinstance(m, nn.Embedding) and m.weight.shape[1] == hidden]


# -- helpers -------------------------------------------------------------------------------------------------------


def mlp_activation(model: PreTrainedModel) -> str:
    """The MLP activation the model's config names (transformers' ACT2FN name), or "unknown"."""
    text = model.config.get_text_config()
    for key in ("hidden_act", "mlp_hidden_act", "activation_function", "hidden_activation", "activation"):
        value = getattr(text, key, None)
        if isinstance(value, str):
            return value
    return "unknown"


def _plain(model: PreTrainedModel) -> bool:
    return any(site.kind == "plain" for layer in decoder_stack(model).layers for site in find_sites(layer))


def _log_uniform(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _signs(n: int, generator: torch.Generator) -> torch.Tensor:
    return torch.where(torch.rand(n, generator=generator) < 0.5, -1.0, 1.0).double()


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def apply(disguise: Disguise, model: PreTrainedModel, seed: int) -> PreTrainedModel:
    """``disguise`` applied with a generator seeded by ``seed`` (the model is changed in place where shapes allow)."""
    return disguise(model, torch.Generator().manual_seed(seed)).eval()


__all__: Sequence[str] = (
    "Disguise", "UnsupportedDisguise", "UnitPlan", "append_units", "apply", "compose", "dead_chain",
    "duplicate_experts", "max_logit_change", "permute_experts", "permute_units", "rescale_units", "rotate_residual",
    "split_units", "split_unlike",
)
