"""Replayed activations: every block of B run on the residual stream that entered each block of A.

A fingerprint compares two models' blocks on their own residual streams. Once blocks are removed (a depth
prune) the stream entering a kept block drifts further from the parent's with every missing block, and the
activation tests lose the deeper blocks. Replaying removes the drift: B's block j is given exactly the
hidden states that entered A's block i (mapped into B's residual basis), so a block of B that derives from
block i of A computes nearly what A's block i computed, however many blocks came before it in either model.

The residual basis: an output-preserving disguise re-expresses B's residual stream as x Q (a permutation
and rotation, paper App. D), applied to the embeddings too. Q is estimated once by orthogonal Procrustes
between the two input-embedding tables (rows of the same ids; up to ``BASIS_ROWS`` evenly spaced ids of the
shared range): argmin ||E_A Q - E_B|| over (semi-)orthogonal Q, from one SVD. For an undisguised derivative Q is
close to the identity.

Why phi_MATCH p-values on replayed activations stay valid: B's replayed activations for the pair (i, j)
depend on A only through the stream entering A's block i and A's embedding table. Neither depends on the
order of the hidden units of A's block i (an MLP's output is a sum over its units, and block i's own MLP
runs after that stream), so permuting those units permutes A's activations and leaves B's untouched: the
unit exchangeability that phi_MATCH's null distribution rests on holds exactly as for fingerprints.

I/O and orchestration only; the statistics are in scanner.stats and scanner.pairs.localize. Uses the streaming
module's meta-device machinery, so every block runs transformers' own module for the architecture.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scanner.fingerprints.fingerprint import model_token_range
from scanner.fingerprints.inputs import InputSet, InputSpec, canonical_inputs
from scanner.reading.activations import MLPActivations, check_sequence_length, glu_activations, weighed
from scanner.reading.alike_experts import joined_routed, observed_routing
from scanner.reading.architectures.families import ArchitectureAdapter, adapter_for
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.checkpoint import Checkpoint, open_checkpoint
from scanner.reading.streaming import _block_calls, _keep_routing, _load_block, _meta_model, default_dtype

BASIS_ROWS = 4096
"""Embedding rows (evenly spaced ids of the shared range) the residual-basis Procrustes fit reads."""


@dataclass(frozen=True)
class Replay:
    """A's activations on its own stream, and B's block j replayed on the stream entering A's block i.

    ``a[i]`` and ``b[i][j]`` are per-expert activations (units, tokens), float32.
    """

    a: list[list[MLPActivations]]
    b: list[list[list[MLPActivations]]]
    routed_a: list[int]  # routed experts of each block (0: dense)
    routed_b: list[int]
    up_sign_free: bool  # gated MLPs: the up view's sign carries no identity
    input_set: InputSet


class _Model:
    """One checkpoint on the meta device, with the per-block call arguments for the canonical ids."""

    def __init__(self, path: str | Path, ids: np.ndarray, device: str, dtype: torch.dtype) -> None:
        self.checkpoint: Checkpoint = open_checkpoint(path)
        self.adapter: ArchitectureAdapter = adapter_for(self.checkpoint)
        self.lm = _meta_model(self.checkpoint)
        check_sequence_length(self.lm, ids)
        self.layers = self.lm.get_submodule(self.adapter.mlp_module_path(0).removesuffix(".0.mlp"))
        base = self.lm.get_submodule(self.adapter.mlp_module_path(0).removesuffix(".layers.0.mlp"))
        self.device, self.dtype = device, dtype
        with torch.inference_mode():
            self.entry, self.calls = _block_calls(
                self.lm, base, self.layers, self.adapter.embedding_rows, ids, device, dtype
            )

    def load(self, layer: int) -> list[GLUWeights]:
        experts = self.adapter.mlp(layer)
        _load_block(self.layers[layer], self.checkpoint, self.adapter, layer, experts, self.device, self.dtype)
        return experts

    def unload(self, layer: int) -> None:
        self.layers[layer].to_empty(device="meta")
        self.checkpoint.close()

    @torch.inference_mode()
    def run(
        self, layer: int, hidden: torch.Tensor, experts: list[GLUWeights]
    ) -> tuple[torch.Tensor, list[MLPActivations]]:
        """The loaded block on ``hidden``: its output stream, and its MLPs' gate/up activations."""
        captured: list[torch.Tensor] = []
        mlp = self.lm.get_submodule(self.adapter.mlp_module_path(layer))
        handles = [mlp.register_forward_pre_hook(
            lambda _m, args, kwargs: captured.append(args[0] if args else kwargs["hidden_states"]), with_kwargs=True
        )]
        routed, routing = self.adapter.routed_experts(layer), {}
        if routed and isinstance(getattr(mlp, "experts", None), torch.nn.Module):
            handles.append(mlp.experts.register_forward_pre_hook(_keep_routing(routing, "experts"), with_kwargs=True))
        try:
            call = self.calls[layer]
            out = self.layers[layer](hidden, *call.args, **call.kwargs)
        finally:
            for handle in handles:
                handle.remove()
        mlp_input = captured[0].reshape(-1, captured[0].shape[-1])
        experts, routing_weights = joined_routed(
            experts, routed, observed_routing(*routing.get("experts", (None, None)), routed), mlp_input,
            self.adapter.shape.hidden_act)
        weights = [
            GLUWeights(*(w.to(device=self.device, dtype=self.dtype) for w in (e.gate, e.up, e.down))) for e in experts
        ]
        return (out[0] if isinstance(out, tuple) else out), weighed(glu_activations(
            mlp_input, weights, activation=self.adapter.shape.hidden_act, stream=hidden), routing_weights)


