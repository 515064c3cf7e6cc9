"""Each MLP as the function it computes: units that compute one function together combined, units that write nothing
dropped, before the fingerprint reads any view of them.

A copier can write one MLP's function with many sets of units: a unit split into parts that share its gate row (the
parts' up rows or output columns need not be copies: u/2 + v and u/2 - v), into any number of parts, padded with
units whose output columns are zero or with twins whose writes cancel. All of these leave the outputs exactly as they
were, and all of them are undone here, in each MLP's own weights and in float64 (scanner.stats.canonical has the
algebra and why a copier cannot steer it): units whose gates (input rows for a plain MLP, biases included) agree
to `SAME_FUNCTION_COSINE` in what they compute on the MLP's inputs (what rows hold along directions the input never
takes is the copier's to set, so rows may be stored far apart or close together whatever they compute; without the
inputs, rows that agree to `SAME_GATE_COSINE` as stored), form bounded groups, and each group becomes the leading
rank-one factor of the sum of its members' (output column x up row) products (a plain MLP's: the sum of their output
columns). One gate computes one function: in any output-preserving rewrite of an MLP whose units have gates of their
own the sum has rank one, and whatever else it holds is rounding (parts stored in half precision whose reads and
writes both differ cancel inexactly, and an independent check's copies left up to 26 such factors per unit; kept as
units, each with its gate's view, their ties took every bit of evidence: bench/redteam/canonical48). A unit that
writes nothing, alone or after its group is summed, is dropped. Units are returned in the order of their groups'
leaders' stored indices.

Where act(z) - act(-z) = z (SiLU, GELU, ReLU: act(z) = z s(z) with s(z) + s(-z) = 1), a unit's gate row can be
negated and the linear remainder written with other units: (k, r, w) is exactly (-k, r, w), (r, k, w), (-r, k, -w).
So there gate rows are grouped up to sign, and a member whose gate points the other way adds its product to the
group as it is (act(-k x) = act(k x) - k x: its act part has the same coefficient); what is left, a product of two
linear maps, is not a unit's function and is not kept. The remainder units of such a copy then cancel in their group
and are dropped as dead, and the flipped unit is its original up to its gate's sign, which the test does not read
(`odd_linear`; scanner.stats.independence matches such gate views up to sign).

Where the activation is positively homogeneous (ReLU: act(c z) = c^k act(z) for c > 0), rows of one direction and
any positive scale are one gate, and the scale is folded into the product; elsewhere a gate is one only where its
scale agrees too (to `SAME_SCALE`), since act(2z) is another function. An ordinary trained MLP has no two gate rows
that close (nearest neighbours at cosine 0.55 in the zoo's models, 0.94 at most in SmolLM2-135M; on the canonical
tokens 0.96 and 0.9998), so for it the canonical form is the MLP as stored, and nothing is copied.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from transformers.activations import ACT2FN

from scanner.reading.architectures.sites import SiteWeights
from scanner.stats.canonical import CANCELLED, RowView, close_pairs, leader_groups, leader_order, rank_one_factors

#: Activations with act(c x) = c^degree act(x) for c > 0 (transformers' ACT2FN names).
HOMOGENEOUS_DEGREE = {"relu": 1, "leaky_relu": 1, "relu2": 2}
#: Without the MLP's inputs, two units share a gate when their gate rows (with biases) agree to this cosine in the
#: weights: the parts of a split unit (cosine 1, or about 1 - jitter^2 / 2 with jitter on them). A copier who moves
#: the parts further apart along directions the input takes changes what each part computes by about the angle
#: times the size of the parts' up rows, which he chose large to hide the unit: a change of the outputs as large as
#: training makes. (With the inputs, rows are compared only by what they compute: `_gate_groups`.)
SAME_GATE_COSINE = 0.95
#: Two units share a gate, too, when their gates' pre-activations on the MLP's own inputs (the canonical tokens'),
#: biases included, agree to this cosine: rows that differ only along directions the input never takes (LayerNorm's
#: output has none along 1 / gain; a widened stream's never-written coordinates have none at all) compute one
#: function however far apart they are stored, and agree there to float rounding (1 - 1e-12). Far tighter than
#: `SAME_GATE_COSINE`, because a few hundred tokens are fewer than a real model's input dimensions and its inputs
#: on random tokens lie close together: SmolLM2-135M's nearest two gates agree there to 0.9998 (deep blocks), the
#: zoo's to 0.96. A copier who moves the parts of a split unit apart by the angle this leaves (0.014 rad) changes
#: each part's pre-activation by that fraction, times parts he made large to hide the unit.
SAME_FUNCTION_COSINE = 0.9999
#: Canonical units whose output columns agree to this cosine (either sign) in the span of the MLP's inputs write one
#: column, and are one unit where their pre-activations agree to `SAME_GATE_COSINE` (`_near_copies_joined`). Honest
#: units do not write one column, and a copier who makes two write one changes what the block writes.
SAME_WRITE_COSINE = 0.9999
#: Gate rows of a non-homogeneous activation are one gate only where their lengths agree to this fraction too.
SAME_SCALE = 0.05
#: Rows of a map `_directions` and `_norms` read at a time: their float32 and float64 temporaries stay at tens of MB
#: (a 7B plain MLP's 16384 x 4097 fc map read whole took 1 GiB of them, a quarter of a fingerprint's memory goal).
_ROWS = 2048
#: A unit that writes, at every canonical token, less than this fraction of what the MLP's units write together there
#: and of the residual stream it writes into writes nothing a float32 model can resolve (`_written_on_inputs`;
#: without the inputs: a unit whose size as weights, |output column| |up row| |gate row|^degree, is below this
#: fraction of the median unit's).
DEAD = 1e-6


@dataclass(frozen=True)
class CanonicalMLP:
    """One MLP's canonical units and what became of the units as stored."""

    weights: SiteWeights
    stored: int  # units as stored
    dead: int  # units that write nothing, alone or with the units they were combined with
    combined: int  # units folded into another unit's function (a group of k live units counts k - 1)
    #: (tokens, units) the gates' pre-activations on the inputs, bias included, where they were read and the canonical
    #: units are the units as stored: the first view, which the caller need not compute again
    pre_activation: torch.Tensor | None = field(default=None, compare=False, repr=False)

    @property
    def unchanged(self) -> bool:
        return self.dead == 0 and self.combined == 0


