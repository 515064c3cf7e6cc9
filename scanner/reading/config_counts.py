"""The counts a config declares (layers, experts, attention heads, vocabulary), held against the checkpoint's tensors
before anything is built from them.

transformers builds what a config counts: one module per layer (and, in some families, per expert), lists of one
entry per layer; hubtrace's own shape checks list the layer numbers they expect. A 1 KB config.json that says
``num_hidden_layers: 1000000000`` would make a billion of each before any check could compare them with the weights
(a Llama once grew to 3.3 GB in 9 s, a BERT built a billion layers on the meta device). What the weights hold bounds
each count from above, whatever the family:

* layers: every layer stores at least one tensor of its own, so no more layers than tensors (ALBERT's shared
  layers are a few, far below its tensor count);
* experts: one tensor each, or one dimension of a tensor that stacks them, so no more than the tensors or the
  largest dimension;
* heads and vocabulary: a projection holds every head's rows, an embedding every token's, so no more than the
  largest dimension of any tensor.

So a count past its bound is a config that lies about its weights, refused in one line; every honest config passes.
Counts in sub-configs (``text_config``, ``vision_config``) are held against the same tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from scanner.errors import CheckpointError

LAYER_KEYS = frozenset({"num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers",
                        "num_encoder_layers", "decoder_layers", "encoder_layers"})
EXPERT_KEYS = frozenset({"num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                         "n_shared_experts", "num_experts_per_tok"})
WIDTH_KEYS = frozenset({"num_attention_heads", "num_key_value_heads", "n_head", "n_heads", "num_heads",
                        "num_kv_heads", "multi_query_group_num", "vocab_size", "n_vocab", "padded_vocab_size"})
_COUNT_KEYS = LAYER_KEYS | EXPERT_KEYS | WIDTH_KEYS


def check_config_counts(source: Path, config: dict[str, Any], shapes: Iterable[Sequence[int]]) -> None:
    """Raise CheckpointError naming the first count in ``config`` (at any depth) that its tensors (``shapes``)
    cannot hold; a value that is not a whole number is left for the config's own checks."""
    shapes = list(shapes)
    tensors = len(shapes)
    widest = max((int(d) for shape in shapes for d in shape), default=0)
    layers = (tensors, f"a layer stores at least one tensor, and the checkpoint stores {tensors:,}")
    experts = (max(tensors, widest), f"an expert stores a tensor or a slice of one, and the checkpoint stores "
                                     f"{tensors:,}, the widest {widest:,} wide")
    widths = (widest, f"a head or a token is a row of a tensor, and the widest tensor dimension is {widest:,}")
    bounds = {**dict.fromkeys(LAYER_KEYS, layers), **dict.fromkeys(EXPERT_KEYS, experts),
              **dict.fromkeys(WIDTH_KEYS, widths)}
    for path, key, value in _counts(config):
        bound, why = bounds[key]
        if value > bound:
            raise CheckpointError(f"{source}: {path} is {value:,}, more than its weights can hold ({why}); the "
                                  "config does not describe these weights")


def _counts(config: dict[str, Any]) -> Iterable[tuple[str, str, int]]:
    """(dotted path, key, value) of every whole-number count the config holds, sub-configs included."""
    pending: list[tuple[str, Any]] = [("", config)]
    while pending:
        prefix, node = pending.pop()
        for key, value in node.items() if isinstance(node, dict) else ():
            if isinstance(value, dict):
                pending.append((f"{prefix}{key}.", value))
            elif key in _COUNT_KEYS and isinstance(value, int) and not isinstance(value, bool):
                yield f"{prefix}{key}", key, value
