"""An online buffer's small dense segments as one matrix, scanned by one exact faiss call.

Every write batch becomes a small buffer segment (``online.view``) with its own ``Flat``
index; a buffer holds up to a seal's worth of rows in up to ~9 of them. The vector lane
searched them one faiss call each, ~35 us of call overhead apiece beside 100-row scans
(bench/README.md, stop 32). A ``Stack`` keeps the buffer's vectors - copied from the
segments' own flat storage as they are added, so the very same floats - in one growing
matrix, and ``StackSearch`` scans it with the exhaustive kernel ``IndexFlat.search`` itself
calls (``knn_inner_product`` / ``knn_L2sqr``): each row's score is the same bits as in its own
segment's search (a test compares them), so the lane's answer does not change.

Appends write only past the rows a published view covers and a full matrix is replaced,
not grown in place: a snapshot's view never changes under a query.
"""
from __future__ import annotations

import faiss
import numpy as np

_C = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
_ptr = getattr(_C, "swig_ptr", faiss.swig_ptr)


def flat_rows(index) -> np.ndarray | None:
    """The (n, d) float32 storage of a segment's plain CPU ``Flat`` dense index (the rows it
    scores), else None (HNSW, IVF, PQ, a GPU index, an optional field with missing rows)."""
    if index is None or getattr(index, "presence", None) is not None or index.on_gpu:
        return None
    flat = faiss.downcast_index(index.index)
    if type(flat) not in (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2):
        return None
    if flat.metric_type not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
        return None
    if not flat.ntotal:
        return np.zeros((0, flat.d), np.float32)
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


class Stack:
    """The vectors of one field over a buffer's segments, in the buffer's row order."""

    def __init__(self, field: str = "dense"):
        self.field = field
        self._m: np.ndarray | None = None
        self.rows = 0
        self.segments = 0
        self.metric: int | None = None
        self.broken = False  # a segment that is not plain Flat: the lane searches each

    def add(self, seg) -> None:
        """Append a segment's rows (called as the buffer adds the segment)."""
        if self.broken:
            return
        index = seg.indexes.get(self.field)
        x = flat_rows(index)
        metric = None if x is None else faiss.downcast_index(index.index).metric_type
        if x is None or (self.metric is not None and metric != self.metric) or (
                self._m is not None and x.shape[1] != self._m.shape[1]):
            self.broken, self._m = True, None
            return
        self.metric = metric
        need = self.rows + len(x)
        if self._m is None or need > len(self._m):
            grown = np.empty((max(need, 2 * (0 if self._m is None else len(self._m)), 256),
                              x.shape[1]), np.float32)
            if self.rows:
                grown[:self.rows] = self._m[:self.rows]
            self._m = grown  # views published before keep the old matrix
        self._m[self.rows:need] = x
        self.rows = need
        self.segments += 1

    def view(self) -> tuple[int, np.ndarray, int] | None:
        """(segments covered, their rows as one matrix, faiss metric), or None."""
        if self.broken or not self.segments or self._m is None:
            return None
        return self.segments, self._m[:self.rows], self.metric


class StackSearch:
    """A stack's rows (with a live mask) behind the one call the vector lane makes of a faiss
    index: ``search_c(nq, x, k, D, I, params)``."""

    __slots__ = ("m", "n", "d", "l2", "_bits", "sel")

    def __init__(self, matrix: np.ndarray, metric: int, live: np.ndarray | None):
        self.m = np.ascontiguousarray(matrix)
        self.n, self.d = self.m.shape
        self.l2 = metric == faiss.METRIC_L2
        self._bits = self.sel = None
        if live is not None:  # faiss's bitmap: bit j of byte j >> 3, low bit first
            self._bits = np.packbits(live, bitorder="little")
            self.sel = faiss.IDSelectorBitmap(self.n, _ptr(self._bits))

    def search_c(self, nq, x, k, distances, labels, _params=None) -> None:
        if self.l2:
            _C.knn_L2sqr(x, _ptr(self.m), self.d, nq, self.n, k, distances, labels, None,
                         self.sel)
        else:
            _C.knn_inner_product(x, _ptr(self.m), self.d, nq, self.n, k, distances, labels,
                                 self.sel)
