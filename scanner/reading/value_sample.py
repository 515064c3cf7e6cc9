"""Reading a model's MLP weight values at the verbatim share's fixed positions (scanner.stats.verbatim), block by
block, from the matrices a fingerprint or a weight profile already holds: only the sampled values leave the device."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from scanner.stats.verbatim import matrix_sample_count, sample_positions


def block_sample(matrices: Sequence[tuple[str, torch.Tensor]], n_blocks: int) -> tuple[list[np.ndarray], list[str]]:
    """Each named matrix's values at sample_positions (float32, as read) and its part of the layout (name, shape
    and count): what scanner.stats.verbatim.sample_layout digests."""
    count = matrix_sample_count(n_blocks, len(matrices))
    values, layout = [], []
    for name, matrix in matrices:
        positions = torch.from_numpy(sample_positions(tuple(matrix.shape), count)).to(matrix.device)
        values.append(matrix.reshape(-1)[positions].float().cpu().numpy())
        layout.append(f"{name}{tuple(matrix.shape)}:{count}")
    return values, layout
