"""Filtered (and tombstoned) dense search planned by the allow-set's size, so recall holds.

A graph or IVF index searched with an allow-set finds allowed rows only among the points its
usual budget visits: at 1% selectivity an HNSW search with efSearch=64 sees well under its
k allowed neighbours. So, per segment and query batch:

- few allowed rows (``<= k``, or ``<= exact_below``, default ``EXACT_BELOW``, and at most
  half the segment: tombstones alone do not make a segment exact-scanned): score them
  exactly with faiss's brute-force kernel (on a gathered copy when they are under 1/16 of the
  segment, else over the stored vectors with the allow bitmap: no copy);
- an IVF index with over half its rows allowed (a segment that lost rows to deletes, a weak
  filter): the unmasked ``nprobe``, nothing widened: the segments share the collection's
  centroids, so the answer is the allowed rows of the lists the query picks, the same however
  rows fell into segments or shards (issue 43);
- otherwise search the ANN index with the allow bitmap, its budget (``efSearch`` for HNSW,
  ``nprobe`` for IVF) divided by the selectivity, and widened 4x at a time for the queries
  that got fewer than min(k, allowed) hits; a query still short at the index's limit is
  scored exactly.

What a search derives from an allow mask (its count, the packed bitmap and faiss selector,
the allowed rows) is kept per segment for masks that are frozen (``index.masks``: the
snapshot's live masks and the filter masks of ``query/filters``), so a repeated filter or a
tombstoned segment costs no O(rows) work per query.
"""
from __future__ import annotations

import math

import faiss
import numpy as np

from polyindex.index.masks import IdentityLRU, is_frozen
from polyindex.index.protocol import empty_result

# Exact scoring of 20,000 rows x 384 d is ~1 ms single-threaded: about what a filtered HNSW
# search with a widened efSearch costs at that size (bench_ann --filtered measures both).
EXACT_BELOW = 20_000
GATHER_FRACTION = 1 / 16  # below this share of the segment, copy the rows; else scan the bitmap
HNSW_DEFAULT_EF = 16
MAX_EF = 16_384
WIDEN = 4


ALLOWED_ENTRIES = 16          # per segment
ALLOWED_BYTES = 64 << 20      # per segment


class Allowed:
    """An allow mask's derived forms over one segment, built on first use."""

    __slots__ = ("mask", "n", "_bits", "_sel", "_rows", "direct")

    def __init__(self, mask: np.ndarray):
        self.mask = mask
        self.n = int(np.count_nonzero(mask))
        self._bits = self._sel = self._rows = None
        self.direct: dict = {}  # ``direct``'s answers, by search parameters

    def selector(self):
        if self._sel is None:
            self._bits = np.packbits(self.mask, bitorder="little")
            self._sel = faiss.IDSelectorBitmap(self._bits)  # refers to _bits: kept with it
        return self._sel

    def rows(self) -> np.ndarray:
        if self._rows is None:
            self._rows = np.flatnonzero(self.mask)
        return self._rows

    def nbytes(self) -> int:  # the mask (held), its bitmap and rows when built
        return len(self.mask) + (len(self.mask) + 7) // 8 + 8 * self.n


def allowed(seg, allow: np.ndarray) -> Allowed:
    """``Allowed`` of a mask over a segment: cached on the segment when the mask is frozen."""
    if not is_frozen(allow):
        return Allowed(allow)
    cache = seg.__dict__.get("_allowed")
    if cache is None:
        cache = seg.__dict__.setdefault("_allowed", IdentityLRU(
            ALLOWED_ENTRIES, ALLOWED_BYTES, size=Allowed.nbytes))
    got = cache.get((allow,))
    if got is None:
        got = Allowed(allow)
        cache.put((allow,), got)
    return got


