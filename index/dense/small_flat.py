"""A small plain flat segment answered without faiss's search call: the vector lane's fast
part for the commonest small collection (one compacted ``Flat`` inner-product segment).

A flat search of 82-1,033 vectors is 7-50 us, and faiss's own ``search`` (its Python
wrapper, an OpenMP region, a heap per query) plus the lane's per-query Python around it cost
as much again (issue 38: 0.17-0.53x raw ``IndexFlatIP.search`` without query encoding).
Here a query is one numba call (``scan_top_k``) that scores the rows with faiss's own
``fvec_inner_products_ny`` (the kernel its flat search scores rows with for a single query:
the same float32 bits, checked by a test), called through its address, and keeps the top k
in a heap, writing rows and float64 scores into arrays the caller made; then the ids from an
object array of the segment's ids made once (``SMALL_FLAT`` rows at most: ~70 bytes a row).
The rows scanned are on a cache line (``aligned``). Measured: docs/notes/query-cost-and-memory.md.

Which rows of a run of equal scores straddling the k-th place faiss keeps is its heap's
business, so a query whose (k+1)-th score equals its k-th returns None and the lane searches
as before (as ``shards.Run`` does); ties inside the top k are put in id order in the kernel,
by the segment's id ranks (``Segment.id_ranks``), as ``order_ties`` orders faiss's answer.
"""
from __future__ import annotations

import ctypes
import os

import faiss
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_C = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
_ptr = getattr(_C, "swig_ptr", faiss.swig_ptr)
_ny = getattr(_C, "fvec_inner_products_ny", faiss.fvec_inner_products_ny)
SMALL_FLAT = 1 << 16  # rows; past it the scan dominates and faiss's own search is as good
# faiss's flat search scores vectors of these few dimensions with special kernels whose float32
# bits differ from ``fvec_inner_products_ny``'s (measured: 2, 4, 8, 12 differ, 1-32 and common
# model sizes do not), so their segments keep faiss's search: answers never change with the path
MIN_DIM = 13
ALIGN = 64  # a cache line
_I64, _F64 = np.dtype(np.int64), np.dtype(np.float64)
ALIGN_COPY = 64 << 20  # bytes: the most vectors ``aligned`` copies (44k rows of 384 floats)


@numba.njit(cache=True, nogil=True)
def top_k(scores, v, max_sq, k, ranks, rows, top):
    """The best ``m = min(k, n)`` rows of ``scores`` in (score desc, id asc) order
    (``ranks``: each row's place in the segment's id order, ``Segment.id_ranks``: ties in id
    order, as ``order_ties`` puts them) written to ``rows`` (``m`` long) and their scores as
    float64 to ``top`` (``m`` long: ``Hit.score``'s values, no second
    conversion); returns ``m``, or -1 when the (k+1)-th score equals the k-th (a tie at the
    boundary: which rows faiss keeps there is its heap's choice) and -2 when the query ``v``
    is not one the lane takes (its squared norm, in float32 as faiss's check, not in
    (0, ``max_sq``): NaN, inf, zero, absurd). The outputs are the caller's: a numba call
    that returns arrays pays ~0.4 us to box each, a tenth of a small query."""
    if not _usable(v, max_sq):
        return -2
    return _select(scores, k, ranks, rows, top)


@numba.njit(cache=True, nogil=True)
def scan_top_k(fn, v, xb, d, max_sq, k, ranks, rows, top):
    """``top_k`` of the scores of ``v`` against the ``xb`` rows (``d`` floats each), scored
    here by faiss's ``fvec_inner_products_ny`` at address ``fn`` (``NY_AT``): one native
    call a query, no scores array made in Python, no faiss wrapper call (~0.4 us of a 5 us
    query on 82 rows)."""
    if not _usable(v, max_sq):
        return -2
    n = xb.shape[0] // d
    scores = np.empty(n, np.float32)
    _ny_at(fn, scores, v, xb, d, n)
    return _select(scores, k, ranks, rows, top)


@numba.njit(inline="always")
def _select(scores, k, ranks, rows, top):
    """``top_k``'s selection: the best k + 1 are kept in a min-heap of scores (a row enters
    only when it beats the weakest kept, as faiss's own heap: O(n) compares and O(log k) a
    row that enters), then sorted in place by popping it."""
    n = scores.shape[0]
    m = min(k, n)
    cap = min(k + 1, n)  # one more than k where there is one: a tie at the k-th place shows
    hs = np.empty(cap, np.float32)
    hr = np.empty(cap, np.int64)
    for i in range(cap):
        _push(hs, hr, i, scores[i], i)
    low = hs[0]
    for i in range(cap, n):
        s = scores[i]
        if s > low:
            _sift_down(hs, hr, cap, s, i)
            low = hs[0]
    for end in range(cap - 1, 0, -1):  # pop the weakest to the back: descending order
        s, r = hs[end], hr[end]
        hs[end], hr[end] = hs[0], hr[0]
        _sift_down(hs, hr, end, s, r)
    if m < cap and hs[m] == hs[m - 1]:
        return -1
    _ties_by_rank(hr, hs, m, ranks)
    for i in range(m):
        rows[i] = hr[i]
        top[i] = hs[i]
    return m


@intrinsic
def _ny_at(typingctx, fn, out, x, y, d, n):
    """``fvec_inner_products_ny(out, x, y, d, n)`` (faiss's C++ function, ``void (float*,
    const float*, const float*, size_t, size_t)``) called through its address ``fn``, a
    run-time argument: the compiled kernel names no address, so numba's cache keeps it."""
    def codegen(context, builder, sig, args):
        f32p, i64 = ir.PointerType(ir.FloatType()), ir.IntType(64)
        fnty = ir.FunctionType(ir.VoidType(), [f32p, f32p, f32p, i64, i64])
        call = builder.inttoptr(args[0], fnty.as_pointer())
        data = [context.make_array(t)(context, builder, a).data
                for t, a in zip(sig.args[1:4], args[1:4])]
        builder.call(call, data + [args[4], args[5]])
        return context.get_dummy_value()
    return types.void(types.intp, out, x, y, types.intp, types.intp), codegen


