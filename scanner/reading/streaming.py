"""MLP activations of a checkpoint read one block at a time: peak memory is one block, not the model.

The model is built by transformers on the meta device (no memory, no remote code), so every module is
transformers' own for the architecture. Only the small pieces that run before the first block are made
real: the embedding rows the canonical ids use (the ids are renumbered into that small table, so Gemma's
scaled embedding still applies its own scale) and whatever the model initialises itself (rotary
frequencies), through the model's own `_init_weights`.

Two ways to run the blocks, one per kind of adapter:

* The Llama-style rows of `scanner.reading.architectures.families`: one forward pass of the base model with every
  decoder layer replaced by a recorder collects, for each block, the exact arguments the model's forward would call it
  with (causal or sliding-window mask, position embeddings, position ids) and the hidden states entering block 0.
  Then each block in turn gets its weights from safetensors (stored names, or the adapter's per-expert tensors
  fused the way transformers 5 holds experts), runs on all canonical sequences at once with a forward pre-hook
  capturing its MLP input, and goes back to the meta device before the next block is read (`scanner.pairs.replay`
  replays blocks the same way).
* Every other architecture (`scanner.reading.architectures`): the base model's own forward pass runs once, and each
  decoder layer is loaded when the forward calls it and freed when it returns, so whatever the model passes
  between its layers is its own code's business; the pass runs on a worker thread in lockstep with the consumer
  (`scanner.reading.lockstep`), one block's weights alive at a time.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedModel

from scanner.errors import CheckpointError, HubtraceError, one_line
from scanner.reading.activations import (
    MLPActivations,
    check_sequence_length,
    site_activations,
    weighed,
)
from scanner.reading.alike_experts import (
    Routing,
    joined_routed,
    observed_routing,
    routing_from_scores,
    routing_from_slots,
)
from scanner.reading.architectures.adapter import ModuleTreeAdapter
from scanner.reading.architectures.config import transformers_config
from scanner.reading.architectures.families import ArchitectureAdapter
from scanner.reading.architectures.module_tree import build_meta_model, init_owners
from scanner.reading.architectures.names import ROUTER_NAMES
from scanner.reading.architectures.norms import mean_free, norms_remove_mean
from scanner.reading.architectures.shape import GLUWeights
from scanner.reading.architectures.sites import MLPSite, SiteWeights, site_weights
from scanner.reading.checkpoint import Checkpoint
from scanner.reading.expert_stream import StreamedExperts
from scanner.reading.lockstep import lockstep


@dataclass(frozen=True)
class StreamedBlock:
    """One block's MLPs (float32, CPU; as `adapter.mlp` returns them) and their activations."""

    layer: int
    experts: list[GLUWeights] | list[SiteWeights]
    activations: list[MLPActivations]
    routed: int = 0  # routed experts among them, those the router weighs in proportion read as one (alike_experts)
    routing_seen: bool | None = None  # whether the block's routing was seen (else its experts are read alone)
    stored_experts: int = 0  # routed experts as stored


def stream_mlp_activations(
    checkpoint: Checkpoint,
    adapter: ArchitectureAdapter,
    ids: np.ndarray,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
) -> Iterator[tuple[int, list[MLPActivations]]]:
    """(layer, per-expert gate/up activations) for every block in order, on token ids (n_sequences, seq_len).

    Each block's weights are read once and freed before the next block is read. dtype defaults to float32
    on the CPU and bfloat16 on CUDA; activations always come back as float32 numpy arrays (units, tokens).
    """
    for block in stream_blocks(checkpoint, adapter, ids, device=device, dtype=dtype):
        layer, activations = block.layer, block.activations
        del block  # its MLP weights must be gone before the next block is read
        yield layer, activations


