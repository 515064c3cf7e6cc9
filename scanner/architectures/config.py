"""config.json as transformers' own config class reads it."""

from __future__ import annotations

import copy

from transformers import CONFIG_MAPPING, PretrainedConfig

from scanner.checkpoint import Checkpoint
from scanner.errors import CheckpointError


def transformers_config(checkpoint: Checkpoint) -> PretrainedConfig:
    """config.json as transformers' own config class reads it: its defaults, legacy fixes and type checks.

    Built from the config the checkpoint already read (bounded, from a regular file): transformers never opens
    the folder's config.json a second time.

    Only built-in config classes are used: opening the checkpoint refused auto_map for any other model_type and
    removed it from the config otherwise.
    """
    model_type = checkpoint.config["model_type"]
    try:
        # transformers writes inf and NaN as {"__float__": "Infinity"} (Bamba's time_step_limit) and reads them back
        values = PretrainedConfig._decode_special_floats(copy.deepcopy(checkpoint.config))
        return CONFIG_MAPPING[model_type].from_dict(values)
    # The config classes raise assorted errors (strict dataclass validation, ValueError, TypeError) on bad input.
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # the whole message: its first line ends in ':'
        raise CheckpointError(
            f"{checkpoint.path / 'config.json'} is not a valid {model_type} config: {reason}"
        ) from exc
