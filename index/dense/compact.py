"""A dense segment whose faiss index holds only the rows that have a vector.

Rows without a vector (an optional field left out, a document pruned by quality) take no
place in the index: its ids are *slots*, the present rows in row order. ``CompactSegment``
wraps the slot-space ``DenseSegment`` and speaks rows to everyone else: allow masks are
narrowed to the slots (kept per frozen mask: ``MaskCache.derived``, as ``Presence.fold``), result
slots are mapped back to rows (O(k) per query), ``vectors``/``score`` give NaN for absent rows.
Slots keep the rows' order, so ties between equal scores break as an uncompacted index breaks
them (lower row first).
"""
from __future__ import annotations

import numpy as np

from polyindex.index.dense.presence import FOLD_ENTRIES, Presence
from polyindex.index.masks import MaskCache
from polyindex.index.protocol import SegmentIndex


class CompactSegment(SegmentIndex):  # and StoredVectors
    def __init__(self, inner, present: np.ndarray, docs=None, column: str = "embedding"):
        self.inner = inner  # a DenseSegment over the slots
        self._docs, self._column = docs, column  # the stored column (row space), if any
        self.presence = Presence(present)  # the vector lane sends such segments to ``search``
        self.n_rows = len(present)
        self.rows_of = np.flatnonzero(present)                 # slot -> row
        # slot -> row with faiss's -1 padding mapped to -1 (the last entry): no np.where
        # branch indexes an empty rows_of when no row of the segment has a vector
        self._row_or_pad = np.append(self.rows_of, -1)
        self.slot_of = np.cumsum(present, dtype=np.int64) - 1  # row -> slot, where present
        self.metric, self.device, self.on_gpu = inner.metric, inner.device, inner.on_gpu
        self.folder, self.index, self.hnsw_ef = inner.folder, inner.index, inner.hnsw_ef
        self.lane_parts: dict = {}
        self._narrowed = MaskCache(FOLD_ENTRIES)

    def slots(self, allow: np.ndarray | None) -> np.ndarray | None:
        """An allow mask over rows as one over slots (None stays None: every slot has a row)."""
        if allow is None:
            return None
        return self._narrowed.derived(allow, lambda a: a[self.rows_of])

    def search(self, prepared, k, params, allow):
        scores, slots = self.inner.search(prepared, k, params, self.slots(allow))
        return scores, self._row_or_pad[slots]

    def _present(self, rows: np.ndarray) -> np.ndarray:
        ok = (rows >= 0) & (rows < self.n_rows)
        ok[ok] = self.presence.mask[rows[ok]]
        return ok

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """Stored float32 vectors of rows; NaN rows for rows without one."""
        rows = np.asarray(rows, dtype=np.int64)
        out = np.full((len(rows), self.inner.index.d), np.nan, np.float32)
        ok = self._present(rows)
        if ok.any():
            stored = self._stored()
            out[ok] = (stored[rows[ok]] if stored is not None
                       else self.inner.vectors(self.slot_of[rows[ok]]))
        return out

    def _stored(self) -> np.ndarray | None:
        """The segment's stored column of the field (memory-mapped; exact where the index keeps
        only codes), or None when the index is the only copy."""
        return None if self._docs is None else self._docs.vector_column(self._column)

    def score(self, prepared, row_ids):
        rows = np.asarray(row_ids, dtype=np.int64)
        out = np.full((len(prepared), len(rows)), np.nan, dtype=np.float32)
        ok = self._present(rows)
        if ok.any():
            out[:, ok] = self.inner.score(prepared, self.slot_of[rows[ok]])
        return out