def stream_blocks(
    checkpoint: Checkpoint,
    adapter: ArchitectureAdapter,
    ids: np.ndarray,
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
) -> Iterator[StreamedBlock]:
    """`stream_mlp_activations` with each block's MLP weights alongside, for summaries that need them.

    Inference mode is entered per block, never across a yield: torch's generator decorator would hold the
    yielded block while computing the next, keeping two blocks' MLP weights alive.
    """
    dtype = dtype or default_dtype(device)
    if isinstance(adapter, ModuleTreeAdapter):
        yield from _stream_sites(adapter, ids, device, dtype)
        return
    lm = _meta_model(checkpoint)
    check_sequence_length(lm, ids)
    layers = lm.get_submodule(adapter.mlp_module_path(0).removesuffix(".0.mlp"))
    base = lm.get_submodule(adapter.mlp_module_path(0).removesuffix(".layers.0.mlp"))
    with torch.inference_mode():
        hidden, calls = _block_calls(lm, base, layers, adapter.embedding_rows, ids, device, dtype)
    for layer, module in enumerate(layers):
        with torch.inference_mode():
            experts = adapter.mlp(layer)
            checkpoint.close()  # the MLP is float32 now: its stored pages need not stay mapped (70B: 1.4 GB of bf16)
            _load_block(module, checkpoint, adapter, layer, experts, device, dtype)
            checkpoint.close()
            mlp = lm.get_submodule(adapter.mlp_module_path(layer))
            captured: list[torch.Tensor] = []
            outputs: dict[str, torch.Tensor] = {}
            handles = [mlp.register_forward_pre_hook(
                lambda _m, args, kwargs, sink=captured: sink.append(args[0] if args else kwargs["hidden_states"]),
                with_kwargs=True,
            )]
            routed = adapter.routed_experts(layer)
            routing: dict[str, tuple[Any, Any]] = {}
            if routed and isinstance(getattr(mlp, "experts", None), nn.Module):
                handles.append(mlp.experts.register_forward_pre_hook(_keep_routing(routing, "experts"),
                                                                      with_kwargs=True))
            projections = _dense_projections(mlp) if len(experts) == 1 else {}
            handles += [
                projection.register_forward_hook(lambda _m, _a, out, part=part, sink=outputs: sink.update({part: out}))
                for part, projection in projections.items()
            ]
            # the residual stream the block writes into, which the write view reads (less its all-ones direction
            # where the block's norms do not see it: scanner.reading.architectures.norms)
            stream = mean_free(hidden) if norms_remove_mean(module, hidden.shape[-1]) else hidden
            try:
                out = module(hidden, *calls[layer].args, **calls[layer].kwargs)
            finally:
                for handle in handles:
                    handle.remove()
                module.to_empty(device="meta")
                checkpoint.close()  # drop the block's memory maps too
            hidden = out[0] if isinstance(out, tuple) else out
            # the gate and up outputs the block computed anyway, where it has them: no second product
            computed = tuple(outputs[p].reshape(-1, outputs[p].shape[-1]) for p in ("gate", "up")) \
                if projections and outputs.keys() == projections.keys() else None
            mlp_input = captured[0].reshape(-1, captured[0].shape[-1])
            seen = observed_routing(*routing.get("experts", (None, None)), routed)
            routing_seen = (seen is not None or routed < 2) if routed else None  # one expert: nothing to group
            experts, routing_weights = joined_routed(experts, routed, seen, mlp_input, adapter.shape.hidden_act)
            routed = len(routing_weights)
            on_device = [SiteWeights(*(w.to(device=device, dtype=dtype) for w in (e.up, e.down, e.gate)))
                         for e in experts]
            activations = weighed(site_activations(mlp_input, on_device, activation=adapter.shape.hidden_act,
                                                   stream=stream, computed=computed), routing_weights)
            del captured, outputs, out, mlp_input, on_device, computed, stream
        yield StreamedBlock(layer, experts, activations, routed, routing_seen, adapter.routed_experts(layer))
        del experts  # else this block's MLP weights stay alive while the next block is read