def residual_basis(
    a: ArchitectureAdapter, b: ArchitectureAdapter, id_range: int, rows: int = BASIS_ROWS
) -> torch.Tensor:
    """(d_A, d_B) (semi-)orthogonal Q with E_A Q closest to E_B on the same ids (orthogonal Procrustes)."""
    ids = np.unique(np.linspace(0, id_range - 1, min(rows, id_range)).round().astype(np.int64)).tolist()
    e_a, e_b = a.embedding_rows(ids).double(), b.embedding_rows(ids).double()
    u, _, vh = torch.linalg.svd(e_a.T @ e_b, full_matrices=False)
    return u @ vh


def replay(path_a: str | Path, path_b: str | Path, *, inputs: InputSpec = InputSpec(), device: str = "cpu") -> Replay:
    """A's activations, and every block of B replayed on the stream entering every block of A (L_A * L_B block
    runs of B; each of B's blocks is read once). Both models read the canonical ids of their shared id range."""
    dtype = default_dtype(device)
    checkpoints = [open_checkpoint(p) for p in (path_a, path_b)]
    input_set = canonical_inputs(min(model_token_range(c, adapter_for(c)) for c in checkpoints), inputs)
    a = _Model(path_a, input_set.ids, device, dtype)
    b = _Model(path_b, input_set.ids, device, dtype)
    basis = residual_basis(a.adapter, b.adapter, input_set.token_range).to(device=device, dtype=dtype)

    streams, acts_a = [], []
    hidden = a.entry
    for layer in range(len(a.layers)):
        streams.append(hidden @ basis)
        experts = a.load(layer)
        hidden, activations = a.run(layer, hidden, experts)
        a.unload(layer)
        acts_a.append(activations)
    acts_b: list[list[list[MLPActivations]]] = [[] for _ in streams]
    for layer in range(len(b.layers)):
        experts = b.load(layer)
        for i, stream in enumerate(streams):
            acts_b[i].append(b.run(layer, stream, experts)[1])
        b.unload(layer)
    return Replay(
        a=acts_a,
        b=acts_b,
        routed_a=[a.adapter.routed_experts(layer) for layer in range(len(a.layers))],
        routed_b=[b.adapter.routed_experts(layer) for layer in range(len(b.layers))],
        up_sign_free=getattr(a.adapter, "mlp_kind", "gated") == "gated",
        input_set=input_set,
    )
