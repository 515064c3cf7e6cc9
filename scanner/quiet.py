"""transformers' progress bars off for a while: one bar per saved file, loaded block or tiny model would bury a
scan's or a build's log under lines that say nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_progress_bars() -> Iterator[None]:
    """Within the block, transformers draws no progress bar; afterwards they are as they were."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()
