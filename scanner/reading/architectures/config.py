"""config.json as transformers' own config class reads it."""

from __future__ import annotations

import copy
import re
from typing import Any

from transformers import CONFIG_MAPPING, PretrainedConfig

from scanner.errors import CheckpointError
from scanner.reading.checkpoint import Checkpoint

#: Config keys that choose an implementation (attention, experts), whatever their prefix or suffix.
IMPLEMENTATION_KEY = re.compile(r"implementation", re.IGNORECASE)


def transformers_config(checkpoint: Checkpoint) -> PretrainedConfig:
    """config.json as transformers' own config class reads it: its defaults, legacy fixes and type checks.

    Built from the config the checkpoint already read (bounded, from a regular file): transformers never opens
    the folder's config.json a second time.

    Only built-in config classes are used: opening the checkpoint refused auto_map for any other model_type and
    removed it from the config otherwise. Which code runs the attention and the experts is hubtrace's choice, never
    the checkpoint's: every `...implementation` key is dropped (a Hub-style value would make transformers download
    and load a compiled kernel when the `kernels` package is installed).
    """
    model_type = checkpoint.config["model_type"]
    try:
        # transformers writes inf and NaN as {"__float__": "Infinity"} (Bamba's time_step_limit) and reads them back
        values = PretrainedConfig._decode_special_floats(_without_implementation_choices(checkpoint.config))
        config = CONFIG_MAPPING[model_type].from_dict(values)
    # The config classes raise assorted errors (strict dataclass validation, ValueError, TypeError) on bad input.
    except Exception as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # the whole message: its first line ends in ':'
        raise CheckpointError(
            f"{checkpoint.path / 'config.json'} is not a valid {model_type} config: {reason}"
        ) from exc
    text = config.get_text_config()
    if not isinstance(text, PretrainedConfig):  # a text_config key a type without a text sub-config keeps as is
        raise CheckpointError(
            f"{checkpoint.path / 'config.json'} is not a valid {model_type} config: its text_config is a "
            f"{type(text).__name__}, and a {model_type} config has no text sub-config to read it as")
    return config


def _without_implementation_choices(values: Any) -> Any:
    """A deep copy of a config dict without the keys that pick implementations (attn_implementation,
    _attn_implementation, experts_implementation, ...), in sub-configs too."""
    if isinstance(values, dict):
        return {k: _without_implementation_choices(v) for k, v in values.items()
                if not (isinstance(k, str) and IMPLEMENTATION_KEY.search(k))}
    if isinstance(values, list):
        return [_without_implementation_choices(v) for v in values]
    return copy.deepcopy(values)
