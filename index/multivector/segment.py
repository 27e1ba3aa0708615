"""The multivector kind's per-segment index (``MultivectorSegment``: its passes over one
segment's codes, candidates from its inverted lists, the final MaxSim of given rows) and a
prepared query (``MVQuery``, ``MVPrepared``); the kind, its training and its collection-wide
search are ``index.multivector.kind``."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from polyindex.errors import InvalidArgument
from polyindex.index import postings
from polyindex.index.multivector.kernels import threads_for
from polyindex.index.multivector.tables import Tables
from polyindex.index.postings import half_lut
from polyindex.index.protocol import SegmentIndex

_HALF = half_lut()
_NO_SCALE = postings.readonly(np.zeros(0, np.uint16))  # as a mapped scale: one kernel type


@dataclass
class MVQuery:
    tokens: np.ndarray  # (nqt, d) float32
    lut_t: np.ndarray  # (K, nqt)
    pq_t: np.ndarray | None  # (M, 256, nqt)
    qsig: np.ndarray | None  # (nqt,) uint64
    probes: np.ndarray  # int64 centroid ids
    kept: np.ndarray | None = None  # (K,) uint8: centroids scoring >= tcs for some token


@dataclass
class MVPrepared:
    queries: list[MVQuery]
    nprobe: int
    ndocs: int
    exhaustive: bool
    ncandidates: int = 0  # survivors of the pruned pass (0: no pruned pass)
    final_tokens: int = 0  # a longer query's final pass is cut (``final_docs``; 0: never)
    stats: dict = field(default_factory=lambda: {"candidates": 0, "final": 0})

    def final_docs(self, n_tokens: int) -> int:
        """Documents a query of ``n_tokens`` sends to the final pass: ``ndocs``, or for a
        query over ``final_tokens`` tokens ``ndocs * final_tokens / n_tokens`` (rounded up):
        the same token-column work as a ``final_tokens``-token query's."""
        if self.final_tokens and n_tokens > self.final_tokens:
            return -(-self.ndocs * self.final_tokens // n_tokens)
        return self.ndocs


class MultivectorSegment(SegmentIndex):
    def __init__(self, n_rows, offsets, codes, res, scale, ivf_offsets, ivf_docs, kind,
                 keep=()):
        self.n_rows = n_rows
        self.offsets, self.codes, self.res = offsets, codes, res
        self.scale = _NO_SCALE if scale is None else scale  # float16 bits, see codec.scales
        self.ivf_offsets, self.ivf_docs = ivf_offsets, ivf_docs
        self.kind = kind
        self.nonempty = np.flatnonzero(np.diff(offsets) > 0).astype(np.int64)
        # seen flags of _candidates (the kernel leaves them zero)
        self._marks = postings.BufferPool(n_rows, lambda n: np.zeros(n, np.uint8))
        self._keep = keep  # Arrow tables owning the memory maps

    def _pass(self, q: MVQuery, cand: np.ndarray, final: bool) -> np.ndarray:
        kern, cb = self.kind.kernels, self.kind.codebook
        out = np.empty(len(cand), np.float32)
        with threads_for(len(cand)):
            self._pass_into(kern, cb, q, cand, final, out)
        return out

    def _pass_into(self, kern, cb, q: MVQuery, cand, final: bool, out) -> None:
        if final and self.res is not None:
            kern.final_pass_pq(q.lut_t, q.pq_t, self.offsets, self.codes, self.res, self.scale,
                               _HALF, cand, out)
        elif not final and q.qsig is not None:
            kern.first_pass_hamming(q.qsig, cb.signatures, cb.bits, self.offsets, self.codes,
                                    cand, out)
        else:
            kern.first_pass_lut(q.lut_t, self.offsets, self.codes, cand, out)

    def _batch_pass(self, tables: Tables, which: list[int], cands: list[np.ndarray],
                    stage: str) -> list[np.ndarray]:
        """Scores of ``cands[i]`` for query ``which[i]`` of ``tables`` at ``stage`` (``pruned``:
        centroid interaction over the kept centroids; ``first``: over every code; ``final``:
        with the residuals), one kernel call for all of them (a binary first pass: one call
        per query)."""
        if stage == "first" and tables.queries[0].qsig is not None:
            return [self._pass(tables.queries[a], c, final=False) if len(c)
                    else np.zeros(0, np.float32) for a, c in zip(which, cands)]
        sizes = [len(c) for c in cands]
        cand = np.concatenate(cands) if cands else np.zeros(0, np.int64)
        out = np.empty(len(cand), np.float32)
        if len(cand):
            with threads_for(len(cand)):
                self._batch_into(tables, which, sizes, cand, stage, out)
        return np.split(out, np.cumsum(sizes)[:-1])

    def _batch_into(self, tables: Tables, which, sizes, cand, stage: str, out) -> None:
        qid = np.repeat(np.asarray(which, np.int64), sizes)
        kern = self.kind.kernels
        if stage == "final" and self.res is not None:
            kern.final_pass_pq_batch(tables.luts, tables.pqs(), tables.nqt, qid, self.offsets,
                                     self.codes, self.res, self.scale, _HALF, cand, out)
        elif stage == "pruned":
            kern.first_pass_pruned_batch(tables.luts, tables.kept(), tables.nqt, qid,
                                         self.offsets, self.codes, cand, out)
        else:
            kern.first_pass_lut_batch(tables.luts, tables.nqt, qid, self.offsets, self.codes,
                                      cand, out)

    def _candidates(self, q: MVQuery, prepared: MVPrepared, allow) -> np.ndarray:
        if prepared.exhaustive:
            return self.nonempty if allow is None else self.nonempty[allow[self.nonempty]]
        # Scratch bounded by the candidates, not the segment: the probed lists' length, and
        # the seen flags reused.
        listed = int((self.ivf_offsets[q.probes + 1] - self.ivf_offsets[q.probes]).sum())
        out = np.empty(min(listed, self.n_rows), np.int64)
        mark = self._marks.get()
        use = allow is not None
        n = self.kind.kernels.gather_candidates(self.ivf_offsets, self.ivf_docs, q.probes,
                                                allow if use else postings._NO_ALLOW, use,
                                                mark, out)
        self._marks.put(mark)
        return out[:n]

    def search(self, prepared: MVPrepared, k, params, allow):
        """This segment alone: the collection-wide search over one segment."""
        return self.kind.search_snapshot(prepared, [self], np.zeros(1, np.int64), k, params,
                                         [allow])

    def two_pass(self, q: MVQuery) -> bool:
        """Whether the first pass differs from the final one (else first == final)."""
        return self.res is not None or q.qsig is not None

    def _check_allow(self, allow):
        if allow is None:
            return None
        allow = np.asarray(allow, dtype=bool)
        if allow.shape != (self.n_rows,):
            raise InvalidArgument(f"multivector search: allow mask has shape {allow.shape}, "
                                  f"the segment has {self.n_rows} rows")
        return postings.readonly(np.ascontiguousarray(allow))  # one kernel type (postings.readonly)

    def score(self, prepared: MVPrepared, row_ids):
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        out = np.full((len(prepared.queries), len(rows)), np.nan, np.float32)
        ok = (rows >= 0) & (rows < self.n_rows)
        if ok.any():
            for qi, q in enumerate(prepared.queries):
                if len(q.tokens):
                    out[qi, ok] = self._pass(q, rows[ok], final=True)
                else:
                    out[qi, ok] = 0.0
        return out