def _ny_address() -> int:
    """The address of faiss's ``fvec_inner_products_ny`` (the function ``_ny`` wraps) in the
    ``libfaiss.so`` beside the faiss package (the faiss-cpu wheel's layout), or 0 where it
    cannot be found (another build): the kernel is then handed scores from ``_ny``."""
    path = os.path.join(os.path.dirname(faiss.__file__), "libfaiss.so")
    try:
        fn = getattr(ctypes.CDLL(path), "_ZN5faiss22fvec_inner_products_nyEPfPKfS2_mm")
    except (OSError, AttributeError):
        return 0
    return ctypes.cast(fn, ctypes.c_void_p).value or 0


NY_AT = _ny_address()


@numba.njit(inline="always")
def _usable(v, max_sq) -> bool:
    """Is ``v``'s squared norm in (0, ``max_sq``)? Summed in float32 over eight running sums
    (one sum's chain of dependent adds took ~0.5 us for 384 floats; a check, not a score)."""
    acc = np.zeros(8, np.float32)
    d = v.shape[0]
    head = d - d % 8
    for i in range(0, head, 8):
        for j in range(8):
            acc[j] += v[i + j] * v[i + j]
    sq = np.float32(0.0)
    for i in range(head, d):
        sq += v[i] * v[i]
    for j in range(8):
        sq += acc[j]
    return sq > 0.0 and sq < max_sq


@numba.njit(inline="always")
def _push(hs, hr, size, s, r):
    """Add (s, r) to the min-heap of the first ``size`` places (it has room)."""
    j = size
    while j > 0:
        p = (j - 1) >> 1
        if not hs[p] > s:
            break
        hs[j], hr[j] = hs[p], hr[p]
        j = p
    hs[j], hr[j] = s, r


@numba.njit(inline="always")
def _sift_down(hs, hr, size, s, r):
    """Put (s, r) at the root of the min-heap of ``size`` places and sift it down."""
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and hs[c + 1] < hs[c]:
            c += 1
        if not hs[c] < s:
            break
        hs[j], hr[j] = hs[c], hr[c]
        j = c
    hs[j], hr[j] = s, r


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
    live: its vectors (a view of faiss's codes, or their aligned copy: ``aligned``) and its
    ids as an object array."""

    __slots__ = ("n", "d", "shape", "xb", "xb_ptr", "ids", "ranks", "index")

    def __init__(self, seg):
        base = faiss.downcast_index(seg.index)
        self.index = base  # keeps the codes ``xb`` views alive
        self.n, self.d = base.ntotal, base.d
        self.shape = (self.d,)  # a query vector's
        self.xb = aligned(faiss.rev_swig_ptr(base.get_xb(), self.n * self.d))
        self.xb_ptr = _ptr(self.xb)
        self.ids = np.array(seg._docs.ids_at(np.arange(self.n, dtype=np.int64)), dtype=object)
        self.ranks = seg._docs.id_ranks()

    def rank(self, v: np.ndarray, k: int, max_sq: float):
        """(ids, their float64 scores, descending; equal scores in id order) of ``v``'s top
        k (``v``: float32, C-contiguous, ``d`` long), or None: a tie at the k-th place, or a
        vector the lane does not take (``top_k``)."""
        n = self.n
        m = k if k < n else n
        rows = np.empty(m, _I64)
        top = np.empty(m, _F64)
        if NY_AT:
            got = scan_top_k(NY_AT, v, self.xb, self.d, max_sq, k, self.ranks, rows, top)
        else:
            scores = np.empty(n, np.float32)
            _ny(_ptr(scores), _ptr(v), self.xb_ptr, self.d, n)
            got = top_k(scores, v, max_sq, k, self.ranks, rows, top)
        if got < 0:
            return None
        return self.ids[rows].tolist(), top


def aligned(xb: np.ndarray) -> np.ndarray:
    """``xb`` itself where it starts on a cache line, else its copy that does (at most
    ``ALIGN_COPY`` bytes; past it, ``xb``). A memory-mapped faiss ``Flat`` file's codes start
    45 bytes into it (the header), not even on a float's boundary: half the SIMD loads of a
    scan then straddle two cache lines, and the row kernel took 1.15-1.2x as long over them
    as over an aligned copy (nfcorpus, lisa: 76 vs 62 us, 166 vs 136 us a query). The copy
    is the anonymous memory an in-memory read would hold; its bits are the codes'."""
    if xb.ctypes.data % ALIGN == 0 or xb.nbytes > ALIGN_COPY:
        return xb
    raw = np.empty(xb.nbytes + ALIGN, np.uint8)
    at = -raw.ctypes.data % ALIGN
    out = raw[at:at + xb.nbytes].view(np.float32)
    out[:] = xb
    out.flags.writeable = False
    return out


def eligible(seg) -> bool:
    """May ``seg`` (its part plain: every row live, no params, no HNSW) use ``SmallFlat``?"""
    from polyindex.index.dense.shards import flat
    base = faiss.downcast_index(seg.index) if flat(seg) else None
    return 0 < seg.n_rows <= SMALL_FLAT and base is not None and base.d >= MIN_DIM and \
        base.metric_type == faiss.METRIC_INNER_PRODUCT and getattr(seg, "_docs", None) is not None
