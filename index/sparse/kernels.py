"""Scoring kernels of the ``sparse`` kind over its posting lists (``index/postings``): the
exhaustive and MaxScore searches, scoring of given rows, and the exact dense re-score."""
from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np
from numba.extending import overload

from polyindex.index.postings import _select, score_rows, scorer_of, term_score

# Kernels of the ``sparse`` kind. Weights are stored as float16 (Arrow halffloat); numba has
# no float16, so they are read as their uint16 bits through ``lut`` (65,536 float32 values,
# exact: ``postings.half_lut``), which keeps the memory-mapped column zero-copy. ``binary``
# postings have no weights (``vals`` is empty) and every match adds the query weight. Every
# kernel adds in the same order and precision (float64 product added to the float32 buffer,
# query terms in the given order), so exhaustive search, pruned search and
# ``sparse_score_rows`` (``postings.score_rows``) agree exactly.

@numba.njit(cache=True, nogil=True)
def sparse_search(offsets, docs, vals, lut, binary, qptr, qterms, qweights, counts,
                  has_allow, allow, scores, seen, touched, out_s, out_i):
    """Exhaustive term-at-a-time sparse dot product top-k; ``counts[q]`` += postings read."""
    k = out_s.shape[1]
    for q in range(len(qptr) - 1):
        n = 0
        for j in range(qptr[q], qptr[q + 1]):
            t = qterms[j]
            w = qweights[j]
            lo, hi = offsets[t], offsets[t + 1]
            counts[q] += hi - lo
            for p in range(lo, hi):
                d = docs[p]
                if has_allow and not allow[d]:
                    continue
                if binary:
                    scores[d] += w
                else:
                    scores[d] += w * lut[vals[p]]
                if seen[d] == 0:
                    seen[d] = 1
                    touched[n] = d
                    n += 1
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])


@numba.njit(cache=True, nogil=True)
def _kth_largest(scores, touched, n, k):
    """The k-th largest score among the ``n`` touched rows (k <= n)."""
    buf = np.empty(n, np.float32)
    for i in range(n):
        buf[i] = scores[touched[i]]
    return np.partition(buf, n - k)[n - k]


