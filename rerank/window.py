"""numba kernels over a query batch's candidate windows: fusion ranks and scores, dense
cosines, and per-query ranks of feature columns (the general ranker's transform).

Rows are candidates grouped by query: query q's rows are ``qptr[q]:qptr[q + 1]``, best first
in fused order.
"""
from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def query_ranks(a, qptr, out):
    """out[r, j]: r's position, as a fraction of its query's window, when the window is sorted
    by a[:, j] ascending with ties in reverse fused order (a row earlier in the window ranks
    higher); NaN stays NaN (and sorts lowest). Rows of query q are qptr[q]:qptr[q + 1]."""
    for q in range(len(qptr) - 1):
        lo, hi = qptr[q], qptr[q + 1]
        n = hi - lo
        denom = max(n - 1, 1)
        rev = np.empty(n, np.float64)
        for j in range(a.shape[1]):
            for k in range(n):  # reversed rows: a stable sort then puts later rows first on ties
                x = a[hi - 1 - k, j]
                rev[k] = -np.inf if np.isnan(x) else x
            order = np.argsort(rev, kind="mergesort")
            for pos in range(n):
                r = hi - 1 - order[pos]
                out[r, j] = np.nan if np.isnan(a[r, j]) else pos / denom


@numba.njit(cache=True, nogil=True)
def stage_features(cand_keys, qptr, skeys, sscores, rank_col, score_col, rrf_k, rrf, X):
    """One retrieve stage's rank (1-based) and score of each candidate into X (NaN stays where
    the stage did not retrieve it), and its RRF term added to ``rrf``. ``skeys``/``sscores``:
    (nq, k) stage lists, -1 padded; ``rank_col`` < 0: the stage is not a feature, RRF only."""
    for q in range(len(qptr) - 1):
        lo, hi = qptr[q], qptr[q + 1]
        order = np.argsort(cand_keys[lo:hi])
        sorted_keys = cand_keys[lo:hi][order]
        for j in range(skeys.shape[1]):
            key = skeys[q, j]
            if key < 0:
                continue
            pos = np.searchsorted(sorted_keys, key)
            if pos < hi - lo and sorted_keys[pos] == key:
                i = lo + order[pos]
                rrf[i] += 1.0 / (rrf_k + j + 1.0)
                if rank_col >= 0:
                    X[i, rank_col] = j + 1
                    X[i, score_col] = sscores[q, j]


@numba.njit(cache=True, nogil=True)
def dense_features(vecs, qptr, qv, has_vec, prf_docs, cos_col, prf_col, X):
    """Cosine of each candidate with its query's vector (when it has one) and with the
    normalized mean of the query's first ``prf_docs`` candidates with a vector (fused order).
    A candidate without one (a NaN row: pruned) is left as it is."""
    dim = vecs.shape[1]
    cent = np.empty(dim, np.float64)
    for q in range(len(qptr) - 1):
        lo, hi = qptr[q], qptr[q + 1]
        cent[:] = 0.0
        taken = 0
        for i in range(lo, hi):
            if taken == prf_docs:
                break
            if np.isnan(vecs[i, 0]):
                continue
            taken += 1
            for d in range(dim):
                cent[d] += vecs[i, d]
        norm = math.sqrt((cent * cent).sum())
        if norm > 0:
            cent /= norm
        for i in range(lo, hi):
            if np.isnan(vecs[i, 0]):
                continue
            c = 0.0
            p = 0.0
            for d in range(dim):
                c += vecs[i, d] * qv[q, d]
                p += vecs[i, d] * cent[d]
            if has_vec[q]:
                X[i, cos_col] = c
            X[i, prf_col] = p


@numba.njit(cache=True, nogil=True)
def query_moments(a, qptr, z, ratio):
    """Per query and column: z[r, j], a[r, j]'s z-score among its query's non-NaN values (0
    when they are all equal), and ratio[r, j], a[r, j] over their maximum (NaN when that
    maximum is not positive: log-probabilities, similarities below zero). NaN stays NaN."""
    for q in range(len(qptr) - 1):
        lo, hi = qptr[q], qptr[q + 1]
        for j in range(a.shape[1]):
            n = 0
            s = 0.0
            ss = 0.0
            mx = -np.inf
            for r in range(lo, hi):
                x = a[r, j]
                if not np.isnan(x):
                    n += 1
                    s += x
                    ss += x * x
                    mx = max(mx, x)
            mean = s / max(n, 1)
            var = ss / max(n, 1) - mean * mean
            sd = math.sqrt(var) if var > 1e-12 else 0.0
            for r in range(lo, hi):
                x = a[r, j]
                if np.isnan(x):
                    z[r, j] = np.nan
                    ratio[r, j] = np.nan
                else:
                    z[r, j] = (x - mean) / sd if sd > 0 else 0.0
                    ratio[r, j] = x / mx if mx > 0 else np.nan
