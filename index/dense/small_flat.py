"""A small plain flat segment answered without faiss's search call: the vector lane's fast
part for the commonest small collection (one compacted ``Flat`` inner-product segment).

A flat search of 82-1,033 vectors is 7-50 us, and faiss's own ``search`` (its Python
wrapper, an OpenMP region, a heap per query) plus the lane's per-query Python around it cost
as much again (issue 38: 0.17-0.53x raw ``IndexFlatIP.search`` without query encoding).
Here a query is one call of faiss's own ``fvec_inner_products_ny`` (the kernel its flat
search scores rows with for a single query: the same float32 bits, checked by a test), one
numba call selecting the top k in (score desc, row asc) order, and the ids from an object
array of the segment's ids made once (``SMALL_FLAT`` rows at most: ~70 bytes a row).

Which rows of a run of equal scores straddling the k-th place faiss keeps is its heap's
business, so a query whose (k+1)-th score equals its k-th returns None and the lane searches
as before (as ``shards.Run`` does); ties inside the top k are put in id order in the kernel,
by the segment's id ranks (``Segment.id_ranks``), as ``order_ties`` orders faiss's answer.
"""
from __future__ import annotations

import faiss
import numba
import numpy as np

_C = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
_ptr = getattr(_C, "swig_ptr", faiss.swig_ptr)
_ny = getattr(_C, "fvec_inner_products_ny", faiss.fvec_inner_products_ny)
SMALL_FLAT = 1 << 16  # rows; past it the scan dominates and faiss's own search is as good
INSERT_K = 128  # up to this k the top k is kept by insertion in one pass; past it, a partition
# faiss's flat search scores vectors of these few dimensions with special kernels whose float32
# bits differ from ``fvec_inner_products_ny``'s (measured: 2, 4, 8, 12 differ, 1-32 and common
# model sizes do not), so their segments keep faiss's search: answers never change with the path
MIN_DIM = 13


@numba.njit(cache=True, nogil=True)
def top_k(scores, v, max_sq, k, ranks):
    """The best ``min(k, n)`` rows of ``scores`` in (score desc, id asc) order (``ranks``: each
    row's place in the segment's id order, ``Segment.id_ranks``: ties in id order, as
    ``order_ties`` puts them) and their scores, how many, and whether two of them tie
    (ordered already); how many is -1 when the (k+1)-th score
    equals the k-th (a tie at the boundary: which rows faiss keeps there is its heap's
    choice) and -2 when the query ``v`` is not one the lane takes (its squared norm, summed
    in float32 as faiss's check, not in (0, ``max_sq``): NaN, inf, zero, absurd)."""
    sq = np.float32(0.0)
    for i in range(v.shape[0]):
        sq += v[i] * v[i]
    if not (sq > 0.0 and sq < max_sq):
        return np.empty(0, np.int64), np.empty(0, np.float32), -2, False
    n = scores.shape[0]
    m = min(k, n)
    if k <= INSERT_K:  # one pass, the best k + 1 kept sorted (a tie at the k-th place shows)
        cap = min(k + 1, n)
        best_s = np.empty(cap, np.float32)
        best_r = np.empty(cap, np.int64)
        filled = 0
        for i in range(n):
            s = scores[i]
            if filled == cap:
                if not s > best_s[cap - 1]:
                    continue
                j = cap - 1
            else:
                j = filled
                filled += 1
            while j > 0 and s > best_s[j - 1]:  # after its equals: they have lower rows
                best_s[j] = best_s[j - 1]
                best_r[j] = best_r[j - 1]
                j -= 1
            best_s[j] = s
            best_r[j] = i
        if m < n and best_s[m] == best_s[m - 1]:
            return best_r, best_s, -1, False
        tied = _ties_by_rank(best_r, best_s, m, ranks)
        return best_r[:m], best_s[:m], m, tied
    rows = np.empty(m, np.int64)
    if m < n:  # the k-th largest score, then the rows above it and at it, in row order
        kth = np.partition(scores, n - m)[n - m]
        above = 0
        at = 0
        for i in range(n):
            s = scores[i]
            if s > kth:
                above += 1
            elif s == kth:
                at += 1
        if above + at > m:
            return rows, np.empty(0, np.float32), -1, False
        j = 0
        for i in range(n):
            if scores[i] >= kth:
                rows[j] = i
                j += 1
    else:
        for i in range(n):
            rows[i] = i
    sel = scores[rows]
    order = np.argsort(-sel, kind="mergesort")  # stable: equal scores keep row order
    rows = rows[order]
    sel = sel[order]
    tied = _ties_by_rank(rows, sel, m, ranks)
    return rows, sel, m, tied


@numba.njit(cache=True, nogil=True)
def _ties_by_rank(rows, sel, m, ranks):
    """Each run of equal scores among the first ``m`` put in id order (insertion by rank);
    were there any?"""
    tied = False
    i = 0
    while i < m:
        j = i + 1
        while j < m and sel[j] == sel[i]:
            j += 1
        if j - i > 1:
            tied = True
            for a in range(i + 1, j):
                x = rows[a]
                b = a - 1
                while b >= i and ranks[rows[b]] > ranks[x]:
                    rows[b + 1] = rows[b]
                    b -= 1
                rows[b + 1] = x
        i = j
    return tied


class SmallFlat:
    """One plain CPU ``Flat`` inner-product segment of at most ``SMALL_FLAT`` rows, every row
    live: its vectors (a view of faiss's codes, no copy) and its ids as an object array."""

    __slots__ = ("n", "d", "xb", "xb_ptr", "ids", "ranks", "index")

    def __init__(self, seg):
        base = faiss.downcast_index(seg.index)
        self.index = base  # keeps the codes ``xb`` views alive
        self.n, self.d = base.ntotal, base.d
        self.xb = faiss.rev_swig_ptr(base.get_xb(), self.n * self.d)
        self.xb_ptr = _ptr(self.xb)
        self.ids = np.array(seg._docs.ids_at(np.arange(self.n, dtype=np.int64)), dtype=object)
        self.ranks = seg._docs.id_ranks()

    def search(self, v: np.ndarray, k: int, max_sq: float):
        """(descending float32 scores, rows: equal scores in id order) of ``v`` (float32,
        C-contiguous, ``d`` long), or None: a tie at the k-th place, or a vector the lane
        does not take (``top_k``)."""
        scores = np.empty(self.n, np.float32)
        _ny(_ptr(scores), _ptr(v), self.xb_ptr, self.d, self.n)
        rows, top, m, _tied = top_k(scores, v, max_sq, k, self.ranks)
        return None if m < 0 else (top, rows)


def eligible(seg) -> bool:
    """May ``seg`` (its part plain: every row live, no params, no HNSW) use ``SmallFlat``?"""
    from polyindex.index.dense.shards import flat
    base = faiss.downcast_index(seg.index) if flat(seg) else None
    return 0 < seg.n_rows <= SMALL_FLAT and base is not None and base.d >= MIN_DIM and \
        base.metric_type == faiss.METRIC_INNER_PRODUCT and getattr(seg, "_docs", None) is not None