def _stream_sites(
    adapter: ModuleTreeAdapter, ids: np.ndarray, device: str, dtype: torch.dtype
) -> Iterator[StreamedBlock]:
    """`stream_blocks` for an architecture read off its module tree, run by the model's own forward pass.

    The base model's forward calls its layers as it always does (whatever it passes between them: tuples, several
    hidden streams, a shared block, layers run more than once); each call loads that layer's weights, runs it, and
    frees them again, and the first call of a layer that holds MLP sites yields one block with the two views of
    every unit of every site. The forward runs on a worker thread in lockstep with the consumer, so one block's
    weights are alive at a time, as in `stream_blocks`."""
    check_sequence_length(adapter.tree.lm, ids)

    def produce(emit: Callable[[StreamedBlock], None]) -> None:
        with torch.inference_mode():
            try:
                _forward_layer_by_layer(adapter, ids, device, dtype, emit)
            except HubtraceError:
                raise
            except Exception as exc:  # transformers' forward on a checkpoint it builds but cannot run: one line
                raise CheckpointError(f"{adapter.checkpoint.path}: transformers could not run model_type "
                                      f"{adapter.shape.model_type!r} block by block: {one_line(exc)}") from exc

    yield from lockstep(produce, name="hubtrace-stream")


class _AllLayersRan(Exception):
    """Raised after every decoder layer has run once: the rest of the forward (final norm, head) is not needed."""


