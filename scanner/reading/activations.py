"""MLP activations on canonical inputs, from the model's own transformers forward pass.

The inputs to every block's MLP are captured with forward pre-hooks on transformers' modules for the
architecture (no hand-written attention), then each gated MLP's gate and up outputs are computed from
the adapter's canonical weights. Every MoE expert is evaluated on every token: the result is a
deterministic function of the MLP input, equivariant to unit permutations, whatever the router does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.activations import ACT2FN

from scanner.errors import CheckpointError, IncomparableError
from scanner.reading.architectures.config import transformers_config
from scanner.reading.architectures.families import ArchitectureAdapter
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import SiteWeights
from scanner.reading.canonical_mlp import canonical_mlp, odd_linear, row_lengths
from scanner.reading.checkpoint import Checkpoint
from scanner.stats.canonical import output_groups, output_sizes
from scanner.stats.degenerate import UnitScreen, host_rows
from scanner.stats.independence import match_screen
from scanner.stats.matching import unit_rows_tensor
from scanner.stats.views import oriented_rows


@dataclass(frozen=True)
class MLPActivations:
    """One MLP's views of its canonical units (scanner.reading.canonical_mlp) on the canonical tokens, shaped (units,
    tokens): a gated MLP's gate pre-activation and up output, a plain one's fc pre-activation and write direction
    (`plain_views`); and what each unit writes, its output column read on the residual stream (`write_view`).

    As computed they are float32 values. A fingerprint stores each unit's row divided by its largest magnitude (every
    stored value within [-1, 1], so float16 holds any unit a rescale left at 1e-30 or 1e30; the write view in int8
    steps of 1/127) and keeps that magnitude in ``gate_scale`` / ``up_scale`` / ``write_scale``; MATCH reads
    directions only, and `values` gives back the activations where a statistic needs their size (phi_H).
    ``dead`` and ``combined`` count the units as stored that the canonical form dropped or folded into others.
    """

    gate: np.ndarray
    up: np.ndarray
    gate_scale: np.ndarray | None = None  # (units,) float32: the stored row times this is the activation row
    up_scale: np.ndarray | None = None
    write: np.ndarray | None = None  # (units, tokens); None where no residual stream was read (synthetic views)
    write_scale: np.ndarray | None = None
    dead: int = 0
    combined: int = 0
    written: np.ndarray | None = None  # (units,) float32: each unit's net write size, where no write view was read
    weight: np.ndarray | None = None  # (tokens,) float32: the weight the block gave this routed expert's output on
    # each token (its routing, 0 where not chosen); None where it is always 1 (dense, shared) or was not seen

    def values(self, part: str) -> np.ndarray:
        """A view's activations (float64 when stored scaled: a product of two rescaled units may exceed float32)."""
        rows, scale = getattr(self, part), getattr(self, f"{part}_scale")
        if rows.dtype == np.int8:
            rows = rows.astype(np.float32) / WRITE_STEPS
        if scale is None:
            return np.asarray(rows)
        return np.asarray(rows, dtype=np.float64) * np.asarray(scale, dtype=np.float64)[:, None]

    def normalised(self) -> MLPActivations:
        """Each row divided by its largest magnitude, the magnitudes kept (the form fingerprints store)."""
        (gate, gate_scale), (up, up_scale) = peak_scaled(self.values("gate")), peak_scaled(self.values("up"))
        write, write_scale = peak_scaled(self.values("write")) if self.write is not None else (None, None)
        return MLPActivations(gate, up, gate_scale, up_scale, write, write_scale, self.dead, self.combined,
                              self.written, self.weight)

    def screen(self, up_sign_free: bool) -> UnitScreen:
        """The units phi_MATCH reads (scanner.stats.degenerate), computed once per object and flag."""
        cache = self.__dict__.setdefault("_screens", {})
        if up_sign_free not in cache:
            write = None if self.write is None else self.write.astype(np.float32)
            cache[up_sign_free] = match_screen(host_rows(self.gate), host_rows(self.up), up_sign_free, write,
                                               self.magnitude())
        return cache[up_sign_free]

    def magnitude(self) -> np.ndarray:
        """How much each unit contributes, |up row| |write row| (|up row| times its output column's length where the
        layout gave no residual stream to read the write on; |up row| alone for synthetic views), from the stored rows
        and their scales in float64: unchanged by every output-preserving rescale of a unit."""
        size = _row_lengths(self.up, self.up_scale)
        writes = self._write_sizes()
        return size if writes is None else size * writes

    def _write_sizes(self) -> np.ndarray | None:
        """Each unit's write size in float64: its write view's length where one was read, else its net write size
        where that was kept (`net_written`), else None (synthetic views)."""
        if self.write is not None:
            return _row_lengths(self.write, self.write_scale)
        return None if self.written is None else np.asarray(self.written, dtype=np.float64)

    def hidden(self, activation: str, kind: str = "gated") -> np.ndarray:
        """phi_H's matrix: the down projection's input, sigma(Gx) * (Ux) for a gated MLP, sigma(Wx + b) for a plain
        one (whose first view is that pre-activation)."""
        if activation not in ACT2FN:
            raise IncomparableError(f"phi_H needs the MLP's activation; {activation!r} is not one transformers names")
        act = ACT2FN[activation]
        hidden = act(torch.from_numpy(self.values("gate")).double())
        return (hidden if kind == "plain" else hidden * torch.from_numpy(self.values("up")).double()).numpy()


