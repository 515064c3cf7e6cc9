"""MLP activations on canonical inputs, from the model's own transformers forward pass.

The inputs to every block's MLP are captured with forward pre-hooks on transformers' modules for the
architecture (no hand-written attention), then each gated MLP's gate and up outputs are computed from
the adapter's canonical weights. Every MoE expert is evaluated on every token: the result is a
deterministic function of the MLP input, equivariant to unit permutations, whatever the router does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.activations import ACT2FN

from scanner.adapters import ArchitectureAdapter
from scanner.architectures.config import transformers_config
from scanner.architectures.shape import GLUWeights
from scanner.architectures.sites import SiteWeights
from scanner.checkpoint import Checkpoint
from scanner.errors import CheckpointError, IncomparableError


@dataclass(frozen=True)
class MLPActivations:
    """One gated MLP's gate (pre-activation) and up outputs on the canonical tokens, shaped (units, tokens).

    float32 when computed; fingerprints hold them in their storage dtype (float16 by default).
    """

    gate: np.ndarray
    up: np.ndarray

    def hidden(self, activation: str, kind: str = "gated") -> np.ndarray:
        """phi_H's matrix: the down projection's input, sigma(Gx) * (Ux) for a gated MLP, sigma(Wx + b) for a plain
        one (whose first view is that pre-activation)."""
        if activation not in ACT2FN:
            raise IncomparableError(f"phi_H needs the MLP's activation; {activation!r} is not one transformers names")
        act = ACT2FN[activation]
        hidden = act(torch.from_numpy(self.gate).float())
        return (hidden if kind == "plain" else hidden * torch.from_numpy(self.up).float()).numpy()


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
            attn_implementation="eager",  # hubtrace's choice, never the checkpoint's (scanner.architectures.config)
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


def glu_activations(mlp_input: torch.Tensor, experts: list[GLUWeights]) -> list[MLPActivations]:
    """Gate and up outputs of each gated MLP of a block (one per expert) on that block's MLP input."""
    return [
        MLPActivations(gate=units_by_tokens(mlp_input @ w.gate.T), up=units_by_tokens(mlp_input @ w.up.T))
        for w in experts
    ]


def site_activations(mlp_input: torch.Tensor, experts: list[SiteWeights],
                     stream: torch.Tensor | None = None) -> list[MLPActivations]:
    """The two views of every hidden unit of one MLP site (one entry per routed expert) on its input (tokens, d),
    shaped (units, tokens).

    Gated: the gate's pre-activation and the up output, as the paper's phi_MATCH reads them. Plain (fc -> act -> proj,
    no gate): `plain_views`, which also reads ``stream``, the residual stream the block writes into (tokens, d).
    """
    if experts[0].gate is None:
        if stream is None:
            raise ValueError("a plain MLP's second view reads the residual stream; none was given")
        return plain_views(mlp_input, stream, experts)
    views = []
    for weights in experts:
        gate, up = mlp_input @ weights.gate.T, mlp_input @ weights.up.T
        gate = gate if weights.gate_bias is None else gate + weights.gate_bias
        up = up if weights.up_bias is None else up + weights.up_bias
        views.append(MLPActivations(gate=units_by_tokens(gate), up=units_by_tokens(up)))
    return views


#: Singular values of the first views below this fraction of the largest span no direction of their own (float32
#: activations resolve about 1e-7 of a value): the write read-back is not projected on them.
RANK_TOLERANCE = 1e-5


def plain_views(mlp_input: torch.Tensor, stream: torch.Tensor, experts: list[SiteWeights]) -> list[MLPActivations]:
    """A plain MLP's two views per unit: the fc pre-activation ``x W_fc^T + b`` on the MLP input, and the unit's
    write direction (its proj column) read on the residual stream, each token's row scaled to unit length, with
    what the site's first views linearly predict of it removed.

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
    first = [_plain_pre_activation(mlp_input, w) for w in experts]
    rows = stream.reshape(-1, stream.shape[-1]).double()
    rows = rows / torch.linalg.vector_norm(rows, dim=1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    rows = rows.to(device=experts[0].down.device, dtype=experts[0].down.dtype)
    read_back = torch.cat([(rows @ w.down).T for w in experts]).double().cpu()  # (units, tokens)
    predictors = torch.cat(first).double().cpu()
    second = _unpredicted(_unit_rows(read_back), _unit_rows(predictors))
    views, start = [], 0
    for pre in first:
        stop = start + pre.shape[0]
        views.append(MLPActivations(gate=pre.float().numpy(), up=second[start:stop].float().numpy()))
        start = stop
    return views


def _plain_pre_activation(mlp_input: torch.Tensor, weights: SiteWeights) -> torch.Tensor:
    """(units, tokens) fc pre-activation on the CPU, float32."""
    pre = mlp_input @ weights.up.T
    pre = pre if weights.up_bias is None else pre + weights.up_bias
    return pre.T.float().contiguous().cpu()


def _unit_rows(values: torch.Tensor) -> torch.Tensor:
    """float64 rows scaled to unit length (all-zero rows stay zero): no unit's scale reaches the regression."""
    peak = values.abs().amax(dim=1, keepdim=True)
    scaled = values / torch.where(peak > 0, peak, 1.0)  # no square of a 1e30-scaled unit overflows
    norms = torch.linalg.vector_norm(scaled, dim=1, keepdim=True)
    return scaled / torch.where(norms > 0, norms, 1.0)


def _unpredicted(targets: torch.Tensor, predictors: torch.Tensor) -> torch.Tensor:
    """targets (units, tokens) less their least-squares fit, over the units that have a non-zero row in both, by a
    linear map of the predictors' rows (one map for all units); rows of the other units become zero.

    Through the predictors' (tokens, tokens) Gram matrix and its pseudo-inverse (directions below RANK_TOLERANCE of
    the largest are left out): memory and time linear in the units, however many experts a site pools."""
    fitted = (targets.abs().amax(dim=1) > 0) & (predictors.abs().amax(dim=1) > 0)
    out = torch.zeros_like(targets)
    if not bool(fitted.any()):
        return out
    x, y = predictors[fitted], targets[fitted]
    energy, directions = torch.linalg.eigh(x.T @ x)
    keep = energy > RANK_TOLERANCE**2 * energy[-1]
    directions = directions[:, keep]
    coefficients = directions @ ((directions.T @ (x.T @ y)) / energy[keep, None])
    out[fitted] = y - x @ coefficients
    return out


def units_by_tokens(outputs: torch.Tensor) -> np.ndarray:
    """(tokens, units) outputs on any device and dtype -> float32 (units, tokens) on the CPU."""
    return outputs.T.float().contiguous().cpu().numpy()