def canonical_mlp(weights: SiteWeights, activation: str, inputs: torch.Tensor | None = None,
                  pre_activation: torch.Tensor | None = None, mean_unseen: bool = False,
                  up_output: torch.Tensor | None = None, stream: torch.Tensor | None = None) -> CanonicalMLP:
    """The MLP's canonical units (see the module): the weights as given when nothing changes, else new maps of the
    weights' device and dtype, units in the order of their groups' leaders' stored indices. ``inputs`` (tokens, d): the
    MLP's input on the canonical tokens, where gates are also compared by what they compute there
    (`SAME_FUNCTION_COSINE`); ``pre_activation`` (tokens, units): the gates' pre-activations on them, bias included,
    where the caller has them already. ``mean_unseen``: the block's norms remove each row's mean
    (scanner.reading.architectures.norms), so the units' output columns count, and are returned, less their
    all-ones part (`columns_mean_free`), and a unit that writes only along it writes nothing. ``up_output``
    (tokens, units): a gated MLP's up outputs on the inputs, bias included, where the caller has them already (the
    dead-unit bar reads them: `_written_on_inputs`). ``stream`` (tokens, d): the residual stream the block writes
    into, less its all-ones direction where ``mean_unseen``: what a unit's write is weighed against."""
    units = weights.up.shape[0]
    gated = weights.gate is not None
    key_map, key_bias = (weights.gate, weights.gate_bias) if gated else (weights.up, weights.up_bias)
    directions, key_norms = _directions(key_map, key_bias)
    if pre_activation is None and inputs is not None:
        pre_activation = _pre_activation(inputs, key_map, key_bias)
    functions = None if pre_activation is None else _directions(pre_activation.T, None)
    degree = HOMOGENEOUS_DEGREE.get(activation, 0)
    stored = row_lengths(weights.down.T)
    written, unseen = stored, np.zeros(units, dtype=bool)
    if mean_unseen:
        weights = replace(weights, down=columns_mean_free(weights.down))
        written = row_lengths(weights.down.T)
        unseen = written <= CANCELLED * stored  # all it writes is rounding of a direction the block does not see
    mass = _mass(weights, written, key_norms, degree)
    zero_key = key_norms == 0
    shares = _written_on_inputs(weights, activation, inputs, pre_activation, up_output, stream)
    if shares is None:  # no inputs: the weights' sizes, against the median unit's
        reference = mass[(mass > 0) & ~_silent(activation, zero_key) & ~unseen]
        live = mass > DEAD * float(np.median(reference)) if reference.size else np.zeros(units, dtype=bool)
    else:  # what each unit writes on the inputs, against what the units write together and the stream
        live = written * shares > DEAD
    live &= ~unseen
    if _silent_at_zero(activation):
        live &= ~zero_key
    sign_free = odd_linear(activation)
    groups = _gate_groups(directions, key_norms, mass, live, zero_key, degree, sign_free, functions)
    if live.all() and (groups == np.arange(units)).all():
        exact = CanonicalMLP(weights, units, 0, 0, pre_activation)
    elif (groups[live] == np.flatnonzero(live)).all():  # only dead units: select the live rows
        exact = CanonicalMLP(_select(weights, live), units, int((~live).sum()), 0)
        functions = None if functions is None else (functions[0][live], functions[1][live])
    else:
        exact = _combined(weights, stored, key_norms, mass, groups, degree, functions)
        functions = None
    return exact if inputs is None else _near_copies_joined(exact, inputs, degree, sign_free, functions)