@dataclass(frozen=True)
class BlockContributions:
    """What each unit of a block's MLPs adds to the block's output (`block_contributions`), one array per MLP:
    ``sizes``, which choose the units a block pools; ``distinct``, the same with units counted with units of another
    MLP as nothing: what tells one expert from another, which the expert pairing weighs (a unit repeated in every
    expert made every expert's largest units alike, and the pairing fell to stored order: bench/redteam/canonical61,
    canonical62)."""

    sizes: list[np.ndarray]
    distinct: list[np.ndarray]


def block_contributions(mlps: Sequence[MLPActivations], activation: str, kind: str = "gated") -> BlockContributions:
    """How much each unit of a block's MLPs adds to the block's output on the canonical tokens, float64, one array per
    MLP: its hidden row (what the output map reads, `hidden`, the gate's activation included) as the block weighs it
    (its expert's routing weight on each token, `weight`) times its write size; `magnitude` where the activation is
    not one transformers names. Unlike `magnitude`, a unit whose gate keeps it near zero counts for what it does, not
    for the size of its up row: units built to look large (an up row and an output column 1e6 times a real unit's
    behind a gate 2^-20 of one) come last (bench/redteam/canonical59). Where every MLP's write view was read, units
    that write along one direction, in one MLP or several, count together, each for the size of their summed output
    (scanner.stats.canonical.output_groups): two loud units whose outputs cancel count for nothing
    (bench/redteam/canonical60), and so do loud units in every routed expert whose weights always sum to what a
    shared expert's units take back (bench/redteam/canonical61, canonical62). Where it was not (several streams), the
    fingerprint kept each unit's share of its MLP's such sums (`net_written`), and units are not summed across MLPs.
    Where a router weighs an expert's input rather than its output (Llama 4), its weight is read as if it weighed the
    output: a ranking of units, not the block's exact output. Both readings come from one grouping."""
    if activation not in ACT2FN:
        sizes = [mlp.magnitude() for mlp in mlps]
        return BlockContributions(sizes, sizes)
    hidden = [mlp.hidden(activation, kind) for mlp in mlps]
    weighed_rows = [h if mlp.weight is None else h * np.asarray(mlp.weight, dtype=np.float64)[None, :]
                    for h, mlp in zip(hidden, mlps, strict=True)]
    counts = [h.shape[0] for h in hidden]
    if all(mlp.write is not None for mlp in mlps):
        groups = output_groups(np.concatenate(hidden), np.concatenate([mlp.values("write") for mlp in mlps]),
                               weighed_hidden=np.concatenate(weighed_rows))
        owner = np.repeat(np.arange(len(mlps)), counts)
        lowest, highest = owner.copy(), owner.copy()
        np.minimum.at(lowest, groups.leader, owner)
        np.maximum.at(highest, groups.leader, owner)
        distinct = np.where(lowest[groups.leader] != highest[groups.leader], 0.0, groups.sizes)
        splits = np.cumsum(counts)[:-1]
        return BlockContributions(np.split(groups.sizes, splits), np.split(distinct, splits))
    alone = [np.linalg.norm(rows, axis=1) for rows in weighed_rows]
    writes = [mlp._write_sizes() for mlp in mlps]
    sizes = [size if w is None else size * w for size, w in zip(alone, writes, strict=True)]
    return BlockContributions(sizes, sizes)