def search(seg, x: np.ndarray, k: int, params: dict[str, str], allow: np.ndarray):
    n = seg.n_rows
    al = allowed(seg, allow)
    n_allowed = al.n
    if n_allowed == 0:
        return empty_result(len(x), k)
    kwargs = {key: int(v) for key, v in params.items() if key != "exact_below"}
    if n_allowed == n:  # every row allowed (e.g. no tombstones in this segment)
        return seg.faiss_search(x, k, kwargs)
    exact_below = int(params.get("exact_below", EXACT_BELOW))
    # Exact only for selective allow-sets: a segment that merely lost some rows to deletes
    # (over half still allowed) is searched through its index like an intact one.
    if n_allowed <= k or (n_allowed <= exact_below and 2 * n_allowed <= n):
        return exact(seg, x, k, allow, n_allowed, al)
    sel = al.selector()
    kwargs = seg.at_least_k(kwargs, k)  # the unmasked search's budget at this k
    knob, base, limit = _budget(seg.index, kwargs)
    if knob is None:  # a flat index: the selector scan is already exact
        return seg.faiss_search(x, k, {**kwargs, "sel": sel})
    if knob == "nprobe" and 2 * n_allowed > n:
        # An IVF segment that merely lost rows to deletes (or a weak filter): the intact
        # segment's nprobe, no widening. Every segment shares the collection's centroids, so
        # each probes the lists the query picks and the answer is the allowed rows of those
        # lists however rows fell into segments or shards (issue 43); a per-segment budget
        # raised by the segment's own selectivity made it depend on that.
        return seg.faiss_search(x, k, {**kwargs, "sel": sel})
    value = masked_budget(base, limit, n, n_allowed)
    scores, rows = seg.faiss_search(x, k, {**kwargs, knob: value, "sel": sel})
    want = min(k, n_allowed)
    short = np.flatnonzero((rows >= 0).sum(1) < want)
    while len(short) and value < limit:
        value = min(limit, value * WIDEN)
        s2, r2 = seg.faiss_search(np.ascontiguousarray(x[short]), k,
                                  {**kwargs, knob: value, "sel": sel})
        scores[short], rows[short] = s2, r2
        short = short[(r2 >= 0).sum(1) < want]
    if len(short):
        s2, r2 = exact(seg, np.ascontiguousarray(x[short]), k, allow, n_allowed, al)
        scores[short], rows[short] = s2, r2
    return scores, rows


class Direct:
    """What ``search`` does for one (segment, frozen mask) at every k up to ``max_k``, worked
    out once for the vector lane: one faiss call with ``params`` (the allow bitmap and the
    budget ``search`` would use). A query that gets fewer than ``min(k, n)`` hits is
    searched again by ``search`` (which widens), so the answer is ``search``'s, bit for
    bit, without its per-call Python (a new selector parameters object, the wrapper)."""

    __slots__ = ("params", "max_k", "n", "_keep")

    def __init__(self, params, max_k: int, n: int, al: Allowed):
        self.params, self.max_k, self.n = params, max_k, n
        # the selector in params points into the bitmap: both kept (not the Allowed, which
        # keeps this: no cycle for the garbage collector)
        self._keep = (al._sel, al._bits)


def direct(seg, allow: np.ndarray, kwargs: dict, exact_below: int):
    """``"skip"`` (nothing allowed), ``"plain"`` (every row: search without a mask), a
    ``Direct``, or None (exact scoring or an unusual index: call ``search``); kept with the
    mask's ``Allowed`` when the mask is frozen."""
    al = allowed(seg, allow)
    key = (tuple(sorted(kwargs.items())), exact_below)
    got = al.direct.get(key, al)
    if got is al:
        got = _direct(seg, al, kwargs, exact_below)
        if len(al.direct) < 8:
            al.direct[key] = got
    return got