def _near_copies_joined(exact: CanonicalMLP, inputs: torch.Tensor, degree: int, sign_free: bool,
                        functions: tuple[np.ndarray, np.ndarray] | None) -> CanonicalMLP:
    """The canonical units after the exact algebra, with those that write one column (`SAME_WRITE_COSINE`, either
    sign, in the span of the inputs) and compute nearly one function on the inputs (`SAME_GATE_COSINE`) combined as
    one group each: the parts of a unit split with jitter on its gate (antithetic jitter 0.15 in 4 parts leaves
    their pre-activations at cosine 0.99, and kept apart their ties took the evidence of a plain GELU copy: log10 p
    -9.8). Only after the exact groups are summed: decoy twins that cancel exactly, stored beside each part with a
    column parallel to the part's and a gate near its own, once led the parts into groups of their own by this rule
    (bench/redteam/canonical50; "no evidence" on the plain kinds); summed first, they are nothing, and a unit that
    survives the exact algebra writes something of its own. ``functions``: the units' pre-activations' directions and
    lengths where they are known, else read here."""
    w = exact.weights
    gated = w.gate is not None
    key_map, key_bias = (w.gate, w.gate_bias) if gated else (w.up, w.up_bias)
    if w.up.shape[0] < 2:
        return exact
    if functions is None:
        functions = _directions(_pre_activation(inputs, key_map, key_bias).T, None)
    one_column = close_pairs([RowView(_write_directions(inputs, w.down), sign_free=True)], SAME_WRITE_COSINE)
    first, second = _agreeing(*one_column, *functions, degree, sign_free, SAME_GATE_COSINE)
    if not first.size:
        return exact
    directions, key_norms = _directions(key_map, key_bias)
    stored = row_lengths(w.down.T)
    mass = _mass(w, stored, key_norms, degree)
    groups = leader_groups(w.up.shape[0], first, second, leader_order(mass, directions))
    joined = _combined(w, stored, key_norms, mass, groups, degree, functions)
    return CanonicalMLP(joined.weights, exact.stored, exact.dead + joined.dead, exact.combined + joined.combined)


