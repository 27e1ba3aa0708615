"""A chunk of a batch's query tables stacked for the batched multivector kernels
(``kernels.first_pass_lut_batch``, ``kernels.final_pass_pq_batch``)."""
from __future__ import annotations

import numpy as np

from polyindex.index.multivector.kernels import REGISTER_COLUMNS, WIDE

QUERY_CHUNK = 64  # queries per batched kernel call: their tables (64 x 4096 x 32 floats) stay small


class Tables:
    """A chunk of queries' tables stacked for the batched kernels: ``luts`` (nq, K, T),
    ``pqs()`` (nq, M, 256, T), T the longest query's token count, rounded up to ``WIDE`` when it
    is over ``REGISTER_COLUMNS`` (query q uses its first ``nqt[q]`` columns). One short query:
    views of its own tables, nothing copied."""

    def __init__(self, queries: list):  # MVQuery (kind.py)
        self.queries = queries
        self.nqt = np.array([q.lut_t.shape[1] for q in queries], np.int64)
        # a query over REGISTER_COLUMNS tokens: stacked once to the final pass's WIDE
        # multiple (zero columns), not widened again by each segment's kernel call
        longest = int(self.nqt.max()) if len(queries) else 0
        self._width = -(-longest // WIDE) * WIDE if longest > REGISTER_COLUMNS else longest
        self.luts = self._stack([q.lut_t for q in queries])
        self._pqs = None
        self._kept = None

    def _stack(self, tabs: list[np.ndarray]) -> np.ndarray:
        t = self._width
        if len(tabs) == 1 and tabs[0].shape[-1] == t:
            return np.ascontiguousarray(tabs[0], np.float32)[None]
        out = np.zeros((len(tabs),) + tabs[0].shape[:-1] + (t,), np.float32)
        for i, x in enumerate(tabs):
            out[i, ..., :x.shape[-1]] = x
        return out

    def kept(self) -> np.ndarray:
        """(nq, K) uint8: the centroids each query's pruned first pass reads."""
        if self._kept is None:
            self._kept = np.stack([q.kept for q in self.queries])
        return self._kept

    def pqs(self) -> np.ndarray:
        if self._pqs is None:
            self._pqs = self._stack([q.pq_t for q in self.queries])
        return self._pqs
