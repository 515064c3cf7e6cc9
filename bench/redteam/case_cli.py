"""The command line every red-team folder's ``cases`` module shares: ``[--threads N] [--dtype NAME] CASE ...``."""

from __future__ import annotations

import torch


def case_arguments(argv: list[str]) -> tuple[int, torch.dtype | None, list[str]]:
    """(torch threads, default 2; the storage dtype named by --dtype, or None for float32; the case names left)."""
    args = list(argv)
    threads, dtype = 2, None
    if "--threads" in args:
        i = args.index("--threads")
        threads = int(args[i + 1])
        del args[i:i + 2]
    if "--dtype" in args:
        i = args.index("--dtype")
        dtype = getattr(torch, args[i + 1])
        del args[i:i + 2]
    return threads, dtype, args
