"""The few array operations the greedy matching and the auction need, on numpy (a CPU) or torch (any other device).

Why two: both rules work on flat arrays of a few candidates per unit, with gathers, scatters and reductions over
16 columns. torch's CPU kernels for arrays this small cost 5-25 times numpy's (its threads wait on each other on a
busy 2-core machine: 14 ms against 0.1 ms for one gather of 176,000 entries, measured), while on a GPU torch is the
only choice. Indexing and arithmetic read the same in both; what differs is here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class Ops:
    """Array operations for the device the candidates live on: numpy for a CPU, torch for any other."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device, self.numpy = torch, device, device.type == "cpu"

    def here(self, tensor: Any) -> Any:
        """A torch tensor (on this device) as this backend's array (shared memory on a CPU)."""
        return tensor.numpy() if self.numpy else tensor

    def full(self, size: int, value: float | bool, dtype: Any = None) -> Any:
        if self.numpy:
            return np.full(size, value, dtype=dtype)
        return self.torch.full((size,), value, dtype=dtype, device=self.device)

    def repeat(self, n: int, k: int) -> Any:
        """0, ..., 0, 1, ..., 1, ...: each of n rows k times."""
        if self.numpy:
            return np.repeat(np.arange(n), k)
        return self.torch.arange(n, device=self.device).repeat_interleave(k)

    def nonzero(self, mask: Any) -> Any:
        return np.flatnonzero(mask) if self.numpy else self.torch.nonzero(mask).flatten()

    def reduce(self, size: int, index: Any, values: Any, how: str) -> Any:
        """out[j] = max (or min) of values[index == j]; -inf (max) or a value above any index (min) where none."""
        start = -np.inf if how == "max" else np.iinfo(np.int64).max
        if self.numpy:
            out = np.full(size, start, dtype=values.dtype)
            (np.maximum if how == "max" else np.minimum).at(out, index, values)
            return out
        out = self.torch.full((size,), start, dtype=values.dtype, device=self.device)
        return out.scatter_reduce_(0, index, values, "amax" if how == "max" else "amin")

    def where(self, mask: Any, values: Any, otherwise: float) -> Any:
        return np.where(mask, values, otherwise) if self.numpy else self.torch.where(mask, values, otherwise)

    def row_max(self, values: Any) -> Any:
        return values.max(axis=1) if self.numpy else values.amax(dim=1)

    def top_two(self, values: Any) -> tuple[Any, Any, Any]:
        """Per row (of two entries or more): the position of its largest entry (the first one where several are
        equal, on either backend), that entry, and the second largest."""
        if self.numpy:
            first = values.argmax(axis=1)
            best = values[np.arange(values.shape[0]), first]
        else:
            best, first = values.max(dim=1)
        rest = values.copy() if self.numpy else values.clone()
        rest[np.arange(values.shape[0]) if self.numpy else self.torch.arange(values.shape[0]), first] = -np.inf
        return first, best, self.row_max(rest)
