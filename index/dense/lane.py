"""The vector lane: a plain nearest-neighbour query (one vector, a profile of one dense stage,
no filter, rerank, explain or stored payload) without the general pipeline's per-query work.
This is the dense kind's direct plan (``DenseKind.direct_plan``, the protocol's
``PlansDirectly``); ``query/vector_lane`` decides which calls may take it and keeps the plans.

A vector database's commonest call, one query at a time, spent ~40 us of Python around a
60-200 us HNSW search in ``pipeline.run`` (checks, a ``Query``, the kind's ``prepare``, the
faiss wrapper, fusion of one list): 0.6-0.8x raw FAISS's queries/s (issue 18). Here what
depends only on the snapshot and the profile (the segments' faiss indexes, search
parameters, bases; for a tombstoned segment its allow bitmap and budget, from
``filtered.direct``; an online buffer's segments as one stack, ``stack``) is
worked out once per snapshot (``plan``; a segment's part is kept on the segment for the next
snapshot), so a query is the vector's check and normalization, one faiss call per segment
(two for a buffer's stack: its graph and the rest) and the hits.

The answer is ``pipeline.run``'s, bit for bit (the same normalization arithmetic, the same
per-segment calls, the same stack search and merge, ties put in id order by the same
function): a test compares the
two. Anything unusual (a bad vector, a zero one, NaN) returns None and the caller takes the
general path, which gives the error its message.
"""
from __future__ import annotations

import faiss
import numpy as np

from polyindex.config import settings
from polyindex.index.dense import filtered as dense_filtered
from polyindex.index.dense import shards as dense_shards
from polyindex.index.dense import small_flat
from polyindex.index.dense import stack as dense_stack
from polyindex.index.masks import freeze
from polyindex.index.protocol import empty_result
from polyindex.index.ranked import RankedPlan
from polyindex.index.ties import order_ties
from polyindex.types import MAX_VECTOR_NORM, Hit

# a little under the general path's float64 limit: what the lane takes, that path takes too
_MAX_SQ = (MAX_VECTOR_NORM * 0.999) ** 2
# faiss's C entry points themselves: its module-level Python shims add ~0.1 us a call, and a
# query makes five of them
_C = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
_ptr = getattr(_C, "swig_ptr", faiss.swig_ptr)
_norm_sq = getattr(_C, "fvec_norm_L2sqr", faiss.fvec_norm_L2sqr)
_norms_sq = getattr(_C, "fvec_norms_L2sqr", faiss.fvec_norms_L2sqr)
_omp_threads = getattr(_C, "omp_get_max_threads", faiss.omp_get_max_threads)
_SMALL = ("small-flat",)  # a segment's ``SmallFlat`` in its ``lane_parts``
_F32 = np.dtype(np.float32)  # a vector's dtype ``is`` it: the fast part's check (~30 ns less)