@numba.njit(cache=True, nogil=True)
def maxscore_search(offsets, docs, vals, lut, maxv, binary, qptr, qterms, qweights, counts,
                    has_allow, allow, scores, seen, touched, out_s, out_i):
    """Term-at-a-time MaxScore: the same top-k as ``sparse_search``, reading fewer postings.

    Weights are >= 0, so a row's partial score only grows and is a lower bound of its final
    score: the k-th largest partial score ``theta`` is <= the final k-th score. Terms are taken
    in the given order (the kind sorts them by weight). Once the bound of the terms left (sum
    of query weight x the term's largest posting value, ``maxv``) is below ``theta``, no
    unseen row can reach the top k: the remaining terms only update the surviving candidates
    (rows whose partial score plus that bound still reaches ``theta``), by binary search in a
    posting list when that reads fewer entries than a scan. ``theta`` is computed (a
    selection over the touched rows) only when the bound left is below the best partial
    score and has shrunk by a quarter since the last try. Bounds carry a relative rounding margin.
    ``seen``: 0 untouched, 1 touched, 2 live candidate (second phase).
    """
    k = out_s.shape[1]
    for q in range(len(qptr) - 1):
        q0, nt = qptr[q], qptr[q + 1] - qptr[q]
        rest = np.zeros(nt + 1)  # rest[j]: upper bound of what terms j.. can still add
        for j in range(nt - 1, -1, -1):
            t = qterms[q0 + j]
            rest[j] = rest[j + 1] + qweights[q0 + j] * (1.0 if binary else maxv[t])
        n = 0
        best = np.float32(0.0)
        theta = -np.inf
        tried = np.inf
        j = 0
        while j < nt:
            if k > 0 and n >= k and rest[j] * 1.0001 < best and rest[j] < 0.75 * tried:
                tried = rest[j]
                theta = _kth_largest(scores, touched, n, k) * 0.9999
                if rest[j] * 1.0001 < theta:
                    break
            t = qterms[q0 + j]
            w = qweights[q0 + j]
            lo, end = offsets[t], offsets[t + 1]
            counts[q] += end - lo
            for p in range(lo, end):
                d = docs[p]
                if has_allow and not allow[d]:
                    continue
                if binary:
                    scores[d] += w
                else:
                    scores[d] += w * lut[vals[p]]
                if scores[d] > best:
                    best = scores[d]
                if seen[d] == 0:
                    seen[d] = 1
                    touched[n] = d
                    n += 1
            j += 1
        if j < nt:
            cand = np.empty(n, np.int32)
            m = 0
            for i in range(n):
                d = touched[i]
                if scores[d] + rest[j] * 1.0001 >= theta:
                    seen[d] = 2
                    cand[m] = d
                    m += 1
            cand[:m].sort()
            while j < nt and m > 0:
                t = qterms[q0 + j]
                w = qweights[q0 + j]
                lo, end = offsets[t], offsets[t + 1]
                steps = 1
                while (1 << steps) < end - lo + 1:
                    steps += 1
                if m * steps < end - lo:  # binary search each candidate (sorted: moving start)
                    start = lo
                    for c in range(m):
                        d = cand[c]
                        a, b = start, end
                        while a < b:
                            mid = (a + b) >> 1
                            counts[q] += 1
                            if docs[mid] < d:
                                a = mid + 1
                            else:
                                b = mid
                        start = a
                        if a < end and docs[a] == d:
                            if binary:
                                scores[d] += w
                            else:
                                scores[d] += w * lut[vals[a]]
                else:
                    counts[q] += end - lo
                    for p in range(lo, end):
                        d = docs[p]
                        if seen[d] == 2:
                            if binary:
                                scores[d] += w
                            else:
                                scores[d] += w * lut[vals[p]]
                j += 1
                keep = 0
                for c in range(m):  # drop candidates that can no longer reach theta
                    d = cand[c]
                    if scores[d] + rest[j] * 1.0001 >= theta:
                        cand[keep] = d
                        keep += 1
                    else:
                        seen[d] = 1
                m = keep
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])


class SparseRows(NamedTuple):
    """The sparse kind's postings: float16 weights read through ``lut``, or ``binary``."""
    docs: np.ndarray
    vals: np.ndarray
    lut: np.ndarray
    binary: bool


@overload(term_score, jit_options={"cache": True, "nogil": True})
def _sparse_term(how, w, pos, row):
    if scorer_of(how, SparseRows):
        def sparse(how, w, pos, row):
            if how.binary:
                return w
            return w * how.lut[how.vals[pos]]
        return sparse
    return None


@numba.njit(cache=True, nogil=True)
def sparse_score_rows(offsets, docs, vals, lut, binary, n_rows, qptr, qterms, qweights, rows, out):
    """Sparse dot-product scores of given rows (binary search per term); NaN out of range."""
    score_rows(offsets, SparseRows(docs, vals, lut, binary), n_rows, qptr, qterms, qweights,
               rows, out)


@numba.njit(cache=True, nogil=True, fastmath=True)
def rescore_rows(emb, vectors, rows, scores, seen, touched, out_s, out_i):
    """Re-rank candidate rows (``rows``: (nq, R), -1 padded) by the exact inner product of
    their stored embedding with the query vector; top-k (``out_*``: (nq, k)) as the kernels.
    ``fastmath`` lets the 384-term dot products use SIMD (a different summation order than a
    BLAS dot: scores agree to float32 rounding)."""
    d = emb.shape[1]
    k = out_s.shape[1]
    for q in range(rows.shape[0]):
        n = 0
        for j in range(rows.shape[1]):
            r = rows[q, j]
            if r < 0 or seen[r]:
                continue
            acc = np.float32(0.0)
            for t in range(d):
                acc += emb[r, t] * vectors[q, t]
            scores[r] = acc
            seen[r] = 1
            touched[n] = r
            n += 1
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])
