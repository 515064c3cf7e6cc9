"""Candidate sources: where the similarity matrix lives, and how its large entries are found there.

A source answers the few questions the solve asks of the dense matrix (each row's initial candidates, exact
k-th largest entries, the entries above new thresholds, whole rows for the certificate, the dense matrix for
the fallback), so a matrix on a GPU never has to come to the CPU whole. ``NumpySource`` holds a numpy array;
``TorchSource`` a torch tensor on any device, selecting candidates there and sending only sparse pieces over.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

_BLOCK_ELEMENTS = 1 << 19  # entries per candidate-extraction block (2 MB of float32): stays in cache

#: (thresholds t_i, indptr, column indices, float64 values): a row's candidates in CSR, and the bound on the rest.
Candidates = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class SimilaritySource(Protocol):
    """A (rows, cols) similarity matrix, asked only for what the certified solve needs."""

    shape: tuple[int, int]

    def initial_candidates(self, k: int, kmin: int, kmax: int) -> Candidates:
        """Each row's entries above a threshold t_i chosen to keep about ``k`` of them (exactly k where an
        estimate from a sample keeps fewer than ``kmin`` or more than ``kmax``). Raises ValueError on NaN/+inf."""
        ...

    def row_maxima(self) -> tuple[np.ndarray, np.ndarray]:
        """(column, float64 value) of each row's largest entry, the first where several tie; a NaN counts as the
        largest (as numpy's and torch's argmax count it), so a matrix holding one shows it in the values."""
        ...

    def exact_thresholds(self, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        """The (ks+1)-th largest entry of each given row (-inf for rows shorter than that)."""
        ...

    def extract(self, rows: np.ndarray, thr_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(count per row, column indices, float64 values) of the given rows' entries above their thresholds."""
        ...

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """The given rows, whole, as float64 (exact copies of the entries)."""
        ...

    def dense(self) -> np.ndarray:
        """The whole matrix as a numpy array, for the dense fallback."""
        ...


def make_source(similarity: Any, device: Any) -> SimilaritySource:
    """A numpy array stays on the CPU; a torch tensor, or any matrix with a non-CPU ``device``, goes to torch."""
    is_tensor = type(similarity).__module__.split(".")[0] == "torch"
    if not is_tensor and (device is None or str(device) == "cpu"):
        return NumpySource(np.asarray(similarity))
    import torch

    if not is_tensor:
        similarity = torch.from_numpy(np.ascontiguousarray(similarity))
    return TorchSource(similarity, device)


