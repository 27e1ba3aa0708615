"""Shared pieces of the torch kernels: resident copies of segment arrays, CSR ranges, top-k.

The kernels are plain torch tensor programs (gather, scatter-reduce, matmul, top-k), so the
same code runs on ``cpu`` and ``cuda`` tensors; a GPU run differs from a CPU run only in
where the tensors live. No kernel here is hand-written CUDA (fast-plaid's GPU search is built
the same way).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

# torch has no uint16/uint32 arithmetic on every device: widen those to int32/int64
_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.uint32): np.int64}


class Resident:
    """Device copies of long-lived numpy arrays (a segment's memory-mapped columns), made once
    per array and dropped with it. Keyed by ``id`` and checked through a weak reference, so a
    new array that reuses a dead one's id is never served the old copy."""

    def __init__(self, device: str):
        self.device = torch.device(device)
        self._cache: dict[int, tuple[weakref.ref, torch.Tensor]] = {}
        self._lock = threading.Lock()

    def get(self, arr: np.ndarray) -> torch.Tensor:
        key = id(arr)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0]() is arr:
                return hit[1]
        t = to_tensor(arr, self.device)
        try:
            ref = weakref.ref(arr, lambda _r, k=key: self._drop(k))
        except TypeError:  # not weak-referenceable (a view of a scalar): not cached
            return t
        with self._lock:
            self._cache[key] = (ref, t)
        return t

    def _drop(self, key: int) -> None:
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0]() is None:
                del self._cache[key]


def to_tensor(arr, device) -> torch.Tensor:
    """A numpy array as a tensor on ``device`` (widened where torch lacks the dtype)."""
    a = np.asarray(arr)
    a = a.astype(_WIDEN[a.dtype]) if a.dtype in _WIDEN else a
    if not a.flags.writeable or not a.flags.c_contiguous:  # memory maps are read-only
        a = np.ascontiguousarray(a).copy() if not a.flags.c_contiguous else a.copy()
    return torch.from_numpy(a).to(device)


def ranges(offsets: torch.Tensor, items: torch.Tensor):
    """Positions of the CSR rows ``items`` (``offsets[i]:offsets[i+1]``), concatenated, and for
    each position the index into ``items`` it came from; plus each row's length."""
    starts = offsets[items]
    lens = offsets[items + 1] - starts
    slot = torch.repeat_interleave(torch.arange(len(items), device=items.device), lens)
    first = torch.cumsum(lens, 0) - lens  # where each item's run starts in the output
    pos = torch.arange(len(slot), device=items.device) - first[slot] + starts[slot]
    return pos, slot, lens


def topk_rows(scores: torch.Tensor, k: int, rows: torch.Tensor | None = None):
    """Best k per row of ``scores`` (nq, n) (score desc, then lower row first within the k),
    -inf scores padded as row -1; ``rows`` maps columns to row ids (default: the column;
    (n,) for every query alike or (nq, n) per query)."""
    nq, n = scores.shape
    kk = min(k, n)
    out_s = torch.full((nq, k), float("-inf"), dtype=torch.float32, device=scores.device)
    out_r = torch.full((nq, k), -1, dtype=torch.int64, device=scores.device)
    if kk == 0:
        return out_s, out_r
    vals, idx = torch.topk(scores, kk, dim=1, sorted=True)
    ids = idx if rows is None else (rows.gather(1, idx) if rows.dim() == 2 else rows[idx])
    # equal scores: lower row first (the CPU kernels' order), two stable sorts
    o = torch.argsort(ids, dim=1, stable=True)
    vals, ids = vals.gather(1, o), ids.gather(1, o)
    o = torch.argsort(-vals, dim=1, stable=True)
    vals, ids = vals.gather(1, o), ids.gather(1, o)
    ids = torch.where(torch.isfinite(vals), ids, torch.full_like(ids, -1))
    out_s[:, :kk], out_r[:, :kk] = vals.float(), ids
    return out_s, out_r


def sync(device) -> None:
    """Wait for queued GPU work (timings); nothing on a CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def ragged_topk(values: torch.Tensor, rows: torch.Tensor, qid: torch.Tensor,
                sizes: torch.Tensor, nq: int, k: int):
    """Best k per query of ragged candidates: ``values``/``rows`` hold each query's
    candidates one query after the other (``sizes`` of them, query ``qid``)."""
    dev = values.device
    width = max(1, int(sizes.max()) if nq else 1)
    grid = torch.full((nq, width), float("-inf"), device=dev)
    rowg = torch.full((nq, width), -1, dtype=torch.int64, device=dev)
    col = torch.arange(len(rows), device=dev) - torch.repeat_interleave(
        torch.cumsum(sizes, 0) - sizes, sizes)
    grid[qid, col], rowg[qid, col] = values, rows
    return topk_rows(grid, k, rowg)

