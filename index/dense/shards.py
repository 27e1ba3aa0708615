"""Runs of plain flat segments searched as one: a faiss ``IndexShards`` over their own
``Flat`` indexes (no copy), one C++ call for the run instead of a faiss call and ~25 us of
Python per segment in the vector lane.

A collection written in many small batches (an embedded ``add()`` per call, before its
background merge) is many small ``Flat`` segments; searched one by one, each cost ~18 us of
a dense query whatever its size (issue 38). ``IndexShards`` (sequential, ``successive_ids``:
a row's key is its run-relative row, as the lane's bases make it) scores every row with the
same kernel each segment's own search uses, so the scores are the same bits.

Which rows a tie run straddling the k-th place keeps is another matter: the per-segment merge
keeps those the segments' own searches list first, in segment order, ``IndexShards``'s heap
the highest keys (inner product). So the run asks
for k + 1; a query whose (k+1)-th score equals its k-th is searched segment by segment and
merged as before (``_one_by_one``): the answer is the per-segment answer, always.
"""
from __future__ import annotations

import faiss
import numpy as np

_C = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
_ptr = getattr(_C, "swig_ptr", faiss.swig_ptr)
_omp_threads = getattr(_C, "omp_get_max_threads", faiss.omp_get_max_threads)
_FLAT = (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2)
MIN_RUN = 2  # a run of one is its segment's own part


def flat(seg) -> bool:
    """Is this segment's index a plain CPU ``Flat`` with every row (a run may hold it)?"""
    from polyindex.cuda.device import torch_kernels
    if seg.presence is not None or seg.on_gpu or torch_kernels(seg.device):
        return False
    base = faiss.downcast_index(seg.index)
    return type(base) in _FLAT and base.ntotal == seg.n_rows and \
        base.metric_type in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2)


class Run:
    """Consecutive segments (their keys contiguous from the run's base), searched at once;
    ``search(x, k)`` answers as the lane's per-segment parts merged would: higher-better
    scores, run-relative keys, -1 padding with -inf."""

    def __init__(self, segments: list, threads: int):
        d = segments[0].index.d
        metric = faiss.downcast_index(segments[0].index).metric_type
        self.l2 = metric == faiss.METRIC_L2
        self.segments = segments
        self.offsets = np.cumsum([0] + [s.n_rows for s in segments[:-1]]).astype(np.int64)
        self.threads = threads
        self.index = faiss.IndexShards(d, False, True)  # sequential, keys run-relative
        self.index.metric_type = metric
        for s in segments:  # the shards are borrowed: ``segments`` keeps them alive
            self.index.add_shard(s.index)

    def search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        nq, kk = len(x), k + 1  # one more: a tie across the k-th place shows
        scores = np.empty((nq, kk), np.float32)
        rows = np.empty((nq, kk), np.int64)
        before = _omp_threads()
        if before != self.threads:
            faiss.omp_set_num_threads(self.threads)
        try:
            self.index.search_c(nq, _ptr(x), kk, _ptr(scores), _ptr(rows), None)
        finally:
            if before != self.threads:
                faiss.omp_set_num_threads(before)
        if self.l2:
            scores = -scores
        if rows[:, -1].min() < 0:  # padding comes last
            scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
        straddle = (rows[:, k] >= 0) & (scores[:, k] == scores[:, k - 1]) if k > 0 else None
        scores, rows = scores[:, :k], rows[:, :k]
        if straddle is not None and straddle.any():
            at = np.flatnonzero(straddle)
            scores = scores.copy()
            rows = rows.copy()
            scores[at], rows[at] = self._one_by_one(np.ascontiguousarray(x[at]), k)
        return scores, rows

    def _one_by_one(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each segment's own search, merged in segment order (the lane's per-part merge)."""
        outs_s, outs_r = [], []
        for seg, off in zip(self.segments, self.offsets):
            s, r = seg.index.search(x, k)
            if self.l2:
                s = -s
            outs_s.append(np.where(r >= 0, s, -np.inf).astype(np.float32))
            outs_r.append(np.where(r >= 0, r + off, -1))
        scores = np.concatenate(outs_s, axis=1)
        keys = np.concatenate(outs_r, axis=1)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, top, 1), np.take_along_axis(keys, top, 1)


def fuse(parts: list, segs: list, threads: int) -> list:
    """The lane's parts with each run of at least ``MIN_RUN`` plain flat segments, keys
    contiguous, replaced by one part searching them as a ``Run``. ``segs[i]``: the segment
    of ``parts[i]`` (None for a part that is not one segment's, e.g. a buffer's stack)."""
    out, run = [], []  # run: (part, seg) of the run being gathered

    def close():
        if len(run) >= MIN_RUN:
            r = Run([s for _, s in run], threads)
            out.append((run[0][0][0], None, None, r.search, None, None))
        else:
            out.extend(p for p, _ in run)
        run.clear()

    for part, seg in zip(parts, segs):
        base, index, sp, general, masked, grow = part
        plain = seg is not None and index is not None and sp is None and general is None \
            and masked is None and grow is None and flat(seg)
        if plain and run and base == run[-1][0][0] + run[-1][1].n_rows and \
                faiss.downcast_index(seg.index).metric_type == \
                faiss.downcast_index(run[0][1].index).metric_type:
            run.append((part, seg))
            continue
        close()
        if plain:
            run.append((part, seg))
        else:
            out.append(part)
    close()
    return out


def runs(segments: list, bases, allow: list, threads: int,
         taken: frozenset = frozenset()) -> dict[int, tuple[int, Run]]:
    """The general pipeline's runs: {first ordinal: (ordinal past it, its ``Run``)} for each
    stretch of at least ``MIN_RUN`` consecutive plain flat segments with nothing to mask
    (``allow`` None) and not in ``taken`` (a buffer's stack)."""
    out: dict[int, tuple[int, Run]] = {}
    n, i = len(segments), 0
    while i < n:
        j = i
        while j < n and j not in taken and allow[j] is None and flat(segments[j]) and (
                j == i or (bases[j] == bases[j - 1] + segments[j - 1].n_rows and
                           faiss.downcast_index(segments[j].index).metric_type ==
                           faiss.downcast_index(segments[i].index).metric_type)):
            j += 1
        if j - i >= MIN_RUN:
            out[i] = (j, Run(segments[i:j], threads))
        i = max(j, i + 1)
    return out