def _forward_layer_by_layer(
    adapter: ModuleTreeAdapter, ids: np.ndarray, device: str, dtype: torch.dtype,
    emit: Callable[[StreamedBlock], None],
) -> None:
    """One forward pass of the base model with each decoder layer loaded just for its own call (see _stream_sites)."""
    tree = adapter.tree
    stack = tree.stack
    in_layers = {id(m) for m in stack.layers.modules()}

    def load_globals() -> None:
        tree.load(adapter.global_tensor_names(), device, dtype)
        for module in stack.base.modules():
            if id(module) not in in_layers:
                for name, param in module.named_parameters(recurse=False):
                    setattr(module, name, nn.Parameter(param.to(device=device, dtype=dtype), requires_grad=False))

    table, local_ids = renumbered(ids, stack.base.get_input_embeddings().padding_idx)
    tree.materialize_buffers(device, dtype)
    _materialize_globals(tree.lm, stack.base, stack.layers, adapter.embedding_rows(table), device, dtype,
                         load_globals)
    ran: set[int] = set()
    blocks = {layer: block for block, layer in enumerate(adapter.block_layers)}
    activation = adapter.shape.hidden_act

    def streamed(layer: int, forward: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            sites = tree.sites[layer] if layer not in ran else []
            if sites and len(ran & set(blocks)) != blocks[layer]:
                raise CheckpointError(f"{tree.lm.config.model_type}: its forward runs layer {layer} before the "
                                      "layers that hold the blocks before it")
            by_expert = {site: found for site in sites
                         if (found := StreamedExperts.find(tree, layer, site)) is not None}
            module = tree.load_layer(layer, device, dtype,
                                     left_out=[n for experts in by_expert.values() for n in experts.stored_names],
                                     left_out_modules=[site.path for site in by_expert])
            captured: dict[str, torch.Tensor] = {}
            handles = [module.get_submodule(path).register_forward_pre_hook(_first_input(captured, path),
                                                                            with_kwargs=True)
                       for path in {path for site in sites for path in site.input_modules}]
            routing: dict[str, tuple[Any, Any]] = {}
            holders = {path for site in sites if site.experts and site not in by_expert for path in _holders(site)}
            handles += [module.get_submodule(path).register_forward_pre_hook(_keep_routing(routing, path),
                                                                             with_kwargs=True) for path in holders]
            router_outputs: dict[str, Any] = {}
            routers = {path for site in sites if site.experts and site not in by_expert
                       for path in _router_paths(module, site)}
            handles += [module.get_submodule(path).register_forward_hook(_first_output(router_outputs, path))
                        for path in routers]
            stream = _layer_input(args, kwargs) if sites else None
            if stream is not None and norms_remove_mean(module, stream.shape[-1]):
                stream = mean_free(stream)
            for site, experts_of_site in by_expert.items():
                width = getattr(module.get_submodule(site.path), site.up).shape[-1]  # d (the param is on meta)
                site_input = functools.partial(_site_input, captured, site, width)
                module.get_submodule(site.path).forward = experts_of_site.forward(
                    module.get_submodule(site.path), site_input, _site_stream(stream, width), activation,
                    device, dtype)
            try:
                out = forward(*args, **kwargs)
                activations, experts, weights, routed, routing_seen = [], [], [], 0, None
                for site in sites:
                    if site in by_expert:
                        if by_expert[site].groups is None:
                            raise CheckpointError(f"{tree.lm.config.model_type}: the experts at {site.path} of layer "
                                                  f"{layer} were not called by the block's forward")
                        activations += by_expert[site].activations
                        experts += by_expert[site].lazy()
                        routed += len(by_expert[site].groups)
                        routing_seen = bool(by_expert[site].routing_seen) and routing_seen is not False
                        continue
                    weights = site_weights(module, site)
                    if site.experts:
                        seen = _seen_routing(module, site, routing, router_outputs)
                        site_input = _site_input(captured, site, weights[0].up.shape[1])
                        weights, alike = joined_routed(weights, site.experts, seen, site_input, activation)
                        routed += len(alike)
                        routing_seen = (seen is not None or site.experts < 2) and routing_seen is not False
                    activations += weighed(_site_views(captured, site, weights, stream, activation),
                                           alike if site.experts else [])
                    experts += [_on_cpu(w) for w in weights]
            finally:
                for handle in handles:
                    handle.remove()
                for site in by_expert:
                    del module.get_submodule(site.path).forward  # back to the class's forward
                tree.release_layer(layer)
            del captured, stream, weights
            ran.add(layer)
            if sites:
                emit(StreamedBlock(blocks[layer], experts, activations, routed, routing_seen,
                                   sum(site.experts for site in sites)))
            del experts, activations
            if len(ran) == len(stack.layers):
                raise _AllLayersRan
            return out

        return run

    for layer, module in enumerate(stack.layers):
        module.forward = streamed(layer, module.forward)
    local = torch.from_numpy(local_ids.reshape(ids.shape)).to(device)
    embedding = stack.base.get_input_embeddings().register_forward_pre_hook(_embeds_only(local, tree.lm))
    # a decoder runs without a key/value cache; an encoder's forward may have no such argument to pass down
    no_cache = {"use_cache": False} if adapter.attention == "causal" or _takes(stack.base, "use_cache") else {}
    try:
        stack.base(input_ids=local, **no_cache)
    except _AllLayersRan:
        pass
    finally:
        embedding.remove()
        for module in stack.layers:
            del module.forward  # back to the class's forward
    if len(ran) != len(stack.layers):
        raise CheckpointError(f"{tree.lm.config.model_type}: the model ran {len(ran)} of its {len(stack.layers)} "
                              "layers")


def renumbered(ids: np.ndarray, keep: int | None = None) -> tuple[list[int], np.ndarray]:
    """The token ids as indices into a small embedding table of just the rows they use: (the table's token ids,
    the ids renumbered, flat). ``keep`` (the embedding's padding id) keeps its own number and no other id gets it:
    RoBERTa's and XGLM's forwards count positions from the ids, skipping the padding id, so a renumbered table must
    not turn an ordinary token into padding (nor padding into an ordinary token)."""
    unique = np.unique(ids)
    if keep is None or keep < 0:
        return unique.tolist(), np.searchsorted(unique, ids.reshape(-1))
    others = [int(u) for u in unique if u != keep]
    table = others[:keep] + [keep] * (keep + 1 - min(keep, len(others))) + others[keep:]
    index = {token: i for i, token in enumerate(table) if i != keep or token == keep}
    index[keep] = keep
    return table, np.array([index[int(t)] for t in ids.reshape(-1)], dtype=np.int64)


def _takes(module: nn.Module, argument: str) -> bool:
    """Whether the module's forward names this argument (not merely accepts **kwargs it may pass further down)."""
    return argument in inspect.signature(module.forward).parameters


def _embeds_only(ids: torch.Tensor, lm: PreTrainedModel) -> Callable[..., None]:
    """A pre-hook that refuses a model whose forward looks up other ids than it was given (CPM-Ant prepends prompt
    ids): the embedding holds only the rows of the given ids, renumbered, so any other lookup would read wrong rows.
    The same ids in another layout (XLNet embeds them sequence-first) are the same rows."""
    given = ids.flatten().sort().values

    def hook(_module: nn.Module, args: tuple[Any, ...]) -> None:
        looked_up = args[0] if args else None
        if not (isinstance(looked_up, torch.Tensor) and looked_up.numel() == given.numel()
                and torch.equal(looked_up.flatten().sort().values, given)):
            raise CheckpointError(f"{lm.config.model_type}: its forward embeds other token ids than its input ids, "
                                  "which a block-by-block fingerprint with a partial embedding table cannot follow")

    return hook


def _site_input(captured: dict[str, torch.Tensor], site: MLPSite, width: int) -> torch.Tensor:
    """A site's MLP input as (tokens, width): the first of its input modules that was called with that width."""
    for path in site.input_modules:
        tensor = captured.get(path)
        if tensor is not None and tensor.shape[-1] == width:
            return tensor.reshape(-1, width)
    raise CheckpointError(f"the MLP at {site.path or 'the layer'} was not called with inputs of its width {width}")


def _layer_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """A copy of the residual stream a decoder layer is called with (its hidden states), which the write views read
    (scanner.reading.activations.write_view) and a plain MLP's second view; a copy, since a layer may add to it in
    place."""
    hidden = args[0] if args else kwargs.get("hidden_states")
    return hidden.detach().clone() if isinstance(hidden, torch.Tensor) else None


def _site_views(captured: dict[str, torch.Tensor], site: MLPSite, weights: list[SiteWeights],
                stream: torch.Tensor | None, activation: str) -> list[MLPActivations]:
    """The views of one site's units (scanner.reading.activations.site_activations), its input taken from what the hooks
    caught, and the residual stream as rows of the width its MLP writes into (a plain site's second view needs it;
    every site's write view reads it)."""
    mlp_input = _site_input(captured, site, weights[0].up.shape[1])
    width = weights[0].down.shape[0]
    rows = _site_stream(stream, width)()
    if rows is not None and rows.shape[0] != mlp_input.shape[0]:
        rows = None
    if rows is None and site.kind == "plain":
        shape = None if stream is None else tuple(stream.shape)
        raise CheckpointError(f"the decoder layer holding the MLP at {site.path or 'the layer'} was called with hidden "
                              f"states of shape {shape}, not one row of width {width} (the residual stream its MLP "
                              "writes into) per token of the MLP's input")
    return site_activations(mlp_input, weights, activation=activation, stream=rows)


def _site_stream(stream: torch.Tensor | None, width: int) -> Callable[[], torch.Tensor | None]:
    """The residual stream a site writes into, as (tokens, width) rows, or None where the layer was called with
    something else (a hybrid's layer may pass its MLP another stream): asked for when the site's views are made."""

    def rows() -> torch.Tensor | None:
        if stream is None or stream.shape[-1] != width:
            return None
        return stream.reshape(-1, width)

    return rows


def _keep_routing(sink: dict[str, tuple[Any, Any]], key: str) -> Callable[..., None]:
    """A forward pre-hook on an experts module that keeps the routing of its first call: its second and third
    arguments, the chosen experts and their weights per token as transformers 5 passes them
    (scanner.reading.alike_experts.observed_routing reads them, or finds they are not that)."""

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if key not in sink:
            index = args[1] if len(args) > 1 else kwargs.get("top_k_index", kwargs.get("router_indices"))
            weights = args[2] if len(args) > 2 else kwargs.get("top_k_weights", kwargs.get("routing_weights"))
            sink[key] = (index, weights)

    return hook


def _holders(site: MLPSite) -> list[str]:
    """The routed-experts site's module and the modules holding it inside the layer, nearest first: where the routing
    may be handed on (scanner.reading.alike_experts)."""
    parts = site.path.split(".") if site.path else []
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _router_paths(layer: nn.Module, site: MLPSite) -> list[str]:
    """Paths of the modules named as routers are (`gate`, `router`) inside the site's module or beside it, nearest
    first."""
    return [f"{holder}.{name}" if holder else name for holder in [*_holders(site), ""]
            for name, _ in layer.get_submodule(holder).named_children() if name in ROUTER_NAMES]


def _seen_routing(layer: nn.Module, site: MLPSite, arguments: dict[str, tuple[Any, Any]],
                  outputs: dict[str, Any]) -> Routing | None:
    """The routing the block handed on for a site (scanner.reading.alike_experts): from the arguments of its module
    or a holder, nearest first, else from a router's output; None where none was seen."""
    for holder in _holders(site):
        routing = observed_routing(*arguments.get(holder, (None, None)), site.experts)
        if routing is not None:
            return routing
    for path in _router_paths(layer, site):
        output = outputs.get(path)
        routing = routing_from_slots(output, site.experts) or routing_from_scores(
            output, site.experts, getattr(layer.get_submodule(path), "top_k", None))
        if routing is not None:
            return routing
    return None


def _first_output(sink: dict[str, Any], key: str) -> Callable[..., None]:
    """A forward hook that keeps what a module returned the first time it was called."""

    def hook(_module: nn.Module, _args: tuple[Any, ...], output: Any) -> None:
        sink.setdefault(key, output)

    return hook


def _first_input(sink: dict[str, torch.Tensor], key: str) -> Callable[..., None]:
    """A forward pre-hook that keeps the first input a module is called with (a site's MLP input)."""

    def hook(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if key not in sink:
            sink[key] = args[0] if args else next(iter(kwargs.values()))

    return hook


def _on_cpu(weights: SiteWeights) -> SiteWeights:
    """A copy of one MLP's weights as float32 on the CPU (what the fingerprint's summaries read)."""
    return SiteWeights(**{f.name: None if (t := getattr(weights, f.name)) is None else t.float().cpu()
                          for f in fields(SiteWeights)})


def _dense_projections(mlp: nn.Module) -> dict[str, nn.Module]:
    """A dense MLP's own gate and up layers when it has them separately (most families; not Phi-3's fused
    gate_up_proj, nor experts): their outputs are the activations, caught as the block computes them."""
    gate, up = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
    return {"gate": gate, "up": up} if isinstance(gate, nn.Linear) and isinstance(up, nn.Linear) else {}


def default_dtype(device: str) -> torch.dtype:
    """float32 on the CPU (exact comparisons); bfloat16 on CUDA where supported, else float16."""
    if not device.startswith("cuda"):
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _meta_model(checkpoint: Checkpoint) -> PreTrainedModel:
    """The architecture's transformers model with every tensor on the meta device (built-in classes only).

    Built from the checkpoint's config (what a GGUF file's metadata or a dequantized checkpoint says), not from
    whatever config.json lies next to the weights.
    """
    return build_meta_model(checkpoint, transformers_config(checkpoint))


class _Recorded(Exception):
    """Raised by the last recorder: the base model's forward has handed out every block's arguments."""


class BlockCall(NamedTuple):
    """The arguments after the hidden states that the base model's forward gives one block."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def _block_calls(
    lm: PreTrainedModel,
    base: nn.Module,
    layers: nn.ModuleList,
    embedding_rows: Callable[[list[int]], torch.Tensor],
    ids: np.ndarray,
    device: str,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, list[BlockCall]]:
    """Hidden states entering block 0 and the arguments the base model's forward gives each block (what runs
    before block 0 as the model initialises it: rotary frequencies)."""
    unique, local_ids = np.unique(ids, return_inverse=True)
    _materialize_globals(lm, base, layers, embedding_rows(unique.tolist()), device, dtype)
    entry: list[torch.Tensor] = []
    calls: list[BlockCall] = []

    def recorder(layer: int):
        def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            if not entry:
                entry.append(hidden_states)
            calls.append(BlockCall(args, kwargs))
            if layer == len(layers) - 1:
                raise _Recorded
            return hidden_states

        return forward

    for layer, module in enumerate(layers):
        module.forward = recorder(layer)
    try:
        base(input_ids=torch.from_numpy(local_ids.reshape(ids.shape)).to(device), use_cache=False)
    except _Recorded:
        pass
    finally:
        for module in layers:
            del module.forward  # back to the class's forward
    if len(calls) != len(layers):
        raise CheckpointError(f"{lm.config.model_type}: the model ran {len(calls)} of its {len(layers)} blocks")
    return entry[0], calls


def _materialize_globals(
    lm: PreTrainedModel, base: nn.Module, layers: nn.ModuleList, rows: torch.Tensor, device: str, dtype: torch.dtype,
    load_globals: Callable[[], None] | None = None,
) -> None:
    """Make real what runs before block 0: an embedding table of just `rows`, and the model's own buffers.

    Buffers (rotary frequencies, Gemma 3's embedding scale) are filled by the model's `_init_weights`, as
    `from_pretrained` does for tensors a checkpoint does not store.
    """
    in_layers = {id(m) for m in layers.modules()}
    owners = init_owners(lm)
    embed = base.get_input_embeddings()
    embed.weight = nn.Parameter(torch.empty(rows.shape, device=device, dtype=dtype), requires_grad=False)
    embed.padding_idx = None  # ids are renumbered; padding_idx only matters for gradients anyway
    for module in base.modules():
        if id(module) in in_layers or module is layers:
            continue
        module.to_empty(device=device, recurse=False)
        owners[id(module)]._init_weights(module)
        for name, param in module.named_parameters(recurse=False):
            if param.is_floating_point():
                setattr(module, name, nn.Parameter(param.to(dtype), requires_grad=False))
    if load_globals is not None:
        load_globals()
    embed.weight.copy_(rows.to(device=device, dtype=dtype))


def _load_block(
    module: nn.Module,
    checkpoint: Checkpoint,
    adapter: ArchitectureAdapter,
    layer: int,
    experts: list[GLUWeights],
    device: str,
    dtype: torch.dtype,
) -> None:
    """Give a meta-device decoder layer its real weights: stored tensors by name, fused experts from `experts`, and a
    dense MLP's maps as `experts` holds them already (read once, held once: a 70B block's MLP is 2.8 GB of float32)."""
    prefix = adapter.block_prefix(layer)
    names = adapter.stored_names(layer) if len(experts) == 1 else {}
    held = {names[role]: getattr(experts[0], role) for role in ("gate", "up", "down") if role in names}
    state: dict[str, torch.Tensor] = {}
    for key in module.state_dict():
        stored = held.get(prefix + key)
        if stored is not None and tuple(stored.shape) == tuple(checkpoint.shape(prefix + key)):
            state[key] = stored
        elif checkpoint.has(prefix + key):
            state[key] = checkpoint.get(prefix + key)
        else:
            state[key] = _fused_expert_tensor(key, adapter, layer, experts)
    module.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)


def _fused_expert_tensor(key: str, adapter: ArchitectureAdapter, layer: int, experts: list[GLUWeights]) -> torch.Tensor:
    """transformers 5 holds routed experts fused (experts.gate_up_proj (E, 2h, d), experts.down_proj (E, d, h))
    and Mixtral's router as mlp.gate; Hub files store them per expert (block_sparse_moe.*)."""
    routed = experts[: adapter.shape.n_experts]
    if key.endswith("experts.gate_up_proj"):
        return torch.stack([torch.cat([e.gate, e.up]) for e in routed])
    if key.endswith("experts.down_proj"):
        return torch.stack([e.down for e in routed])
    names = adapter.stored_names(layer)
    if key.endswith("mlp.gate.weight") and "router" in names:
        return adapter.checkpoint.get(names["router"])
    raise CheckpointError(f"{adapter.checkpoint.path}: no stored tensor for {adapter.block_prefix(layer)}{key}")