def weighed(views: list[MLPActivations], weights: Sequence[torch.Tensor | None]) -> list[MLPActivations]:
    """``views`` with the first ``len(weights)`` (a block's routed experts, as joined) given the weight the block gave
    each on each token (scanner.reading.alike_experts.joined_routed), the rest as they are."""
    return [replace(v, weight=w.float().cpu().numpy()) if w is not None else v
            for v, w in zip(views, list(weights) + [None] * (len(views) - len(weights)), strict=True)]


def pooled_activations(mlps: Sequence[MLPActivations], rows: np.ndarray) -> MLPActivations:
    """A block's MLPs read as one: their units concatenated in order, then rows ``rows`` of that (a block's units
    tested pooled, scanner.stats.pooled_units); a view one MLP lacks is lacked by the whole."""
    offsets = np.cumsum([0] + [mlp.gate.shape[0] for mlp in mlps])
    owner = np.searchsorted(offsets, rows, side="right") - 1

    def joined(part: str) -> np.ndarray | None:
        parts = [getattr(mlp, part) for mlp in mlps]
        if any(x is None for x in parts):
            return None
        out = np.empty((rows.size, *parts[0].shape[1:]), dtype=parts[0].dtype)
        for k in np.unique(owner):  # gathered MLP by MLP: no copy of the whole block's views
            chosen = owner == k
            out[chosen] = parts[k][rows[chosen] - offsets[k]]
        return out

    return MLPActivations(joined("gate"), joined("up"), joined("gate_scale"), joined("up_scale"), joined("write"),
                          joined("write_scale"), dead=sum(m.dead for m in mlps), combined=sum(m.combined for m in mlps),
                          written=joined("written"))


#: The write view is stored as int8 multiples of 1/WRITE_STEPS of each unit's peak: matching reads directions, whose
#: cosines int8 rounding moves by about 1e-5, and the fingerprint grows by a quarter, not a half.
WRITE_STEPS = 127


def _row_lengths(rows: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Each row's length in float64, times its stored scale where it has one (int8 steps counted as stored: only
    ratios between units are read)."""
    lengths = np.linalg.norm(host_rows(rows).astype(np.float64), axis=1)
    return lengths if scale is None else lengths * np.asarray(scale, dtype=np.float64)


def peak_scaled(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(rows divided by their largest magnitude as float32, those magnitudes as float32); an all-zero row stays zero
    with magnitude 0. Any finite row keeps its direction to float32's precision, whatever its scale."""
    rows = np.asarray(values, dtype=np.float64)
    peak = np.abs(rows).max(axis=1) if rows.shape[1] else np.zeros(rows.shape[0])
    return (rows / np.where(peak > 0, peak, 1.0)[:, None]).astype(np.float32), peak.astype(np.float32)


def load_causal_lm(checkpoint: Checkpoint, device: str = "cpu") -> PreTrainedModel:
    """The transformers model for a validated checkpoint: safetensors only, never remote code, float32."""
    try:
        config = transformers_config(checkpoint)  # the validated config, not a second read of the file
        model = AutoModelForCausalLM.from_pretrained(
            checkpoint.path,
            config=config,
            dtype=torch.float32,
            use_safetensors=True,
            trust_remote_code=False,
            local_files_only=True,
            # hubtrace's choice, never the checkpoint's (scanner.reading.architectures.config)
            attn_implementation="eager",
        )
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{checkpoint.path}: transformers could not build the model: {exc}") from exc
    return model.to(device).eval()


