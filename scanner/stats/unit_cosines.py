"""A cosine matrix kept as its two sides' unit rows, for the greedy matching on a CPU that multiplies bf16 in hardware.

Why: on the CPU the greedy matching of an 11008 x 11008 view pays for the float32 product (about two thirds of its
time) and a top-k pass over the 484 MB it writes. Where the CPU has AMX tiles, a bf16 product costs about half, but
its entries are rounded to bf16 (8 bits: steps of 0.001 near the largest cosines of unrelated units), so two entries
of a row tie often, and a tie broken by index would let the units' stored order into the matching, which the
p-values must not see (docs/statistics.md, "The matching rule"). So the bf16 product only proposes each row's
candidates, and float32 decides:

1. each row's ``k + CANDIDATE_MARGIN`` largest bf16 entries, keeping only those strictly above the next one (a set
   defined by the values alone, whatever ties there are at its edge);
2. those entries computed again in float32 (dot products of the float32 unit rows), and the row's ``k`` largest of
   them are its candidates, in float32, for the rounds of scanner.stats.assignment.greedy;
3. later stages (rows whose candidates were all taken) read float32 products of those rows and the free columns.

Every step reads one view's values only and is the same whatever order the units come in, so the matching stays a
function of that view (the null argument). Where the bf16 product's error (at most ~0.0014 of the cosine, measured)
moves a row's float32 top-k out of its bf16 top ``k + CANDIDATE_MARGIN``, the candidates differ from the float32
rule's: a different, equally valid rule, measured in BENCHMARKS.md ("7B-shaped pair"). The exact assignment reads
the float32 matrix (`float32_matrix`), as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scanner.stats.matching import unit_rows_tensor

CANDIDATE_MARGIN = 8
"""bf16 entries read beyond the ``k`` candidates a row keeps, so bf16 rounding rarely changes which are kept."""
_CHUNK_ROWS = 2048  # rows re-scored at a time: their gathered partner rows stay ~20 MB


def fast_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices in hardware (AMX tiles), where the bf16 product runs at about twice
    float32's; elsewhere bf16 is emulated and slower."""
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check and check())


CPU_PRODUCTS = "bf16" if fast_bf16() else "float32"
"""Which product finds the greedy matching's candidates on the CPU: ``bf16`` (this module) where the CPU has AMX
tiles, else ``float32`` (the whole float32 matrix, scanner.stats.matching.cosine_similarity_matrix). Benches set it to
compare the two in one process."""


def bf16_candidates(device: str | None) -> bool:
    """Whether views compared on ``device`` (None: the CPU) are kept as UnitCosines (CPU_PRODUCTS, read now)."""
    return device is None and CPU_PRODUCTS == "bf16"


@dataclass(frozen=True)
class UnitCosines:
    """The cosines of every row of ``a`` with every row of ``b`` (float32 unit rows on the CPU), never held whole
    unless the exact assignment asks (`float32_matrix`); ``sign_free``: their absolute values."""

    a: torch.Tensor
    b: torch.Tensor
    sign_free: bool = False

    @classmethod
    def of_views(cls, a: Any, b: Any, sign_free: bool = False) -> UnitCosines:
        """From two (rows, tokens) arrays of any float dtype (a fingerprint's float16 rows, a decoupled view)."""
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
            raise ValueError(f"MATCH needs two matrices with equal column counts, got {a.shape} and {b.shape}")
        rows = [unit_rows_tensor(torch.as_tensor(np.asarray(x)).float()) for x in (a, b)]
        if not all(bool(torch.isfinite(x).all()) for x in rows):
            raise ValueError("similarity contains NaN or infinite entries")
        return cls(rows[0], rows[1], sign_free)

    @property
    def shape(self) -> tuple[int, int]:
        return self.a.shape[0], self.b.shape[0]

    @property
    def T(self) -> UnitCosines:  # noqa: N802 - reads as a matrix's transpose, which callers take
        return UnitCosines(self.b, self.a, self.sign_free)

    def _signed(self, cosines: torch.Tensor) -> torch.Tensor:
        return cosines.abs_() if self.sign_free else cosines

    def float32_matrix(self) -> np.ndarray:
        """The whole float32 matrix (what scanner.stats.matching.cosine_similarity_matrix returns)."""
        return self._signed(self.a @ self.b.T).numpy()

    def block(self, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """The float32 cosines of the given rows with the given columns."""
        return self._signed(self.a[rows] @ self.b[columns].T)

    def pairs(self, rows: np.ndarray, columns: np.ndarray) -> torch.Tensor:
        """The float32 cosine of each (rows[i], columns[i, j]): entries one at a time, not a product."""
        rows_t, columns_t = torch.as_tensor(rows), torch.as_tensor(columns)
        out = torch.einsum("nd,nkd->nk", self.a[rows_t], self.b[columns_t]) if columns_t.ndim == 2 else \
            (self.a[rows_t] * self.b[columns_t]).sum(dim=1)
        return self._signed(out)

    def first_candidates(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's candidates (module docstring, steps 1-2): (float32 values, columns), each (rows, k) with the
        largest first; a row with fewer (a bf16 tie at the edge of its set) has -inf values in its last places."""
        n, m = self.shape
        wide = min(k + CANDIDATE_MARGIN + 1, m)
        coarse = self._signed(self.a.bfloat16() @ self.b.bfloat16().T)
        top, columns = torch.topk(coarse, wide, dim=1)
        del coarse
        keep = top > top[:, -1:] if wide < m else torch.ones_like(top, dtype=torch.bool)
        values = torch.cat([self.pairs(np.arange(start, min(start + _CHUNK_ROWS, n)),
                                       columns[start:start + _CHUNK_ROWS].numpy())
                            for start in range(0, n, _CHUNK_ROWS)])
        values = values.masked_fill_(~keep, -torch.inf)
        best, position = torch.topk(values, min(k, wide), dim=1)
        return best, torch.gather(columns, 1, position)