class Plan(RankedPlan):
    """One snapshot's dense stage, ready to search. ``fparams`` and ``kwargs`` are the
    stage's faiss params and typed search arguments, ``threads`` the kind's
    ``QUERY_THREADS`` (the kind hands them over: this module does not import it back)."""

    takes = "vector"  # what a query is (``query/vector_lane``)
    __slots__ = ("dim", "cosine", "l2", "parts", "kwargs", "threads", "small", "small_base")

    def __init__(self, snapshot, kind, segments, params: dict[str, str],
                 fparams: dict[str, str], kwargs: dict, threads: int):
        self.dim = segments[0].index.d
        self.cosine = kind.metric == "cosine"
        self.l2 = kind.metric == "l2"
        self.threads = threads
        exact_below = int(fparams.get("exact_below", dense_filtered.EXACT_BELOW))
        self.parts = []  # (base,) + a segment's part (``_segment_part``), or a stack's
        segs = []  # the segment of each part (None: a stack's)
        # the placement rule (``_plain_cpu``) reads this setting: a cached part must too
        key = (tuple(sorted(fparams.items())), settings().kernels)
        stacks = snapshot.stacks
        skip_to = 0
        for i, (base, seg, live) in enumerate(zip(snapshot.bases, segments, snapshot.live)):
            if i < skip_to:
                continue
            stacked = self._stacked(snapshot, segments, i, kwargs) if i in stacks else None
            if stacked is not None:  # an online buffer's segments: one stack
                skip_to = i + stacked[0]
                if stacked[1] is not None:
                    self.parts.append(stacked[1])
                    segs.append(None)
                continue
            if seg.n_rows == 0:
                continue
            # A segment's part depends on its live mask and the params only: made once and
            # kept on the segment, so the plan of each new snapshot after a write (~0.3 ms
            # for ~10 segments made afresh) only looks up the segments the write left alone.
            cached = seg.lane_parts.get(key)
            if cached is not None and cached[0] is live:
                part = cached[1]
            else:
                part = _segment_part(seg, live, fparams, kwargs, exact_below)
                if key in seg.lane_parts or len(seg.lane_parts) < 8:
                    seg.lane_parts[key] = (live, part)
            if part is not None:
                self.parts.append((base,) + part)
                segs.append(seg)
        # runs of plain flat segments: one faiss call each (``shards``), not one a segment
        self.parts = dense_shards.fuse(self.parts, segs, threads)
        self.kwargs = kwargs
        # one small plain flat inner-product segment (a compacted small collection): its
        # own scan and ids (``small_flat``), made once per segment
        self.small, self.small_base = None, 0
        if len(self.parts) == 1 and segs[0] is not None and not self.cosine and \
                self.parts[0][2:] == (None, None, None, None):
            seg = segs[0]
            got = seg.lane_parts.get(_SMALL)
            if got is None:  # a plain part: every row live
                got = seg.lane_parts[_SMALL] = (None, small_flat.SmallFlat(seg) if
                                                small_flat.eligible(seg) else None)
            self.small, self.small_base = got[1], self.parts[0][0]

    def _stacked(self, snapshot, segments, i: int, kwargs: dict):
        """(segments covered, the part searching them as one stack, or None when no row is
        live) where the snapshot stacks an online buffer's segments from ``i`` on; else
        None. The part is ``dense_stack.search``, as the general path's."""
        view = snapshot.stacks.get(i)
        if view is None:
            return None
        covered = segments[i:i + view.segments]
        if len(covered) < view.segments or not dense_stack.stackable(covered):
            return None
        prep = dense_stack.cached_prepare(snapshot, i, view, covered,
                                          snapshot.live[i:i + view.segments])
        if prep.empty:
            return view.segments, None
        return view.segments, (snapshot.bases[i], None, None, (
            lambda x, k: dense_stack.search(prep, x, k, kwargs)), None, None)

    def _ranked(self, snapshot, vector, k: int):
        """(ids, scores: float32, or float64 from the small part) of a vector's top k; None:
        the general path answers."""
        small = self.small
        if small is not None and type(vector) is np.ndarray and vector.dtype is _F32 \
                and vector.shape == small.shape and vector.flags.c_contiguous:
            # None: a tie at the k-th place or an unusual vector, searched (or told) below
            got = small.rank(vector, k, _MAX_SQ)
            if got is not None:  # equal scores in id order already; float64 scores
                return got
        if type(vector) is np.ndarray and vector.dtype == np.float32:
            v = vector
        else:
            try:
                v = np.asarray(vector, dtype=np.float32)
            except (TypeError, ValueError):
                return None  # the general path says what is wrong
        if v.ndim != 1 or v.shape[0] != self.dim:
            return None
        if not v.flags.c_contiguous:
            v = np.ascontiguousarray(v)
        # NaN, inf, zero, absurd: the general path says. (faiss's squared norm raises no
        # numpy overflow warning; once it is finite, x * x below cannot overflow.)
        if not 0.0 < _norm_sq(_ptr(v), self.dim) < _MAX_SQ:
            return None
        x = v.reshape(1, -1)
        if self.cosine:  # np.linalg.norm(x, axis=1)'s own arithmetic, as ``prepare``
            # normalizes: the same pairwise sum, so the same bits
            x = x / np.sqrt(np.add.reduce(x * x, axis=1))[:, None]
        scores, keys = self._search(x, k)  # x is C-contiguous: v was, so is a quotient
        listed = scores[0].tolist()
        if len(set(listed)) < len(listed):  # two equal scores (or padding): ids order ties
            keys = order_ties(scores, keys, snapshot.ids_of, snapshot.id_array,
                              snapshot.id_ranks)
        row = keys[0]
        n = len(listed) if row[-1] >= 0 else int(np.count_nonzero(row >= 0))
        return snapshot.ids_of(row[:n] if n < len(listed) else row), scores[0][:n]

    def search_batch(self, snapshot, vectors, k: int) -> list[list[Hit]] | None:
        """``search`` for many vectors: one faiss call per segment for all of them."""
        try:
            x = np.ascontiguousarray(np.asarray(vectors, dtype=np.float32))
        except (TypeError, ValueError):
            return None
        if x.ndim != 2 or x.shape[1] != self.dim or not len(x):
            return None
        sq = np.empty(len(x), np.float32)
        _norms_sq(_ptr(sq), _ptr(x), self.dim, len(x))
        if not np.logical_and(sq > 0, sq < _MAX_SQ).all():
            return None
        if self.cosine:
            x = x / np.sqrt(np.add.reduce(x * x, axis=1))[:, None]
        scores, keys = self._search(np.ascontiguousarray(x), k)
        if scores.shape[1] > 1 and (scores[:, 1:] == scores[:, :-1]).any():
            keys = order_ties(scores, keys, snapshot.ids_of, snapshot.id_array,
                              snapshot.id_ranks)
        valid = keys >= 0  # a prefix of each row: padding comes last
        counts = np.count_nonzero(valid, axis=1).tolist()
        ids = snapshot.ids_of(keys[valid])  # row by row, in one call
        out, at = [], 0
        for n, listed in zip(counts, scores.tolist()):
            out.append(list(map(Hit, ids[at:at + n], listed, range(1, n + 1))))
            at += n
        return out

    def _search(self, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        parts = self.parts
        if len(parts) == 1:
            return self._one(parts[0], x, k)
        if not parts:
            return empty_result(len(x), k)
        outs = [self._one(part, x, k) for part in parts]
        scores = np.concatenate([s for s, _ in outs], axis=1)
        keys = np.concatenate([kk for _, kk in outs], axis=1)
        scores = np.where(keys >= 0, scores, -np.inf)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        return np.take_along_axis(scores, top, 1), np.take_along_axis(keys, top, 1)

    def _one(self, part, x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        base, index, sp, general, masked, grow = part
        if index is None or (masked is not None and k > masked.max_k):
            scores, rows = general(x, k)
        else:
            if grow is not None and k > grow[0]:  # HNSW explores at least k, as its search
                sp = grow[1].params_for(grow[1].at_least_k(self.kwargs, k))
            nq = len(x)
            scores = np.empty((nq, k), np.float32)
            rows = np.empty((nq, k), np.int64)
            before = _omp_threads()
            if before != self.threads:
                faiss.omp_set_num_threads(self.threads)
            try:  # without faiss's Python wrapper (its checks and allocations)
                index.search_c(nq, _ptr(x), k, _ptr(scores), _ptr(rows), sp)
            finally:
                if before != self.threads:
                    faiss.omp_set_num_threads(before)
            if self.l2:
                scores = -scores
            if (rows[0, -1] if nq == 1 else rows[:, -1].min()) < 0:  # padding comes last
                scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
                if masked is not None:  # short of hits: the segment's search widens
                    short = np.flatnonzero((rows >= 0).sum(1) < min(k, masked.n))
                    if len(short):
                        s2, r2 = general(np.ascontiguousarray(x[short]), k)
                        scores[short], rows[short] = s2, r2
        if base:
            rows = np.where(rows >= 0, rows + base, -1)
        return scores, rows


def _segment_part(seg, live, fparams, kwargs, exact_below):
    """A segment's part of a plan, less its base: (faiss index, its parameters, the segment's
    own search, for a tombstoned segment the Direct that says when that search must answer,
    and for an intact HNSW segment (its efSearch, the segment): past that k the parameters
    with efSearch = k, as its own search uses); None when no row can answer."""
    general = None
    if live is not None:
        freeze(live)
        general = (lambda x, k, seg=seg, live=live: seg.search(x, k, fparams, live))
    if seg.presence is not None or not _plain_cpu(seg):  # the segment's own search
        return (None, None, general or (
            lambda x, k, seg=seg: seg.search(x, k, fparams, None)), None, None)
    how = "plain" if live is None else dense_filtered.direct(seg, live, kwargs, exact_below)
    if how == "skip":
        return None
    if how == "plain":
        grow = None if seg.hnsw_ef is None else (kwargs.get("efSearch", seg.hnsw_ef), seg)
        return (seg.index, seg.params_for(kwargs), None, None, grow)
    if how is None:
        return (None, None, general, None, None)
    return (seg.index, how.params, general, how, None)  # tombstones: one direct call


def _plain_cpu(seg) -> bool:
    from polyindex.cuda.device import torch_kernels
    return not seg.on_gpu and not torch_kernels(seg.device)