def _sample_plan(k: int, m: int) -> tuple[int, int]:
    """Columns sampled for the initial thresholds, and the rank in the sample that targets k entries."""
    sample = m if m <= 2048 else max(1024, m // 8)
    rank = k + 1 if sample == m else max(1, round((k + 1) * sample / m))
    return sample, rank


class NumpySource:
    """A numpy array on the CPU, scanned in cache-sized blocks of rows."""

    def __init__(self, s: np.ndarray) -> None:
        if s.ndim != 2:
            raise ValueError(f"similarity must be 2-D, got shape {s.shape}")
        if s.dtype not in (np.float32, np.float64):
            s = s.astype(np.float64)
        self.s = np.ascontiguousarray(s)
        self.shape = self.s.shape

    def initial_candidates(self, k: int, kmin: int, kmax: int) -> Candidates:
        s = self.s
        n, m = s.shape
        sample, rank = _sample_plan(k, m)
        block_rows = max(1, _BLOCK_ELEMENTS // m)
        mask_buffer = np.empty((block_rows, m), dtype=bool)
        thr = np.empty(n, dtype=s.dtype)
        rows_out, cols_out, vals_out = [], [], []
        for r0 in range(0, n, block_rows):
            block = s[r0 : r0 + block_rows]
            b = block.shape[0]
            t = np.partition(block[:, :sample], sample - rank, axis=1)[:, sample - rank]
            mask = mask_buffer[:b]
            # not (s <= t) rather than s > t: NaN entries become candidates, where they are caught below
            np.less_equal(block, t[:, None], out=mask)
            np.logical_not(mask, out=mask)
            flat = np.flatnonzero(mask)
            counts = np.bincount(flat // m, minlength=b)
            redo = np.flatnonzero((counts < kmin) | (counts > kmax))
            if redo.size:
                t[redo] = _kth_largest(block[redo], k + 1)
                for r in redo:
                    np.less_equal(block[r], t[r], out=mask[r])
                    np.logical_not(mask[r], out=mask[r])
                flat = np.flatnonzero(mask)
            if np.isnan(t).any() or np.isposinf(t).any():
                raise ValueError("similarity contains NaN or +inf entries")
            thr[r0 : r0 + b] = t
            rows_out.append(flat // m + r0)
            cols_out.append(flat % m)
            vals_out.append(block.ravel()[flat])
        rows = np.concatenate(rows_out)
        values = np.concatenate(vals_out).astype(np.float64)
        if np.isnan(values).any() or np.isposinf(values).any():  # every NaN is here, and every +inf
            raise ValueError("similarity contains NaN or +inf entries")  # unless its t_i is +inf
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        return thr, indptr, np.concatenate(cols_out).astype(np.int32), values

    def row_maxima(self) -> tuple[np.ndarray, np.ndarray]:
        columns = np.argmax(self.s, axis=1)
        return columns, self.s[np.arange(self.shape[0]), columns].astype(np.float64)

    def exact_thresholds(self, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        out = np.empty(rows.size, dtype=self.s.dtype)
        for k in np.unique(ks):
            sel = np.flatnonzero(ks == k)
            for start in range(0, sel.size, 256):
                part = sel[start : start + 256]
                out[part] = _kth_largest(self.s[rows[part]], int(k) + 1)
        return out

    def extract(self, rows: np.ndarray, thr_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        block = self.s[rows]
        mask = block > thr_rows[:, None]
        flat = np.flatnonzero(mask)
        m = self.shape[1]
        counts = np.bincount(flat // m, minlength=rows.size)
        return counts, (flat % m).astype(np.int32), block.ravel()[flat].astype(np.float64)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        return self.s[rows].astype(np.float64)

    def dense(self) -> np.ndarray:
        return self.s


def _kth_largest(block: np.ndarray, k: int) -> np.ndarray:
    """The k-th largest entry of each row (-inf when the rows have fewer than k entries)."""
    m = block.shape[1]
    if k > m:
        return np.full(block.shape[0], -np.inf, dtype=block.dtype)
    return np.partition(block, m - k, axis=1)[:, m - k]


class TorchSource:
    """A torch tensor on any device: candidate selection there, only sparse pieces come to the CPU."""

    def __init__(self, t: Any, device: Any) -> None:
        import torch

        self.torch = torch
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda" and not torch.cuda.is_available():
                raise RuntimeError("device='cuda' was asked for, but CUDA is not available")
            t = t.to(device)
        if t.ndim != 2:
            raise ValueError(f"similarity must be 2-D, got shape {tuple(t.shape)}")
        if t.dtype not in (torch.float32, torch.float64):
            t = t.to(torch.float64)
        self.t = t.contiguous()
        self.shape = tuple(self.t.shape)
        self.np_dtype = np.float32 if t.dtype == torch.float32 else np.float64

    def initial_candidates(self, k: int, kmin: int, kmax: int) -> Candidates:
        torch, t = self.torch, self.t
        n, m = self.shape
        if bool(torch.isnan(t).any()) or bool(torch.isposinf(t).any()):
            raise ValueError("similarity contains NaN or +inf entries")
        sample, rank = _sample_plan(k, m)
        thr = torch.topk(t[:, :sample], rank, dim=1).values[:, rank - 1].contiguous()
        counts = (t > thr[:, None]).sum(dim=1)
        redo = torch.nonzero((counts < kmin) | (counts > kmax)).flatten()
        if redo.numel():
            thr[redo] = self._kth_largest(t[redo], k + 1)
        rows = np.arange(n, dtype=np.int64)
        thr_np = thr.cpu().numpy()
        counts, indices, values = self.extract(rows, thr_np)
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(counts, out=indptr[1:])
        return thr_np, indptr, indices, values

    def row_maxima(self) -> tuple[np.ndarray, np.ndarray]:
        values, columns = self.t.max(dim=1)
        return columns.cpu().numpy(), values.to(self.torch.float64).cpu().numpy()

    def _kth_largest(self, block: Any, k: int) -> Any:
        if k > block.shape[1]:
            return self.torch.full((block.shape[0],), -float("inf"), dtype=block.dtype, device=block.device)
        return self.torch.topk(block, k, dim=1).values[:, k - 1]

    def exact_thresholds(self, rows: np.ndarray, ks: np.ndarray) -> np.ndarray:
        out = np.empty(rows.size, dtype=self.np_dtype)
        for k in np.unique(ks):
            sel = np.flatnonzero(ks == k)
            index = self.torch.as_tensor(rows[sel], device=self.t.device)
            out[sel] = self._kth_largest(self.t[index], int(k) + 1).cpu().numpy()
        return out

    def extract(self, rows: np.ndarray, thr_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        torch = self.torch
        m = self.shape[1]
        block_rows = max(1, (1 << 24) // m)
        counts, indices, values = [], [], []
        for start in range(0, rows.size, block_rows):
            index = torch.as_tensor(rows[start : start + block_rows], device=self.t.device)
            block = self.t[index]
            t = torch.as_tensor(thr_rows[start : start + block_rows], device=self.t.device, dtype=block.dtype)
            mask = block > t[:, None]
            counts.append(mask.sum(dim=1).cpu().numpy())
            indices.append(torch.nonzero(mask)[:, 1].to(torch.int32).cpu().numpy())
            values.append(block[mask].to(torch.float64).cpu().numpy())
        return np.concatenate(counts).astype(np.int64), np.concatenate(indices), np.concatenate(values)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        index = self.torch.as_tensor(rows, device=self.t.device)
        return self.t[index].to(self.torch.float64).cpu().numpy()

    def dense(self) -> np.ndarray:
        return self.t.cpu().numpy()