def columns_mean_free(down: torch.Tensor) -> torch.Tensor:
    """Output columns less their all-ones component, in float64 before the maps' dtype, `_ROWS` columns at a time (a
    7B plain MLP's 4096 x 16384 map read whole took 1.25 GiB of float64 copies, a third of a fingerprint's memory
    goal). Where the block does not see that direction, a unit that writes only along it (or twins whose writes
    differ only along it) writes nothing, and the canonical form must see it so (an independent check padded copies
    with such units: tests/fixtures/stream_offset.py)."""
    out = torch.empty_like(down)
    for start in range(0, down.shape[1], _ROWS):
        wide = down[:, start:start + _ROWS].detach().double()
        out[:, start:start + _ROWS] = wide - wide.mean(dim=0, keepdim=True)
    return out


@functools.cache
def odd_linear(activation: str) -> bool:
    """Whether act(z) - act(-z) = z (to float32 rounding), so that a gate row's sign can be turned at the price of a
    linear remainder (see the module): then a gate view's sign carries no identity."""
    if activation not in ACT2FN:
        return False
    z = torch.linspace(-8.0, 8.0, 257, dtype=torch.float64)
    act = ACT2FN[activation]
    return bool(torch.allclose(act(z) - act(-z), z, rtol=1e-5, atol=1e-6))


