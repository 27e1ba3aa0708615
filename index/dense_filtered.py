"""Filtered (and tombstoned) dense search planned by the allow-set's size, so recall holds.

A graph or IVF index searched with an allow-set finds allowed rows only among the points its
usual budget visits: at 1% selectivity an HNSW search with efSearch=64 sees well under its
k allowed neighbours. So, per segment and query batch:

- few allowed rows (``<= exact_below``, default ``EXACT_BELOW``, or ``<= k``): score them
  exactly (gathered when they are a small fraction of the segment, else a faiss brute-force
  scan of the stored vectors with the allow bitmap: no copy);
- otherwise search the ANN index with the allow bitmap, its budget (``efSearch`` for HNSW,
  ``nprobe`` for IVF) divided by the selectivity, and widened 4x at a time for the queries
  that got fewer than min(k, allowed) hits; a query still short at the index's limit is
  scored exactly.
"""
from __future__ import annotations

import math

import faiss
import numpy as np

from polyindex.index.protocol import empty_result

# Exact scoring of 20,000 rows x 384 d is ~1 ms single-threaded: about what a filtered HNSW
# search with a widened efSearch costs at that size (bench_ann --filtered measures both).
EXACT_BELOW = 20_000
GATHER_FRACTION = 1 / 16  # below this share of the segment, copy the rows; else scan the bitmap
HNSW_DEFAULT_EF = 16
MAX_EF = 16_384
WIDEN = 4


def search(seg, x: np.ndarray, k: int, params: dict[str, str], allow: np.ndarray):
    n = seg.n_rows
    n_allowed = int(np.count_nonzero(allow))
    if n_allowed == 0:
        return empty_result(len(x), k)
    kwargs = {key: int(v) for key, v in params.items() if key != "exact_below"}
    if n_allowed == n:  # every row allowed (e.g. no tombstones in this segment)
        return seg.faiss_search(x, k, kwargs)
    exact_below = int(params.get("exact_below", EXACT_BELOW))
    if n_allowed <= max(exact_below, k):
        return exact(seg, x, k, allow, n_allowed)
    sel = faiss.IDSelectorBitmap(np.packbits(allow, bitorder="little"))
    knob, base, limit = _budget(seg.index, kwargs)
    if knob is None:  # a flat index: the selector scan is already exact
        return seg.faiss_search(x, k, {**kwargs, "sel": sel})
    value = min(limit, max(base, k, math.ceil(base * n / n_allowed)))
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
        s2, r2 = exact(seg, np.ascontiguousarray(x[short]), k, allow, n_allowed)
        scores[short], rows[short] = s2, r2
    return scores, rows


def _budget(index, kwargs: dict) -> tuple[str | None, int, int]:
    """(search knob, its base value, its upper limit) of a faiss index, or (None, 0, 0)."""
    ivf = faiss.try_extract_index_ivf(index)
    if ivf is not None:
        return "nprobe", kwargs.get("nprobe", ivf.nprobe), ivf.nlist
    base = faiss.downcast_index(index)
    if isinstance(base, faiss.IndexHNSW):
        return "efSearch", kwargs.get("efSearch", base.hnsw.efSearch or HNSW_DEFAULT_EF), MAX_EF
    return None, 0, 0


def exact(seg, x: np.ndarray, k: int, allow: np.ndarray, n_allowed: int):
    """Exact top-k over the allowed rows (scores as the index scores: higher is better)."""
    from polyindex.index.dense import exact_scores
    n = seg.n_rows
    matrix = seg.matrix()
    if matrix is None or n_allowed <= n * GATHER_FRACTION:
        rows = np.flatnonzero(allow)
        vecs = matrix[rows] if matrix is not None else seg.vectors(rows)
        s = exact_scores(x, np.asarray(vecs, np.float32), seg.metric).astype(np.float32)
        return _top(s, rows, k)
    kk = min(k, n_allowed)
    D = np.empty((len(x), kk), np.float32)
    ids = np.empty((len(x), kk), np.int64)
    sel = faiss.IDSelectorBitmap(np.packbits(allow, bitorder="little"))
    m = np.ascontiguousarray(matrix, np.float32)
    args = (faiss.swig_ptr(x), faiss.swig_ptr(m), m.shape[1], len(x), n, kk,
            faiss.swig_ptr(D), faiss.swig_ptr(ids))
    if seg.metric == "l2":
        faiss.knn_L2sqr(*args, None, sel)
        D = -D
    else:
        faiss.knn_inner_product(*args, sel)
    return _pad(D, ids, k)


def _top(s: np.ndarray, rows: np.ndarray, k: int):
    kk = min(k, len(rows))
    part = np.argpartition(-s, kk - 1, axis=1)[:, :kk] if kk < len(rows) else \
        np.broadcast_to(np.arange(len(rows)), (len(s), len(rows)))
    ps = np.take_along_axis(s, part, 1)
    order = np.argsort(-ps, axis=1, kind="stable")
    return _pad(np.take_along_axis(ps, order, 1), rows[np.take_along_axis(part, order, 1)], k)


def _pad(scores: np.ndarray, rows: np.ndarray, k: int):
    if scores.shape[1] == k:
        return scores, rows
    out_s, out_r = empty_result(len(scores), k)
    out_s[:, :scores.shape[1]], out_r[:, :rows.shape[1]] = scores, rows
    return out_s, out_r