def check_sequence_length(model: PreTrainedModel, ids: np.ndarray) -> None:
    """Refuse sequences longer than the model's positions (its activations there would be meaningless)."""
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and limit > 0 and ids.shape[1] > limit:  # XLNet's -1: relative positions, no limit
        raise IncomparableError(f"canonical sequences of {ids.shape[1]} tokens exceed the model's {limit} positions")


@torch.inference_mode()
def mlp_inputs(
    model: PreTrainedModel, adapter: ArchitectureAdapter, ids: np.ndarray, batch_size: int = 8
) -> list[torch.Tensor]:
    """Every block's MLP input on the token ids, as float32 (tokens, hidden) tensors on the CPU."""
    check_sequence_length(model, ids)
    n_layers = adapter.shape.n_layers
    captured: list[list[torch.Tensor]] = [[] for _ in range(n_layers)]

    def capture(layer: int):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[layer].append(hidden.detach().float().reshape(-1, hidden.shape[-1]).cpu())

        return hook

    handles = [
        model.get_submodule(adapter.mlp_module_path(layer)).register_forward_pre_hook(capture(layer), with_kwargs=True)
        for layer in range(n_layers)
    ]
    device = next(model.parameters()).device
    try:
        for start in range(0, ids.shape[0], batch_size):
            batch = torch.from_numpy(ids[start : start + batch_size]).to(device)
            model(input_ids=batch, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return [torch.cat(chunks) for chunks in captured]


@torch.inference_mode()
def next_token_log_probs(model: PreTrainedModel, ids: np.ndarray, token_range: int, batch_size: int = 8) -> np.ndarray:
    """log p(next token) over the shared id range [0, token_range), renormalised, shaped (tokens, token_range)."""
    check_sequence_length(model, ids)
    device = next(model.parameters()).device
    chunks = []
    for start in range(0, ids.shape[0], batch_size):
        logits = model(input_ids=torch.from_numpy(ids[start : start + batch_size]).to(device), use_cache=False).logits
        logits = logits[..., :token_range].float()
        chunks.append(torch.log_softmax(logits, dim=-1).reshape(-1, token_range).cpu())
    return torch.cat(chunks).numpy()


def glu_activations(mlp_input: torch.Tensor, experts: list[GLUWeights], *, activation: str,
                    stream: torch.Tensor | None = None) -> list[MLPActivations]:
    """`site_activations` of a block's gated MLPs held as GLUWeights (one per expert)."""
    return site_activations(mlp_input, [SiteWeights(up=w.up, down=w.down, gate=w.gate) for w in experts],
                            activation=activation, stream=stream)


def site_activations(mlp_input: torch.Tensor, experts: list[SiteWeights], *, activation: str,
                     stream: torch.Tensor | None = None,
                     computed: tuple[torch.Tensor, torch.Tensor] | None = None) -> list[MLPActivations]:
    """The views of every canonical unit (scanner.reading.canonical_mlp) of one MLP site (one entry per routed expert)
    on its input (tokens, d), shaped (units, tokens).

    Gated: the gate's pre-activation and the up output, as the paper's phi_MATCH reads them. Plain (fc -> act -> proj,
    no gate): `plain_views`. ``stream`` is the residual stream the block writes into (tokens, d): the write view of
    every unit reads it (`write_view`), and a plain MLP's second view too, which needs it; ``activation`` is the MLP's
    (transformers' name), which tells which gate rows compute one function. ``computed``: a dense gated MLP's gate and
    up outputs (tokens, units) as the block computed them, used as they are where the canonical form is the MLP as
    stored (no second product).
    """
    mean_unseen = stream is not None and _mean_free(stream)
    given, given_up = computed if computed is not None and len(experts) == 1 else (None, None)
    canonical = [canonical_mlp(w, activation, mlp_input, pre_activation=given, mean_unseen=mean_unseen,
                               up_output=given_up, stream=stream) for w in experts]
    weights = [c.weights for c in canonical]
    if weights[0].gate is None:
        if stream is None:
            raise ValueError("a plain MLP's second view reads the residual stream; none was given")
        views = plain_views(mlp_input, stream, weights, sign_free=odd_linear(activation),
                            pre_activations=[c.pre_activation for c in canonical])
    else:
        rows = stream_rows(stream, weights[0].down) if stream is not None else None
        views = []
        for w, c in zip(weights, canonical, strict=True):
            if computed is not None and len(weights) == 1 and c.unchanged:
                gate, up = computed
            else:
                gate = c.pre_activation  # the canonical form's product, where it read one for these units
                if gate is None:
                    gate = mlp_input @ w.gate.T
                    gate = gate if w.gate_bias is None else gate + w.gate_bias
                up = mlp_input @ w.up.T
                up = up if w.up_bias is None else up + w.up_bias
            view = MLPActivations(gate=units_by_tokens(gate), up=units_by_tokens(up))
            views.append(replace(view, write=write_view(rows, w.down)) if rows is not None
                         else replace(view, written=net_written(view, w.down, activation)))
    return [replace(v, dead=c.dead, combined=c.combined) for v, c in zip(views, canonical, strict=True)]


def net_written(view: MLPActivations, down: torch.Tensor, activation: str) -> np.ndarray:
    """Each unit's write size where the layout gives no write view (several residual streams): its output column's
    length, counted with the units that put out one function with it (`output_sizes` on the columns themselves, so
    with the whole write, not a sketch of it), as the unit's share of their summed output: a unit's hidden row
    length times this is the size of the group's output. Two loud units whose outputs cancel then write nothing
    (bench/redteam/canonical60: pairs 30 times a real unit's size, alone as large as that, once filled a DeepSeek-V4
    block's pooled units). Float32, overflow-safe (a column rescaled by 1e30 keeps its length)."""
    lengths = row_lengths(down.T)
    if activation not in ACT2FN:
        return lengths.astype(np.float32)
    hidden = view.hidden(activation)
    hidden_lengths = np.linalg.norm(hidden, axis=1)
    totals = output_sizes(hidden, down.T.double().cpu().numpy())
    shares = np.divide(totals, hidden_lengths, out=np.asarray(lengths, dtype=np.float64).copy(),
                       where=hidden_lengths > 0)
    return shares.astype(np.float32)


def _mean_free(stream: torch.Tensor) -> bool:
    """Whether every row of the stream has no mean (to float rounding): the caller removed it because the block's
    norms do not see the all-ones direction (scanner.reading.architectures.norms)."""
    rows = stream.reshape(-1, stream.shape[-1]).float()
    return bool((rows.mean(dim=1).abs() <= 1e-5 * rows.abs().amax(dim=1).clamp_min(1e-30)).all())


def stream_rows(stream: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """The residual stream's token rows at unit length (tokens, d), in the output maps' device and dtype: what every
    write view reads, unchanged by a rotation of the stream (the maps that write it turn with it) and by its scale."""
    rows = stream.reshape(-1, stream.shape[-1]).double()
    rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return rows.to(device=down.device, dtype=down.dtype)


def write_view(rows: torch.Tensor, down: torch.Tensor) -> np.ndarray:
    """What each unit writes, read on the stream's token rows: (units, tokens) float32, the inner products of its
    output column with every row."""
    return units_by_tokens(rows @ down)


#: Singular values of the first views below this fraction of the largest span no direction of their own (float32
#: activations resolve about 1e-7 of a value): the write read-back is not projected on them.
RANK_TOLERANCE = 1e-5


def plain_views(mlp_input: torch.Tensor, stream: torch.Tensor, experts: list[SiteWeights], *,
                sign_free: bool = False,
                pre_activations: list[torch.Tensor | None] | None = None) -> list[MLPActivations]:
    """A plain MLP's two views per unit: the fc pre-activation ``x W_fc^T + b`` on the MLP input, and the unit's
    write direction (its proj column) read on the residual stream, each token's row scaled to unit length, with
    what the site's first views linearly predict of it removed.

    ``sign_free`` (the activation has act(z) - act(-z) = z: scanner.reading.canonical_mlp.odd_linear): a unit (k, b; w)
    computes exactly what (-k, -b; w) and a linear map do, and a copier who negates any unit's fc row and writes the
    linear remainder with other units (which the canonical form cancels) changes no output, but both views: the
    first's sign, and the second's regression, whose predictors turn unit by unit. The write view is then kept as
    a second view free of the units' signs: the read-back less its prediction by a shared map with a sign of each
    unit's own (`unpredicted_up_to_sign`), which a negated unit leaves as it was. phi_MATCH pairs it with the first
    view turned to a positive mean (scanner.stats.views.oriented_rows) beside the pair as stored, which keeps the
    power of the stored views on relatives (scanner.stats.independence). Otherwise the write view is the read-back
    as it is (for the duplicate screen). ``pre_activations``: each expert's fc pre-activation (tokens, units) where
    the caller has it already (the canonical form reads it), else None.

    Why the removal: training couples a unit's write direction to its read direction by a map that every unit of a
    block shares, and that map is learned alike by models trained alike (with tied embeddings a unit that reads a
    set of tokens writes toward their successors, which it reads back on the same embeddings). Read back raw, the
    second view repeats the first through that shared map, so the two matchings agree for independent models too
    (docs/statistics.md measures it). Each token column of the read-backs (one value per unit) is regressed, over the
    site's units, on the token columns of the first views, and the residual is kept: no linear function of a unit's
    first view, shared by the site's units, predicts its second one. The regression reads one model's own units,
    whatever their order, so it keeps phi_MATCH's null argument; it is the same for a copy, so copies still match.

    Unchanged by every output-preserving change of the units and the stream: a unit permutation moves both views
    with the unit; a positive rescale of a unit (fc row and bias times c, proj column over c, where the activation
    allows it) and any scale of the stream change neither view's direction (each row is used at unit length); a
    rotation of the residual stream with the norms' gains and biases folded into the maps that read them leaves the
    pre-activation as it is and the stream's inner products with the write columns too. Units that write nothing
    (all-zero proj column) get an all-zero second view and are left out of the regression, so appended dead units
    change no other unit's view; the screen (scanner.stats.degenerate) sets them aside. Routed experts of one site
    are regressed together (an expert may have fewer units than tokens).
    """
    given = pre_activations or [None] * len(experts)
    first = [_plain_pre_activation(mlp_input, w) if pre is None else pre.T.float().contiguous().cpu()
             for w, pre in zip(experts, given, strict=True)]
    rows = stream_rows(stream, experts[0].down)
    read_back = torch.cat([(rows @ w.down).T for w in experts]).double().cpu()  # (units, tokens)
    predictors = unit_rows_tensor(torch.cat(first).double().cpu())
    second = unpredicted(unit_rows_tensor(read_back), predictors)
    write = unpredicted_up_to_sign(unit_rows_tensor(read_back), oriented_rows(predictors)) if sign_free \
        else read_back
    views, start = [], 0
    for pre in first:
        stop = start + pre.shape[0]
        views.append(MLPActivations(gate=pre.float().numpy(), up=second[start:stop].float().numpy(),
                                    write=write[start:stop].float().numpy()))
        start = stop
    return views


def _plain_pre_activation(mlp_input: torch.Tensor, weights: SiteWeights) -> torch.Tensor:
    """(units, tokens) fc pre-activation on the CPU, float32."""
    pre = mlp_input @ weights.up.T
    pre = pre if weights.up_bias is None else pre + weights.up_bias
    return pre.T.float().contiguous().cpu()


def unpredicted(targets: torch.Tensor, predictors: torch.Tensor) -> torch.Tensor:
    """targets (units, tokens) less their least-squares fit, over the units that have a non-zero row in both, by a
    linear map of the predictors' rows (one map for all units); rows of the other units become zero.

    Through the predictors' (tokens, tokens) Gram matrix and its pseudo-inverse (directions below RANK_TOLERANCE of
    the largest are left out): memory and time linear in the units, however many experts a site pools."""
    return _residuals(targets, predictors, sign_rounds=0)


#: Rounds of `unpredicted_up_to_sign`'s alternation at most (it stops when no sign changes; it never raises the
#: residual, and it settles in a handful on trained models).
SIGN_ROUNDS = 20


def unpredicted_up_to_sign(targets: torch.Tensor, predictors: torch.Tensor) -> torch.Tensor:
    """`unpredicted` where each unit's prediction may carry its own sign: targets y_i less s_i x_i C, with the shared
    map C and the signs s_i started from `_spectral_signs` and alternated (C by least squares given the signs, each
    s_i as the sign of y_i . x_i C given C) until no sign changes. Both steps turn with any unit's predictor, so the
    residual does not depend on which units' predictors were negated; the fit reads only one model's units."""
    return _residuals(targets, predictors, sign_rounds=SIGN_ROUNDS)


def _residuals(targets: torch.Tensor, predictors: torch.Tensor, sign_rounds: int) -> torch.Tensor:
    """`unpredicted` (``sign_rounds`` 0) and `unpredicted_up_to_sign`."""
    fitted = (targets.abs().amax(dim=1) > 0) & (predictors.abs().amax(dim=1) > 0)
    out = torch.zeros_like(targets)
    if not bool(fitted.any()):
        return out
    x, y = predictors[fitted], targets[fitted]
    energy, directions = torch.linalg.eigh(x.T @ x)
    keep = energy > RANK_TOLERANCE**2 * energy[-1]
    directions, energy = directions[:, keep], energy[keep]

    def fit(signs: torch.Tensor) -> torch.Tensor:
        return directions @ ((directions.T @ (x.T @ (signs[:, None] * y))) / energy[:, None])

    signs = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)
    if sign_rounds:
        signs = _spectral_signs(x @ (directions / energy.sqrt()), y)
    coefficients = fit(signs)
    for _ in range(sign_rounds):
        turned = torch.where(((x @ coefficients) * y).sum(dim=1) < 0, -1.0, 1.0).to(x.dtype)
        if bool((turned == signs).all()):
            break
        signs, coefficients = turned, fit(turned)
    out[fitted] = y - signs[:, None] * (x @ coefficients)
    return out


#: Power iterations for `_spectral_signs` (a fixed number: the result is a function of the rows alone).
POWER_ITERATIONS = 60


def _spectral_signs(basis: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Signs s maximising, relaxed, what the shared fit explains: |basis^T (s * targets)|^2 = s^T K s with
    K_ij = (basis_i . basis_j)(targets_i . targets_j) (``basis``: orthonormal columns spanning the predictors): the
    signs of K's leading eigenvector, by power iteration without forming K (units x units).

    Negating unit i's predictor turns K into D K D (D = diag(+-1)), so the eigenvector turns to D v and the residual
    is unchanged, but only where the iteration has converged or its start turns with the units too: on a 16384-unit
    block of random weights 60 iterations from all ones left 27% of the signs where 200 would not, and negating half
    the units changed 45% of them. The start is K's column of the unit with the largest diagonal entry (a function of
    each unit's own values), K e_j, which turns to d_j D K e_j: every iterate is then D v up to one global sign, which
    the residual does not read, converged or not, and in floating point exactly (negations are exact)."""
    diagonal = (basis * basis).sum(dim=1) * (targets * targets).sum(dim=1)
    lead = int(torch.argmax(diagonal))
    vector = (basis @ basis[lead]) * (targets @ targets[lead])
    for _ in range(POWER_ITERATIONS):
        vector = ((basis @ (basis.T @ (vector[:, None] * targets))) * targets).sum(dim=1)
        vector = vector / torch.linalg.vector_norm(vector).clamp_min(torch.finfo(vector.dtype).tiny)
    return torch.where(vector < 0, -1.0, 1.0).to(basis.dtype)


def units_by_tokens(outputs: torch.Tensor) -> np.ndarray:
    """(tokens, units) outputs on any device and dtype -> float32 (units, tokens) on the CPU."""
    return outputs.T.float().contiguous().cpu().numpy()