def _gate_groups(directions: np.ndarray, key_norms: np.ndarray, mass: np.ndarray, live: np.ndarray,
                 zero_key: np.ndarray, degree: int, sign_free: bool,
                 functions: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """The leader of each live unit's gate group (-1 for dead units): gates that agree in what they compute on the
    inputs (``functions``: the pre-activations' directions and lengths, `SAME_FUNCTION_COSINE`), or, without the
    inputs, gate rows that agree as stored (`SAME_GATE_COSINE`), up to sign where ``sign_free`` (`odd_linear`); live
    units with an all-zero gate row (a linear unit, act(0) times its up row) share one group.

    Where the inputs are read, rows that agree as stored are not enough: rows differ as stored by whatever they hold
    along directions the input never takes, which a copier sets freely. An independent check moved every gate row of
    a block by one large vector along such a direction (LayerNorm's 1 / gain, a widened stream's zero coordinates):
    every row then agreed with every other to cosine 0.99 as stored while computing what it computed before, each
    block became one unit, and every kind tested CANNOT TEST (bench/redteam/canonical49); with decoy twins stored
    beside each part of a split unit, the decoys led the parts into groups of their own."""
    if functions is None:
        first, second = _close_gates(directions, key_norms, degree, sign_free, SAME_GATE_COSINE)
    else:
        first, second = _close_gates(*functions, degree, sign_free, SAME_FUNCTION_COSINE)
    linear = np.flatnonzero(live & zero_key)
    if linear.size > 1:
        pairs = np.array([(a, b) for i, a in enumerate(linear) for b in linear[i + 1:]]).T
        first, second = np.concatenate([first, pairs[0]]), np.concatenate([second, pairs[1]])
    order = leader_order(mass, directions)
    return leader_groups(directions.shape[0], first, second, order, eligible=live)


def _close_gates(directions: np.ndarray, norms: np.ndarray, degree: int, sign_free: bool,
                 cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """Pairs of units whose gate ``directions`` agree to ``cosine`` (up to sign where ``sign_free``) and, where the
    activation is not homogeneous (act(2z) is another function), whose lengths agree to `SAME_SCALE`."""
    first, second = close_pairs([RowView(directions, sign_free)], cosine)
    return _agreeing(first, second, directions, norms, degree, sign_free, -1.0)


def _agreeing(first: np.ndarray, second: np.ndarray, directions: np.ndarray, norms: np.ndarray, degree: int,
              sign_free: bool, cosine: float) -> tuple[np.ndarray, np.ndarray]:
    """The pairs among (``first``, ``second``) whose gate ``directions`` agree to ``cosine`` (up to sign where
    ``sign_free``) and, where the activation is not homogeneous, whose lengths agree to `SAME_SCALE`."""
    agree = np.einsum("ij,ij->i", directions[first].astype(np.float64), directions[second])
    keep = (np.abs(agree) if sign_free else agree) >= cosine
    if not degree:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.abs(np.log(norms[first] / norms[second]))
        keep &= ratio <= math.log1p(SAME_SCALE)
    return first[keep], second[keep]


def _write_directions(inputs: torch.Tensor, down: torch.Tensor) -> np.ndarray:
    """(units, r) float32: each output column's part in the span of the inputs' token rows (the directions they take
    to within `DEAD` of the largest), in an orthonormal basis of that span, at unit length (zero columns stay zero).
    Parallel columns stay parallel whatever the basis, and an orthonormal one lets no direction every token shares
    (a norm's bias, a massive activation) make columns look alike. Float32 is enough for cosines at
    `SAME_WRITE_COSINE` (each column is divided by its peak first, so columns of 1e30 or 1e-30 neither overflow nor
    underflow); a 7B plain MLP's 4096 x 16384 map is read `_ROWS` columns at a time (temporaries of 32 MB)."""
    basis = _input_span(inputs)
    out = np.empty((down.shape[1], basis.shape[0]), dtype=np.float32)
    for start in range(0, down.shape[1], _ROWS):
        columns = down[:, start:start + _ROWS].detach().cpu().float().T
        peak = columns.abs().amax(dim=1, keepdim=True)
        projected = (columns / torch.where(peak > 0, peak, torch.ones_like(peak))) @ basis.T
        lengths = torch.linalg.vector_norm(projected, dim=1, keepdim=True)
        out[start:start + _ROWS] = (projected / torch.where(lengths > 0, lengths, torch.ones_like(lengths))).numpy()
    return out


_LAST_SPAN: list[tuple[torch.Tensor, torch.Tensor]] = []
"""The inputs `_input_span` read last (held, so no other tensor can take their identity) and their span: every
expert of a site reads the same inputs, and the decomposition, repeated per expert, cost 0.11 s each at
DeepSeek-V3's width (27 min of a 256-expert, 58-block fingerprint on 2 cores) against 0.06 s for the projection it
serves."""


def _input_span(inputs: torch.Tensor) -> torch.Tensor:
    """(r, d) float32 orthonormal rows spanning the inputs' token rows (the directions they take to within `DEAD` of
    the largest), computed once for consecutive calls on the same inputs (a block's MLP input, captured from its
    forward and never written to; inference tensors keep no version counter to check)."""
    if _LAST_SPAN and _LAST_SPAN[0][0] is inputs:
        return _LAST_SPAN[0][1]
    rows = inputs.reshape(-1, inputs.shape[-1]).detach().double().cpu()
    _, spread, directions = torch.linalg.svd(rows, full_matrices=False)
    basis = directions[spread > DEAD * spread[0]].float()
    _LAST_SPAN[:] = [(inputs, basis)]
    return basis


def _pre_activation(inputs: torch.Tensor, key_map: torch.Tensor, key_bias: torch.Tensor | None) -> torch.Tensor:
    """(tokens, units): each gate's pre-activation on the inputs, bias included, on the maps' device in float32 at
    least (a half-precision product would round away the agreement the bar reads)."""
    dtype = torch.promote_types(key_map.dtype, torch.float32)
    pre = inputs.to(device=key_map.device, dtype=dtype) @ key_map.detach().to(dtype).T
    return pre if key_bias is None else pre + key_bias.detach().to(dtype)


@dataclass(frozen=True)
class _Writes:
    """The output columns as the block sees them (rows, float64) and their lengths as stored, at which the values
    were rounded: what a group writes is rounding below `CANCELLED` of its members' stored products."""

    seen: np.ndarray
    stored: np.ndarray


def _mass(weights: SiteWeights, written: np.ndarray, key_norms: np.ndarray, degree: int) -> np.ndarray:
    """Each unit's size as weights: its output column's length (``written``) times its gate row's to the
    activation's homogeneous degree, times its up row's where gated. Groups are led in its order."""
    mass = written * key_norms ** degree
    return mass if weights.gate is None else mass * _directions(weights.up, weights.up_bias)[1]


def _combined(weights: SiteWeights, stored: np.ndarray, key_norms: np.ndarray, mass: np.ndarray, groups: np.ndarray,
              degree: int, functions: tuple[np.ndarray, np.ndarray] | None) -> CanonicalMLP:
    """New maps: per group, one gate row (`_group_key`) and the factors of its members' summed products. ``stored``:
    the output columns' lengths as stored, at which their values were rounded (what a group writes is rounding
    below `CANCELLED` of its members' stored products)."""
    gated = weights.gate is not None
    keys = _rows(weights.gate, weights.gate_bias) if gated else _rows(weights.up, weights.up_bias)
    reads = _rows(weights.up, weights.up_bias) if gated else None
    columns = _Writes(weights.down.detach().double().cpu().numpy().T, stored)
    units, writes = keys.shape[0], columns.seen
    out_keys, out_reads, out_writes = [], [], []
    dead = int((groups < 0).sum())
    combined = 0
    for leader in np.unique(groups[groups >= 0]):
        members = np.flatnonzero(groups == leader)
        if members.size == 1:
            out_keys.append(keys[leader])
            out_writes.append(writes[leader])
            if reads is not None:
                out_reads.append(reads[leader])
            continue
        key, scale = _group_key(keys[members], key_norms[members], mass[members], degree,
                                None if functions is None else (functions[0][members], functions[1][members]))
        if reads is None:  # plain: act(k x) times the sum of the output columns
            total = (scale[:, None] * writes[members]).sum(axis=0)
            bound = float(np.sum(scale * columns.stored[members]))
            factors = [] if np.linalg.norm(total) <= CANCELLED * bound else [(total, None)]
        else:
            found = rank_one_factors(writes[members], reads[members], scale, write_lengths=columns.stored[members])
            factors = list(zip(found.writes, found.reads, strict=True))[:1]  # one gate, one function (module)
        if not factors:
            dead += members.size
            continue
        combined += members.size - len(factors)
        for write, read in factors:
            out_keys.append(key)
            out_writes.append(write)
            if reads is not None:
                out_reads.append(read)
    like = weights.down
    key_rows = _tensor(out_keys, keys.shape[1], like)
    write_rows = _tensor(out_writes, writes.shape[1], like)
    read_rows = None if reads is None else _tensor(out_reads, reads.shape[1], like)
    width = weights.up.shape[1]
    if weights.gate is not None:
        canonical = SiteWeights(up=read_rows[:, :width].contiguous(), down=write_rows.T.contiguous(),
                                gate=key_rows[:, :width].contiguous(),
                                gate_bias=None if weights.gate_bias is None else key_rows[:, width].contiguous(),
                                up_bias=None if weights.up_bias is None else read_rows[:, width].contiguous())
    else:
        canonical = SiteWeights(up=key_rows[:, :width].contiguous(), down=write_rows.T.contiguous(),
                                up_bias=None if weights.up_bias is None else key_rows[:, width].contiguous())
    return CanonicalMLP(canonical, units, dead, combined)


def _group_key(keys: np.ndarray, norms: np.ndarray, mass: np.ndarray, degree: int,
               functions: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """One gate row for a group (its members' directions, turned to the largest member's sign where they point the
    other way (`odd_linear`; elsewhere no member does), averaged with weights their sizes, at their mean length, or
    at length 1 where the activation is homogeneous) and each member's factor on it: |k_j|^degree where
    act(k_j x) = |k_j|^degree act(k x) folds the member's gate scale into its product, else 1.

    With the members' pre-activations on the inputs (``functions``: directions and lengths), "the other way" and
    "length" are read there: members that compute one function may be stored far apart along directions the input
    never takes (`SAME_FUNCTION_COSINE`), where their stored rows' signs and lengths say nothing."""
    weights = mass / max(float(mass.max()), 1e-300)
    lead = int(np.argmax(weights))
    directions = keys / np.where(norms > 0, norms, 1.0)[:, None]
    agree = directions @ directions[lead] if functions is None else functions[0].astype(np.float64) @ functions[0][lead]
    turn = np.where(agree < 0, -1.0, 1.0)
    mean = weights @ (directions * turn[:, None])
    length = float(np.linalg.norm(mean))
    direction = mean / length if length > 0 else mean
    if functions is None:  # each member's gate: its length times the key's direction
        scales = norms
    else:  # each member's pre-activation over that of the key at unit length (one function: the same direction)
        lengths = functions[1]
        key_function = (weights * turn * lengths / np.where(norms > 0, norms, 1.0)) @ functions[0].astype(np.float64)
        scales = lengths / max(float(np.linalg.norm(key_function)) / max(length, 1e-300), 1e-300)
    if degree:
        return direction, scales ** degree
    return direction * float(weights @ scales / weights.sum()), np.ones(keys.shape[0])


def _rows(matrix: torch.Tensor, bias: torch.Tensor | None) -> np.ndarray:
    """(units, d [+ 1]) float64 rows on the CPU: a map's rows with its bias as one more column."""
    rows = matrix.detach().double().cpu()
    if bias is not None:
        rows = torch.cat([rows, bias.detach().double().cpu()[:, None]], dim=1)
    return rows.numpy()


def _directions(matrix: torch.Tensor, bias: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """(unit-length rows as float32 on the CPU, their lengths as float64) of a map's rows with its bias as one more
    column; each row is divided by its peak first, so rows of 1e30 or 1e-30 (a rescaled unit) neither overflow nor
    underflow. `_ROWS` rows at a time."""
    units = matrix.shape[0]
    unit = np.empty((units, matrix.shape[1] + (bias is not None)), dtype=np.float32)
    lengths = np.empty(units)
    for start in range(0, units, _ROWS):
        part = slice(start, start + _ROWS)
        unit[part], lengths[part] = _unit_rows(matrix[part], None if bias is None else bias[part])
    return unit, lengths


def _unit_rows(matrix: torch.Tensor, bias: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """`_directions` of a few rows."""
    rows = matrix.detach()
    if bias is not None:
        rows = torch.cat([rows, bias.detach().to(rows.dtype)[:, None]], dim=1)
    rows = rows.float()
    peak = rows.abs().amax(dim=1, keepdim=True) if rows.shape[1] else torch.zeros_like(rows[:, :1])
    scaled = rows / torch.where(peak > 0, peak, torch.ones_like(peak))
    lengths = torch.linalg.vector_norm(scaled, dim=1, keepdim=True, dtype=torch.float64)
    unit = scaled / lengths.clamp_min(1e-300).to(scaled.dtype)
    return unit.cpu().numpy(), (lengths[:, 0] * peak[:, 0].double()).cpu().numpy()


def row_lengths(matrix: torch.Tensor) -> np.ndarray:
    """Row lengths as float64 (rows of any finite scale: each divided by its peak before it is squared, so a unit
    rescaled by 1e-30 or 1e30 neither underflows nor overflows), `_ROWS` rows at a time."""
    lengths = np.empty(matrix.shape[0])
    for start in range(0, matrix.shape[0], _ROWS):
        rows = matrix[start:start + _ROWS].detach().float()
        peak = rows.abs().amax(dim=1) if rows.shape[1] else torch.zeros(rows.shape[0], device=rows.device)
        safe = torch.where(peak > 0, peak, torch.ones_like(peak))
        part = torch.linalg.vector_norm(rows / safe[:, None], dim=1, dtype=torch.float64)
        lengths[start:start + _ROWS] = (part * peak.double()).cpu().numpy()
    return lengths


def _select(weights: SiteWeights, keep: np.ndarray) -> SiteWeights:
    """The units ``keep`` selects, as views of the given maps."""
    index = torch.as_tensor(np.flatnonzero(keep), device=weights.up.device)

    def rows(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, index)

    return SiteWeights(up=rows(weights.up), down=weights.down.index_select(1, index), gate=rows(weights.gate),
                       gate_bias=rows(weights.gate_bias), up_bias=rows(weights.up_bias))


def _tensor(rows: list[np.ndarray], dims: int, like: torch.Tensor) -> torch.Tensor:
    """The rows as one tensor of ``like``'s device and dtype (the maps are used beside the given ones)."""
    stacked = np.stack(rows) if rows else np.zeros((0, dims))
    return torch.from_numpy(stacked).to(device=like.device, dtype=like.dtype)


def _written_on_inputs(weights: SiteWeights, activation: str, inputs: torch.Tensor | None,
                       pre_activation: torch.Tensor | None, up_output: torch.Tensor | None = None,
                       stream: torch.Tensor | None = None) -> np.ndarray | None:
    """Per unit, the largest share of a reference its hidden value (act(gate), times the up output where gated)
    takes at any of the inputs' tokens: a unit writes nothing when that share times its output column is below
    `DEAD`. The references, token by token: what the MLP's units write together there, and the residual ``stream``
    the block writes into (tokens, d; less its all-ones direction where the block cannot see it), where given. A
    token where a reference is all but zero (below `DEAD` of its median token's) is left out of it: a zero stream
    row (an all-zero padding embedding) would otherwise make every unit loud there. ``up_output``: the up outputs
    where the caller has them, else computed here. None without the pre-activations (and, where gated, the up
    outputs or the inputs), or for an activation transformers does not name. A unit whose hidden value is exactly
    zero on every token (act(0 x) = 0, ReLU(k x - 1e4) = 0) writes nothing whatever its size (an independent check
    appended such units: tests/fixtures/silent_units.py).

    What a unit adds below 1e-6 of both is below what float32 resolves in either, and a copier moves each only where
    the other holds: independent checks moved every single reference. The median unit's weights: units 1e8 times a
    real unit as weights that wrote 1e-12 of one made the median (bench/redteam/canonical48, "no evidence"). What the
    units write together: a constant unit writing 2^40 along a coordinate of a widened stream, taken back exactly by
    the output map's bias or by a twin expert's unit writing -2^40 (bench/redteam/canonical51, CANNOT TEST); the
    stream stays as it was. The stream: where a norm follows the MLP (OLMo2's and Gemma's post-feedforward norms), the
    whole stream scaled by 2^24, the maps that read it and the norms' gains scaled back, leaves every unit as it was
    and made each one 2^-24 of the stream (bench/redteam/canonical52, CANNOT TEST); what the units write is as it
    was."""
    gated = weights.gate is not None
    if pre_activation is None or activation not in ACT2FN or (gated and inputs is None and up_output is None):
        return None
    with torch.no_grad():
        hidden = ACT2FN[activation](pre_activation.double())
        if gated:
            up = _pre_activation(inputs, weights.up, weights.up_bias) if up_output is None else up_output
            hidden = hidden * up.double()
        down = weights.down.detach()
        dtype = torch.promote_types(down.dtype, torch.float32)
        output = hidden.to(device=down.device, dtype=dtype) @ down.to(dtype).T
        references = [torch.linalg.vector_norm(output.double(), dim=1).to(hidden.device)]
        rows = None if stream is None else stream.detach().reshape(-1, stream.shape[-1])
        if rows is not None and rows.shape[0] == hidden.shape[0]:
            references.append(torch.linalg.vector_norm(rows.to(hidden.device).double(), dim=1))
        hidden = hidden.abs()  # a copy: an activation that returns its input (linear) would alias the caller's
        share = torch.zeros(hidden.shape[1], dtype=torch.float64, device=hidden.device)
        for lengths in references:
            kept = lengths > DEAD * lengths.median()
            if kept.any():
                share = torch.maximum(share, (hidden[kept] / lengths[kept, None]).amax(dim=0))
        return share.cpu().numpy()


def _silent(activation: str, zero_key: np.ndarray) -> np.ndarray:
    """Units with an all-zero gate row where act(0) = 0: they compute nothing whatever their size, and where the
    inputs are not given they are left out of the median `DEAD` is then measured against (a copier who appends many
    such units of any size would otherwise move the median and have every real unit called dead)."""
    return zero_key.copy() if _silent_at_zero(activation) else np.zeros_like(zero_key)


def _silent_at_zero(activation: str) -> bool:
    """Whether act(0) = 0, so a unit whose gate row and bias are zero computes nothing (unknown: assume it does)."""
    if activation not in ACT2FN:
        return False
    return float(ACT2FN[activation](torch.zeros(1))[0]) == 0.0
