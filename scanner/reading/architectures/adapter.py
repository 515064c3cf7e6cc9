"""The adapter for every language model that has no hand-checked family row: everything read off the module tree.

`scanner.reading.architectures.families` keeps rows for the Llama-style families whose every weight role (norms,
attention, MLP) the weight statistics need by name. Any other architecture transformers builds is read here: its decoder
layers, their MLP sites (gated or plain, dense or expert tensors, shared experts, hybrid layers without one) and its
stored tensors, all as transformers' own modules and loader place them. Blocks are the layers that hold an MLP, in
order; the fingerprint records which layers those were.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import CONFIG_MAPPING

from scanner.errors import CheckpointError, UnsupportedArchitectureError
from scanner.reading.architectures.config import transformers_config
from scanner.reading.architectures.module_tree import ModuleTree, build_meta_model, not_decoder_only
from scanner.reading.architectures.names import UNVERIFIED
from scanner.reading.architectures.shape import ModelShape
from scanner.reading.architectures.sites import MLPKind, SiteWeights, site_units, site_weights
from scanner.reading.architectures.tasks import Attention, Task, model_task, task_attention
from scanner.reading.checkpoint import Checkpoint

#: Config keys that name the MLP's activation, by the families that use them.
ACTIVATION_KEYS = ("hidden_activation", "hidden_act", "activation_function", "ffn_activation", "afn", "activation")


class ModuleTreeAdapter:
    """Any decoder-only causal LM, language model inside an image-text-to-text checkpoint, or encoder masked LM
    (`scanner.reading.architectures.tasks`) whose layers' MLPs `scanner.reading.architectures.sites` finds."""

    def __init__(self, checkpoint: Checkpoint) -> None:
        """Build the model on the meta device, find its MLPs and check the stored shapes against it (headers only)."""
        self.checkpoint = checkpoint
        if checkpoint.config.get("model_type") not in CONFIG_MAPPING:
            raise UnsupportedArchitectureError(
                f"{checkpoint.path}: model_type {checkpoint.config.get('model_type')!r} is not supported: the "
                "installed transformers does not build it (hubtrace never runs a checkpoint's own code)"
            )
        if checkpoint.config["model_type"] in UNVERIFIED:
            raise UnsupportedArchitectureError(
                f"{checkpoint.path}: model_type {checkpoint.config['model_type']!r} is not supported (not verified: "
                f"{UNVERIFIED[checkpoint.config['model_type']]})"
            )
        config = transformers_config(checkpoint)
        self.task: Task = model_task(config)
        self.attention: Attention = task_attention(self.task)
        self.tree = ModuleTree(checkpoint, build_meta_model(checkpoint, config))
        reason = not_decoder_only(config, self.tree.stack) if self.task != "masked-lm" else None
        if reason:
            raise UnsupportedArchitectureError(f"{checkpoint.path}: model_type {config.model_type!r} is {reason}")
        self.block_layers = [layer for layer, sites in enumerate(self.tree.sites) if sites]
        if not self.block_layers:
            raise UnsupportedArchitectureError(
                f"{checkpoint.path}: model_type {config.model_type!r} has no feed-forward network (MLP) in any of its "
                f"{len(self.tree.sites)} layers that hubtrace recognises, so no activation statistic applies"
            )
        kinds = {site.kind for layer in self.block_layers for site in self.tree.sites[layer]}
        if len(kinds) > 1:
            raise UnsupportedArchitectureError(
                f"{checkpoint.path}: model_type {config.model_type!r} mixes gated and plain MLPs; hubtrace "
                "compares one kind of unit per model"
            )
        self.mlp_kind: MLPKind = kinds.pop()
        text = config.get_text_config()
        self._embed_key = _parameter_key(self.tree.lm, self.tree.lm.get_input_embeddings())
        self._embed_name = self.tree.stored_name(self._embed_key)
        if self._embed_name is None:
            raise CheckpointError(f"{checkpoint.path} stores no token embedding (the model's {self._embed_key})")
        first = self.tree.sites[self.block_layers[0]]
        routed = max(self.routed_experts(block) for block in range(len(self.block_layers)))
        architectures = checkpoint.config.get("architectures") or [checkpoint.config["model_type"]]
        vocab, hidden = checkpoint.shape(self._embed_name)
        self.shape = ModelShape(
            architecture=str(architectures[0]),
            model_type=str(checkpoint.config["model_type"]),
            n_layers=len(self.block_layers),
            hidden_size=int(hidden),
            intermediate_size=site_units(self.tree.stack.layers[self.block_layers[0]], first[0]),
            vocab_size=int(vocab),
            n_experts=routed,
            hidden_act=next((str(v) for k in ACTIVATION_KEYS if isinstance(v := getattr(text, k, None), str)),
                            "unknown"),
            tie_word_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
        )
        self._check_shapes()

    # -- the adapter interface -----------------------------------------------------------------------------------

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        """float32 (len(ids), d) rows of the input embedding, reading only those rows."""
        return self.checkpoint.get_rows(self._embed_name, ids).float()

    def streamed_tensor_names(self) -> set[str]:
        """Stored names of every tensor a block-by-block forward pass reads whole (every layer's, MLP or not)."""
        return {name for names in self.tree.stored_by_layer.values() for name in names}

    def global_tensor_names(self) -> list[str]:
        """Stored tensors of the base model outside its layers that run before the first block (positions, input
        norms, an encoder's embedding LayerNorm and token types), the input embedding and the output head
        excluded."""
        base = self.tree.stack.base_path + "." if self.tree.stack.base_path else ""
        layers = self.tree.stack.layers_path + "."
        return [name for name, key in self.tree.model_keys.items()
                if key.startswith(base) and not key.startswith(layers) and key != self._embed_key]

    def routed_experts(self, block: int) -> int:
        """Routed experts of MLP block ``block``, read from that block's own sites: a model may mix dense and MoE
        blocks (DeepSeek-V3's and GLM-4.5's dense first blocks, Llama 4's and Jamba's interleaved ones)."""
        return next((site.experts for site in self.tree.sites[self.block_layers[block]] if site.experts), 0)

    @property
    def model_layers(self) -> list[int] | None:
        """The decoder layer of each block, when some layers hold no MLP (None: block i is layer i)."""
        return None if len(self.block_layers) == len(self.tree.sites) else list(self.block_layers)

    def mlp(self, block: int) -> list[SiteWeights]:
        """MLP block `block`'s weights, float32 on the CPU: one per routed expert, then dense MLPs (shared last)."""
        layer = self.block_layers[block]
        module = self.tree.load_layer(layer, "cpu", torch.float32)
        try:
            return [w for site in self.tree.sites[layer] for w in site_weights(module, site)]
        finally:
            self.tree.release_layer(layer)

    def block_weights(self, block: int) -> dict[str, torch.Tensor]:
        raise UnsupportedArchitectureError(
            f"{self.checkpoint.path}: phi_l2 compares weights role by role, which hubtrace knows only for the "
            "Llama-style families; use --stat match"
        )

    # -- checks ----------------------------------------------------------------------------------------------------

    def _check_shapes(self) -> None:
        """Every stored tensor that loads into a parameter as it is must have that parameter's shape (fused and
        renamed tensors are checked by transformers' loader when their block is read)."""
        depth = len(self.tree.stack.layers)
        beyond = sorted(layer for layer in self.tree.stored_by_layer if layer >= depth)
        if beyond:
            raise CheckpointError(
                f"{self.checkpoint.path}: config.json gives {depth} layers but the checkpoint stores layer {beyond[0]}"
            )
        meta = self.tree.lm.state_dict()
        for name, key in self.tree.model_keys.items():
            expected = meta.get(key)
            if expected is None or name != key and not name.endswith(key.split(".", 1)[-1]):
                continue
            found = tuple(self.checkpoint.shape(name))
            if found != tuple(expected.shape):
                raise CheckpointError(
                    f"{self.checkpoint.path}: tensor {name} has shape {found} but config.json implies "
                    f"{tuple(expected.shape)}"
                )


def _parameter_key(lm: torch.nn.Module, module: torch.nn.Module) -> str:
    """The state-dict key of `module`'s weight inside `lm`."""
    for path, candidate in lm.named_modules():
        if candidate is module:
            return f"{path}.weight"
    raise UnsupportedArchitectureError(f"{type(lm).__name__}: its input embedding is not one of its modules")
