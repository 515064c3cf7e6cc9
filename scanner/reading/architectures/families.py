"""Architecture adapters: a family's stored tensor names -> hubtrace's canonical roles.

Derivation tests compare the same role across two models (layer 3's gate against layer 3's gate), so every family
must expose its weights under one vocabulary, in one layout (float32, PyTorch (out, in)), with norms given as the
multiplier the model really applies. Each adapter checks the config's dims against the tensor headers when it is
built, so a checkpoint whose config lies is refused before any statistic is computed on it.

Canonical block roles: "attn_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"; where the family has
them "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm" and "q_bias", "k_bias", "v_bias", "o_bias"; for MoE
blocks "router", "experts.{e}.gate", "experts.{e}.up", "experts.{e}.down", and for Qwen2-MoE also
"shared_expert.gate", "shared_expert.up", "shared_expert.down" and "shared_router" (the (1, d) sigmoid gate that
scales the shared expert's output; transformers calls it mlp.shared_expert_gate). A family that stores no weight
for a role (OLMo's parameter-free LayerNorm) simply lacks that role.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import torch

from scanner.errors import CheckpointError, UnsupportedArchitectureError
from scanner.reading.architectures.adapter import ModuleTreeAdapter
from scanner.reading.architectures.config import transformers_config
from scanner.reading.architectures.shape import GLUWeights, ModelShape
from scanner.reading.checkpoint import Checkpoint


@dataclass(frozen=True)
class _Spec:
    """A stored tensor and the shape the config implies for it (None: a dim the config does not pin)."""

    name: str
    shape: tuple[int | None, ...]


# Role (possibly a stored, fused role such as "qkv" that `_unfuse` splits) -> stored tensor.
_Layout = dict[str, _Spec]


# Canonical norm role -> module name under the block (its weight is `{name}.weight`).
_PRE_NORMS = MappingProxyType({"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm"})
_QK_NORMS = MappingProxyType({"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"})
# Gemma 2 and 3 norm both sides of attention and of the MLP ("post_attention_layernorm" is a true post-norm).
_SANDWICH_NORMS = MappingProxyType(
    {
        "attn_norm": "input_layernorm",
        "post_attn_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "post_mlp_norm": "post_feedforward_layernorm",
    }
)


@dataclass(frozen=True)
class Family:
    """One architecture family as data: what sets it apart from the Llama layout, and the adapter that reads it.

    Most families are only data (`ArchitectureAdapter` reads them); a family whose layout is fused or sparse, or
    whose live module names differ, names its own `adapter` subclass.
    """

    model_types: tuple[str, ...]
    architectures: tuple[str, ...]  # the class names transformers saves in config["architectures"]
    norms: Mapping[str, str] = field(default_factory=lambda: _PRE_NORMS)  # role -> module name under the block
    norm_offset: float = 0.0  # Gemma stores RMSNorm weights as (multiplier - 1)
    has_final_norm: bool = True
    activation_key: str = "hidden_act"  # the config key naming the gate's activation
    stored_roots: tuple[str, ...] = ("model.",)  # where embed_tokens and layers live in the file
    lm_head_names: tuple[str, ...] = ("lm_head.weight",)
    adapter: type[ArchitectureAdapter] | None = None  # None: the plain ArchitectureAdapter


class ArchitectureAdapter:
    """Llama-layout decoder: separate q/k/v/o and gate/up/down projections under `{root}layers.{i}.`.

    What families differ in as data comes from their `Family`; where their layout is fused or sparse, subclasses
    override `_attention_layout`, `_mlp_layout`, `_unfuse` and `_glu_prefixes`.
    """

    def __init__(self, checkpoint: Checkpoint, family: Family) -> None:
        """Resolve names and dims, then check every tensor's shape against the config (headers only)."""
        self.checkpoint = checkpoint
        self.family = family
        self._config = transformers_config(checkpoint)
        self._text = self._config.get_text_config()
        self._root = self._find_root()
        self._lm_head = next((n for n in self.family.lm_head_names if checkpoint.has(n)), None)
        tied = self._lm_head is None
        if tied and not getattr(self._config, "tie_word_embeddings", False):
            raise CheckpointError(
                f"{checkpoint.path}: config.json unties the output head (tie_word_embeddings is false) "
                f"but there is no {self.family.lm_head_names[0]}"
            )
        n_experts, intermediate_size = self._expert_dims()
        architectures = checkpoint.config.get("architectures") or [checkpoint.config["model_type"]]
        self.shape = ModelShape(
            architecture=architectures[0],
            model_type=checkpoint.config["model_type"],
            n_layers=self._text.num_hidden_layers,
            hidden_size=self._text.hidden_size,
            intermediate_size=intermediate_size,
            vocab_size=self._text.vocab_size,
            n_experts=n_experts,
            hidden_act=getattr(self._text, self.family.activation_key),
            tie_word_embeddings=tied,
        )
        self._check_shapes()

    # -- public API ------------------------------------------------------------------------------------------

    def block_prefix(self, layer: int) -> str:
        """Stored tensor-name prefix of block `layer`, e.g. "model.layers.3." (names in the file, not modules)."""
        return f"{self._root}layers.{layer}."

    def streamed_tensor_names(self) -> set[str]:
        """Stored names of every tensor a block-by-block forward pass reads whole (the blocks' own)."""
        prefixes = tuple(self.block_prefix(layer) for layer in range(self.shape.n_layers))
        return {name for name in self.checkpoint.tensor_names() if name.startswith(prefixes)}

    def routed_experts(self, layer: int) -> int:
        """Routed experts of block ``layer`` (0: a dense MLP)."""
        return 0

    def mlp_module_path(self, layer: int) -> str:
        """Dotted path of block `layer`'s MLP (or sparse MoE block) in the model transformers builds.

        This is the live module name, which may differ from stored names (Mixtral files say block_sparse_moe).
        """
        return f"model.layers.{layer}.mlp"

    def embedding_rows(self, ids: Sequence[int]) -> torch.Tensor:
        """float32 (len(ids), d) input-embedding rows, reading only those rows; stored values (Gemma's sqrt(d)
        input scaling is applied in forward, not stored, and is not applied here)."""
        return self.checkpoint.get_rows(self._embed_name, ids).float()

    def mlp(self, layer: int) -> list[GLUWeights]:
        """Block `layer`'s gated MLPs: one for a dense block; for an MoE block one per routed expert in expert
        order, then the shared expert (Qwen2-MoE) last."""
        weights = self._read(self._mlp_layout(layer))
        return [
            GLUWeights(weights[f"{p}gate"], weights[f"{p}up"], weights[f"{p}down"]) for p in self._glu_prefixes(layer)
        ]

    def block_weights(self, layer: int) -> dict[str, torch.Tensor]:
        """Canonical role -> float32 tensor for every weight of block `layer` (norms as effective multipliers)."""
        return self._read(self._block_layout(layer))

    def stored_names(self, layer: int) -> dict[str, str]:
        """Role -> stored tensor name for every weight of block `layer`, fused roles ("qkv", "gate_up",
        "experts.gate_up") left fused; reads nothing."""
        return {role: spec.name for role, spec in self._block_layout(layer).items()}

    def global_weights(self) -> dict[str, torch.Tensor]:
        """"embed", "lm_head" (the very embedding tensor when tied) and "final_norm" (absent when the family's
        final norm has no weight, as in OLMo)."""
        embed = self.checkpoint.get(self._embed_name).float()
        lm_head = embed if self._lm_head is None else self.checkpoint.get(self._lm_head).float()
        weights = {"embed": embed, "lm_head": lm_head}
        if self.family.has_final_norm:
            weights["final_norm"] = self.checkpoint.get(f"{self._root}norm.weight").float() + self.family.norm_offset
        return weights

    # -- layouts (overridden by families) --------------------------------------------------------------------

    def _expert_dims(self) -> tuple[int, int]:
        """(number of routed experts, per-expert intermediate size); dense: (0, intermediate_size)."""
        return 0, self._text.intermediate_size

    def _block_layout(self, layer: int) -> _Layout:
        return {**self._norm_layout(layer), **self._attention_layout(layer), **self._mlp_layout(layer)}

    def _norm_layout(self, layer: int) -> _Layout:
        d = self.shape.hidden_size
        return {
            role: _Spec(f"{self.block_prefix(layer)}{module}.weight", (None,) if role in ("q_norm", "k_norm") else (d,))
            for role, module in self.family.norms.items()
        }

    def _attention_layout(self, layer: int) -> _Layout:
        prefix = f"{self.block_prefix(layer)}self_attn."
        d, q_rows, kv_rows = self.shape.hidden_size, *self._attention_rows()
        layout = {
            "q": _Spec(f"{prefix}q_proj.weight", (q_rows, d)),
            "k": _Spec(f"{prefix}k_proj.weight", (kv_rows, d)),
            "v": _Spec(f"{prefix}v_proj.weight", (kv_rows, d)),
            "o": _Spec(f"{prefix}o_proj.weight", (d, q_rows)),
        }
        # Biases are optional per checkpoint (Qwen2 always, Llama with attention_bias): take them when stored.
        for role in ("q", "k", "v", "o"):
            bias = f"{prefix}{role}_proj.bias"
            if self.checkpoint.has(bias):
                layout[f"{role}_bias"] = _Spec(bias, (layout[role].shape[0],))
        return layout

    def _mlp_layout(self, layer: int) -> _Layout:
        return self._dense_mlp_layout(layer, self.shape.intermediate_size)

    def _dense_mlp_layout(self, layer: int, hidden: int) -> _Layout:
        prefix = f"{self.block_prefix(layer)}mlp."
        return _glu_layout("", prefix, ("gate_proj", "up_proj", "down_proj"), hidden, self.shape.hidden_size)

    def _glu_prefixes(self, layer: int) -> list[str]:
        """Role prefixes of the gated MLPs that `mlp(layer)` returns, in order."""
        return [""]

    def _unfuse(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Split stored fused roles into canonical ones (identity for separate projections)."""
        return weights

    @property
    def attention_heads(self) -> tuple[int, int]:
        """(query heads, key-value heads) as the family's attention modules use them."""
        heads = self._text.num_attention_heads
        return heads, getattr(self._text, "num_key_value_heads", None) or heads

    # -- machinery -------------------------------------------------------------------------------------------

    def _attention_rows(self) -> tuple[int, int]:
        """(rows of q, rows of k and of v), with head_dim as transformers' attention modules derive it."""
        text = self._text
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return heads * head_dim, kv_heads * head_dim

    @property
    def _embed_name(self) -> str:
        return f"{self._root}embed_tokens.weight"

    def _find_root(self) -> str:
        for root in self.family.stored_roots:
            if self.checkpoint.has(f"{root}embed_tokens.weight"):
                return root
        looked = ", ".join(f"{root}embed_tokens.weight" for root in self.family.stored_roots)
        raise CheckpointError(f"{self.checkpoint.path} has no token embedding (looked for {looked})")

    def _read(self, layout: _Layout) -> dict[str, torch.Tensor]:
        weights = {}
        for role, spec in layout.items():
            tensor = self.checkpoint.get(spec.name).float()
            weights[role] = tensor + self.family.norm_offset if role in self.family.norms else tensor
        return self._unfuse(weights)

    def _check_shapes(self) -> None:
        """Every tensor the adapter will read must exist with the shape the config implies; blocks must be
        exactly 0..num_hidden_layers-1. Reads headers only."""
        s = self.shape
        specs = [_Spec(self._embed_name, (s.vocab_size, s.hidden_size))]
        if self._lm_head is not None:
            specs.append(_Spec(self._lm_head, (s.vocab_size, s.hidden_size)))
        if self.family.has_final_norm:
            specs.append(_Spec(f"{self._root}norm.weight", (s.hidden_size,)))
        layers = _indices(self.checkpoint.tensor_names(), f"{self._root}layers.")
        if layers != set(range(s.n_layers)):
            raise CheckpointError(
                f"{self.checkpoint.path}: config.json says num_hidden_layers={s.n_layers} but the checkpoint "
                f"stores blocks {_describe(layers)} under {self._root}layers."
            )
        for layer in range(s.n_layers):
            specs.extend(self._block_layout(layer).values())
        for spec in specs:
            found = self.checkpoint.shape(spec.name)
            if len(found) != len(spec.shape) or any(e is not None and e != f for e, f in zip(spec.shape, found)):
                expected = "(" + ", ".join("?" if e is None else str(e) for e in spec.shape) + ")"
                raise CheckpointError(
                    f"{self.checkpoint.path}: tensor {spec.name} has shape {found} but config.json implies {expected}"
                )


class Gemma3Adapter(ArchitectureAdapter):
    """Gemma 3 text (gemma3_text) and the text tower of the multimodal gemma3 checkpoints (text_config).

    Multimodal files store the text model as language_model.model.* (transformers' in-memory names are
    model.language_model.*); the vision tower is ignored.
    """

    def mlp_module_path(self, layer: int) -> str:
        if self.shape.model_type == "gemma3":  # transformers builds Gemma3ForConditionalGeneration
            return f"model.language_model.layers.{layer}.mlp"
        return super().mlp_module_path(layer)


class Phi3Adapter(ArchitectureAdapter):
    """Phi-3 fuses q/k/v into qkv_proj (rows: q, then k, then v) and gate/up into gate_up_proj (rows: gate, then
    up, as Phi3MLP does `gate, up = gate_up_proj(x).chunk(2, dim=-1)`)."""

    def _attention_layout(self, layer: int) -> _Layout:
        prefix = f"{self.block_prefix(layer)}self_attn."
        d, q_rows, kv_rows = self.shape.hidden_size, *self._attention_rows()
        return {
            "qkv": _Spec(f"{prefix}qkv_proj.weight", (q_rows + 2 * kv_rows, d)),
            "o": _Spec(f"{prefix}o_proj.weight", (d, q_rows)),
        }

    def _mlp_layout(self, layer: int) -> _Layout:
        prefix = f"{self.block_prefix(layer)}mlp."
        h, d = self.shape.intermediate_size, self.shape.hidden_size
        return {
            "gate_up": _Spec(f"{prefix}gate_up_proj.weight", (2 * h, d)),
            "down": _Spec(f"{prefix}down_proj.weight", (d, h)),
        }

    def _unfuse(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "qkv" in weights:
            q_rows, kv_rows = self._attention_rows()
            weights["q"], weights["k"], weights["v"] = weights.pop("qkv").split([q_rows, kv_rows, kv_rows])
        if "gate_up" in weights:
            weights["gate"], weights["up"] = weights.pop("gate_up").chunk(2)
        return weights


class _MoEAdapter(ArchitectureAdapter):
    """Sparse blocks, stored either per expert (Hub layout, which transformers 5 save_pretrained also writes) or
    as transformers 5's in-memory fused tensors: experts.gate_up_proj (E, 2h, d) whose rows are gate then up
    (`gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1)`), and experts.down_proj (E, d, h)."""

    def _is_sparse(self, layer: int) -> bool:
        return True

    def routed_experts(self, layer: int) -> int:
        return self.shape.n_experts if self._is_sparse(layer) else 0

    def _routed_layout(self, layer: int, moe_prefix: str, names: tuple[str, str, str]) -> _Layout:
        """Router and routed experts of a sparse block: per expert under `moe_prefix` (router `{moe_prefix}gate`,
        expert e's gate/up/down `{moe_prefix}experts.{e}.{names}`), or fused under `{block}mlp.`."""
        e, h, d = self.shape.n_experts, self.shape.intermediate_size, self.shape.hidden_size
        fused = f"{self.block_prefix(layer)}mlp."
        if self.checkpoint.has(f"{fused}experts.gate_up_proj"):
            return {
                "router": _Spec(f"{fused}gate.weight", (e, d)),
                "experts.gate_up": _Spec(f"{fused}experts.gate_up_proj", (e, 2 * h, d)),
                "experts.down": _Spec(f"{fused}experts.down_proj", (e, d, h)),
            }
        layout = {"router": _Spec(f"{moe_prefix}gate.weight", (e, d))}
        for expert in range(e):
            layout |= _glu_layout(f"experts.{expert}.", f"{moe_prefix}experts.{expert}.", names, h, d)
        return layout

    def _glu_prefixes(self, layer: int) -> list[str]:
        if not self._is_sparse(layer):
            return [""]
        return [f"experts.{e}." for e in range(self.shape.n_experts)]

    def _unfuse(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "experts.gate_up" in weights:
            for expert, (gate_up, down) in enumerate(zip(weights.pop("experts.gate_up"), weights.pop("experts.down"))):
                gate, up = gate_up.chunk(2)
                weights |= {f"experts.{expert}.gate": gate, f"experts.{expert}.up": up, f"experts.{expert}.down": down}
        return weights


class MixtralAdapter(_MoEAdapter):
    """Hub/saved layout: block_sparse_moe.experts.{e}.w1 (gate), w3 (up), w2 (down); router block_sparse_moe.gate.
    transformers 5 renames block_sparse_moe to mlp in memory (and in the fused layout)."""

    def _expert_dims(self) -> tuple[int, int]:
        return self._text.num_local_experts, self._text.intermediate_size

    def _mlp_layout(self, layer: int) -> _Layout:
        return self._routed_layout(layer, f"{self.block_prefix(layer)}block_sparse_moe.", ("w1", "w3", "w2"))


class Qwen2MoeAdapter(_MoEAdapter):
    """Routed experts mlp.experts.{e}.{gate,up,down}_proj, router mlp.gate, an always-on shared expert
    mlp.shared_expert.* scaled by sigmoid(mlp.shared_expert_gate x); blocks listed in mlp_only_layers, or off the
    decoder_sparse_step grid, are dense MLPs of intermediate_size."""

    def _expert_dims(self) -> tuple[int, int]:
        return self._text.num_experts, self._text.moe_intermediate_size

    def _is_sparse(self, layer: int) -> bool:
        """The rule of Qwen2MoeDecoderLayer.__init__."""
        text = self._text
        return (
            layer not in text.mlp_only_layers
            and text.num_experts > 0
            and (layer + 1) % text.decoder_sparse_step == 0
        )

    def _mlp_layout(self, layer: int) -> _Layout:
        if not self._is_sparse(layer):
            return self._dense_mlp_layout(layer, self._text.intermediate_size)
        prefix = f"{self.block_prefix(layer)}mlp."
        d, shared = self.shape.hidden_size, self._text.shared_expert_intermediate_size
        names = ("gate_proj", "up_proj", "down_proj")
        return {
            **self._routed_layout(layer, prefix, names),
            **_glu_layout("shared_expert.", f"{prefix}shared_expert.", names, shared, d),
            "shared_router": _Spec(f"{prefix}shared_expert_gate.weight", (1, d)),
        }

    def _glu_prefixes(self, layer: int) -> list[str]:
        routed = super()._glu_prefixes(layer)
        return [*routed, "shared_expert."] if self._is_sparse(layer) else routed


FAMILIES: tuple[Family, ...] = (
    Family(("llama",), ("LlamaForCausalLM",)),
    Family(("mistral",), ("MistralForCausalLM",)),
    Family(("qwen2",), ("Qwen2ForCausalLM",)),
    Family(("qwen3",), ("Qwen3ForCausalLM",), norms=MappingProxyType({**_PRE_NORMS, **_QK_NORMS})),
    # Gemma's RMSNorm computes x * (1 + w): the stored w is one less than the multiplier.
    Family(("gemma",), ("GemmaForCausalLM",), norm_offset=1.0),
    Family(
        ("gemma2",), ("Gemma2ForCausalLM",), norms=_SANDWICH_NORMS, norm_offset=1.0, activation_key="hidden_activation"
    ),
    Family(
        ("gemma3_text", "gemma3"),
        ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"),
        norms=MappingProxyType({**_SANDWICH_NORMS, **_QK_NORMS}),
        norm_offset=1.0,
        activation_key="hidden_activation",
        stored_roots=("model.", "language_model.model.", "model.language_model."),
        lm_head_names=("lm_head.weight", "language_model.lm_head.weight"),
        adapter=Gemma3Adapter,
    ),
    Family(("phi3",), ("Phi3ForCausalLM",), adapter=Phi3Adapter),
    # OLMo (v1) normalizes with a parameter-free LayerNorm: no norm roles and no final_norm.
    Family(("olmo",), ("OlmoForCausalLM",), norms=MappingProxyType({}), has_final_norm=False),
    # OLMo 2 norms the outputs of attention and MLP (no pre-norms) and q/k over all heads at once.
    Family(
        ("olmo2",),
        ("Olmo2ForCausalLM",),
        norms=MappingProxyType(
            {"post_attn_norm": "post_attention_layernorm", "post_mlp_norm": "post_feedforward_layernorm", **_QK_NORMS}
        ),
    ),
    Family(("mixtral",), ("MixtralForCausalLM",), adapter=MixtralAdapter),
    Family(("qwen2_moe",), ("Qwen2MoeForCausalLM",), adapter=Qwen2MoeAdapter),
)


def adapter_for(checkpoint: Checkpoint) -> ArchitectureAdapter | ModuleTreeAdapter:
    """The adapter for this checkpoint's family, already checked against its tensor headers.

    A model_type with no family row is read off transformers' module tree (scanner.reading.architectures), and so is
    one whose config gives its MLPs biases (Llama's ``mlp_bias``): the family rows read no MLP bias, and a constant
    unit (a zero gate row with a bias) read without its bias counted as one that computes nothing
    (bench/redteam/canonical51). Raises
    UnsupportedArchitectureError for a head of a known family hubtrace does not read (e.g. ...ForSequenceClassification)
    or an architecture without MLPs, and CheckpointError when the config and the stored shapes disagree.
    """
    model_type = checkpoint.config.get("model_type")
    architectures = checkpoint.config.get("architectures") or []
    for family in FAMILIES if not checkpoint.config.get("mlp_bias") else ():
        if model_type in family.model_types:
            if architectures and architectures[0] not in family.architectures:
                raise UnsupportedArchitectureError(
                    f"{checkpoint.path}: architecture {architectures[0]} is not supported for model_type "
                    f"{model_type!r}; supported: {', '.join(family.architectures)}"
                )
            return (family.adapter or ArchitectureAdapter)(checkpoint, family)
    return ModuleTreeAdapter(checkpoint)


def _glu_layout(role_prefix: str, stored_prefix: str, names: tuple[str, str, str], hidden: int, d: int) -> _Layout:
    """Roles {role_prefix}gate/up/down -> `{stored_prefix}{name}.weight`, shaped (h, d), (h, d), (d, h)."""
    gate, up, down = names
    return {
        f"{role_prefix}gate": _Spec(f"{stored_prefix}{gate}.weight", (hidden, d)),
        f"{role_prefix}up": _Spec(f"{stored_prefix}{up}.weight", (hidden, d)),
        f"{role_prefix}down": _Spec(f"{stored_prefix}{down}.weight", (d, hidden)),
    }


def _indices(names: Iterable[str], prefix: str) -> set[int]:
    """The integers i for which some name starts with `{prefix}{i}.`."""
    pattern = re.compile(re.escape(prefix) + r"(\d+)\.")
    return {int(m.group(1)) for name in names if (m := pattern.match(name))}


def _describe(indices: set[int]) -> str:
    if not indices:
        return "none"
    ordered = sorted(indices)
    if ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}..{ordered[-1]}"
    return ", ".join(map(str, ordered))