def _direct(seg, al: Allowed, kwargs: dict, exact_below: int):
    n, n_allowed = seg.n_rows, al.n
    if n_allowed == 0:
        return "skip"
    if n_allowed == n:
        return "plain"
    if n_allowed <= exact_below and 2 * n_allowed <= n:
        return None  # search scores these exactly
    knob, base, limit = _budget(seg.index, kwargs)
    if knob is None:  # a flat index: the selector scan is exact at any k
        return Direct(seg._search_parameters({**kwargs, "sel": al.selector()}),
                      n_allowed - 1, n_allowed, al)
    # IVF, over half allowed: the intact budget, as ``search`` (segmentation-independent)
    value = base if knob == "nprobe" and 2 * n_allowed > n else \
        masked_budget(base, limit, n, n_allowed)
    # from k = n_allowed search scores exactly; an HNSW budget grows with k past efSearch
    max_k = min(base, n_allowed - 1) if knob == "efSearch" else n_allowed - 1
    return Direct(seg._search_parameters({**kwargs, knob: value, "sel": al.selector()}),
                  max_k, n_allowed, al)


def masked_budget(base: int, limit: int, n: int, n_allowed: int) -> int:
    """The unmasked search's budget (HNSW: efSearch, already raised to k by
    ``DenseSegment.at_least_k``; IVF: nprobe, which has nothing to do with k) divided by the
    selectivity."""
    return min(limit, max(base, math.ceil(base * n / n_allowed)))


def _budget(index, kwargs: dict) -> tuple[str | None, int, int]:
    """(search knob, its base value, its upper limit) of a faiss index, or (None, 0, 0)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", kwargs.get("nprobe", ivf.nprobe), ivf.nlist
    base = faiss.downcast_index(index)
    if isinstance(base, faiss.IndexHNSW):
        return "efSearch", kwargs.get("efSearch", base.hnsw.efSearch or HNSW_DEFAULT_EF), MAX_EF
    return None, 0, 0


def exact(seg, x: np.ndarray, k: int, allow: np.ndarray, n_allowed: int,
          al: Allowed | None = None):
    """Exact top-k over the allowed rows (scores as the index scores: higher is better).

    faiss's brute-force kernels, not numpy: a (1, d) x (d, n) matmul went through BLAS
    threads and took 26 ms for 2,000 rows on a busy 2-core machine, faiss's SIMD loop 1 ms."""
    n = seg.n_rows
    al = al or allowed(seg, allow)
    matrix = seg.matrix()
    if matrix is None or n_allowed <= n * GATHER_FRACTION:
        rows = al.rows()
        sub = np.ascontiguousarray(matrix[rows] if matrix is not None else seg.vectors(rows),
                                   np.float32)
        scores, ids = _knn(x, sub, min(k, len(rows)), None, seg.metric)
        return _pad(scores, np.where(ids >= 0, rows[np.maximum(ids, 0)], -1), k)
    sel = al.selector()
    scores, ids = _knn(x, np.ascontiguousarray(matrix, np.float32), min(k, n_allowed), sel,
                       seg.metric)
    return _pad(scores, ids, k)


def _knn(x: np.ndarray, m: np.ndarray, k: int, sel, metric: str):
    D = np.empty((len(x), k), np.float32)
    ids = np.empty((len(x), k), np.int64)
    x = np.ascontiguousarray(x, np.float32)
    args = (faiss.swig_ptr(x), faiss.swig_ptr(m), m.shape[1], len(x), len(m), k,
            faiss.swig_ptr(D), faiss.swig_ptr(ids))
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # one thread per query search, as DenseSegment.faiss_search
    try:
        if metric == "l2":
            faiss.knn_L2sqr(*args, None, sel)
            D = -D
        else:
            faiss.knn_inner_product(*args, sel)
    finally:
        faiss.omp_set_num_threads(before)
    return D, ids


def _pad(scores: np.ndarray, rows: np.ndarray, k: int):
    if scores.shape[1] == k:
        return scores, rows
    out_s, out_r = empty_result(len(scores), k)
    out_s[:, :scores.shape[1]], out_r[:, :rows.shape[1]] = scores, rows
    return out_s, out_r
