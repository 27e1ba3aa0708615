"""Term-at-a-time MaxScore for long queries: many terms, the same top k as exhaustive scoring.

Block-max MaxScore (``blockmax``) goes document-at-a-time and looks at every essential term
for every candidate row, so a query of 50-135 terms (arguana, cisi, lisa) cost 3-14x plain
term-at-a-time scoring. Here the lists are read term by term, as term-at-a-time does, but in
order of falling bound (a term's bound: its weight x its best block's (tf, length) pair from
``lexical.blocks.arrow``), into float64 accumulators:

1. **OR phase**: each list is scanned whole; every row it has becomes a candidate. After a
   term, ``rest`` (the summed bounds of the terms not read yet) caps what a row not seen so
   far can still score. Once the k-th best partial score ``theta`` (a lower bound of the
   k-th best final score: weights are >= 0) is above ``rest``, no new row can enter the top k.
2. **AND phase**: the remaining (weaker, usually longer) lists only update the candidates:
   a list much longer than the candidates is probed per candidate (blocks skipped by their
   last row, then a search inside one block of 128), a shorter one scanned against the
   candidates' flags; after each term the candidates whose partial score plus ``rest``
   cannot reach ``theta`` are dropped (Moffat and Zobel's "continue" strategy with Turtle
   and Flood's MaxScore bounds).
3. **Exact scores**: the few candidates left near ``theta`` are scored again in query-term
   order, accumulating float32 as ``postings._bm25_add`` does (the same expression, the same
   order), and their top k taken with the same tie rule (the smaller row wins). So the
   answer is term-at-a-time's bit for bit: every comparison that drops a row uses bounds
   widened by a relative ``_SLACK`` against the float64 and float32 rounding, and a drop
   needs the row's bound strictly below ``theta`` (a tie at the k-th place is kept).

**Not chosen by any rule yet** (the text lane runs it only when asked, ``use_blockmax=3``):
measured, it does not pay on the shared collections. They hold 1.4k-8.7k documents, and when
the OR phase may stop (``rest`` under ``theta``, after ~75% of the terms, ~40% of the
postings) 90% of the documents are candidates and ~60% still are after the first drop, so
the AND phase scans the long lists against the flags (nearly term-at-a-time's cost), and
the exact rescoring costs as much again: 2x term-at-a-time at k=10, 3.5-4x at k=100
(arguana, cisi, lisa). On 200k generated Zipf documents with 39-term queries it took 0.94x term-at-a-time's
time at k=10 and 1.18x at k=100. What would pay is Lucene's windowed MaxScore
(per window of rows, the non-essential terms' bounds from the blocks overlapping it, so a
row is probed only where a tighter bound lets it reach ``theta``); not built.
"""
from __future__ import annotations

import numba
import numpy as np

from polyindex.index.docids import BLOCK, block_of, doc_at, find, row_in_block
from polyindex.index.postings import _sift_down, _worse, sort_heap

_SLACK = 1e-5  # relative widening of bounds (float64 partial sums vs float32 final ones)
_PROBE = 8  # a list over this many postings per candidate is probed, not scanned


@numba.njit(cache=True, nogil=True)
def _probe(P, offsets, last, t, cand, n, tfs, doclen, w, k1p1, c1, c2, out, by_row):
    """Add term ``t``'s BM25 part (weight ``w``) of each of the ``n`` ascending candidates
    found in its list, found by a search inside the block that may hold it (blocks skipped
    by their last row), to ``out[row]`` (``by_row``) or ``out[candidate's place]``."""
    boff = P[0]
    start, stop = offsets[t], offsets[t + 1]
    bi = boff[t]
    pos = start
    for c in range(n):
        d = cand[c]
        while bi < boff[t + 1] and last[bi] < d:
            bi += 1
        if bi == boff[t + 1]:
            break
        bs = start + (bi - boff[t]) * BLOCK
        j = find(P, offsets, t, d, max(pos, bs), min(bs + BLOCK, stop))
        pos = j
        if j < stop and doc_at(P, offsets, t, j) == d:
            tf = np.float64(tfs[j])
            out[d if by_row else c] += w * tf * k1p1 / (tf + c1 + c2 * doclen[d])
            pos = j + 1


@numba.njit(cache=True, nogil=True)
def _kth(acc, cand, n, k, heap):
    """The k-th largest of ``acc[cand[:n]]`` (n >= k; ``heap``: scratch of k floats)."""
    for j in range(k):
        heap[j] = acc[cand[j]]
    for q in range(k // 2 - 1, -1, -1):
        _sift_min(heap, q, k)
    for j in range(k, n):
        v = acc[cand[j]]
        if v > heap[0]:
            heap[0] = v
            _sift_min(heap, 0, k)
    return heap[0]


@numba.njit(cache=True, nogil=True, inline="always")
def _sift_min(h, pos, size):
    v = h[pos]
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and h[child + 1] < h[child]:
            child += 1
        if not h[child] < v:
            break
        h[pos] = h[child]
        pos = child
    h[pos] = v


@numba.njit(cache=True, nogil=True)
def _keep(acc, flag, cand, n, rest, theta):
    """Drop the candidates whose partial score plus ``rest`` stays below ``theta`` (their
    accumulators and flags cleared); the others keep their order. Returns how many remain."""
    cut = theta * (1.0 - _SLACK)
    kept = 0
    for j in range(n):
        d = cand[j]
        if (acc[d] + rest) * (1.0 + _SLACK) < cut:
            acc[d] = 0.0
            flag[d] = 0
        else:
            cand[kept] = d
            kept += 1
    return kept


@numba.njit(cache=True, nogil=True)
def _query(offsets, P, tfs, doclen, last, max_tf, min_len, terms, weights, k1p1, c1, c2,
           has_allow, allow, acc, flag, cand, out_s, out_i):
    """One query's top k (``out_s``/``out_i``, best first, padded with -inf / -1).
    ``acc`` (float64), ``flag`` (uint8): zeroed, one per row, left zeroed; ``cand``: int32
    scratch, one per row. Weights must be >= 0."""
    m = len(terms)
    k = len(out_s)
    boff, _, _, lo, wide, shift = P
    ub = np.empty(m, np.float64)
    for i in range(m):
        t = terms[i]
        best = 0.0
        for bi in range(boff[t], boff[t + 1]):  # block metadata only
            tf = np.float64(max_tf[bi])
            best = max(best, tf * k1p1 / (tf + c1 + c2 * min_len[bi]))
        ub[i] = weights[i] * best
    order = np.argsort(-ub)  # strongest first
    rest = np.zeros(m + 1, np.float64)  # rest[p]: the bounds of order[p:] summed
    for p in range(m - 1, -1, -1):
        rest[p] = rest[p + 1] + ub[order[p]]
    heap = np.empty(k, np.float64)
    n = 0
    theta = -np.inf
    best = 0.0
    tried = np.inf
    p = 0
    while p < m:  # the OR phase: whole lists, every row a candidate
        i = order[p]
        t = terms[i]
        w = weights[i]
        for b in range(boff[t], boff[t + 1]):
            s, e, wa, f = block_of(P, offsets, t, b)
            for j in range(s, e):
                d = row_in_block(lo, wide, shift, wa, f, s, j)
                if has_allow and not allow[d]:
                    continue
                tf = np.float64(tfs[j])
                v = acc[d] + w * tf * k1p1 / (tf + c1 + c2 * doclen[d])
                acc[d] = v
                if v > best:
                    best = v
                if flag[d] == 0:
                    flag[d] = 1
                    cand[n] = d
                    n += 1
        p += 1
        # theta costs a pass over the candidates: only when it could beat ``rest``, and
        # again only once ``rest`` has fallen by a fifth
        if p < m and n >= k and rest[p] * (1.0 + _SLACK) < best and rest[p] < 0.8 * tried:
            tried = rest[p]
            theta = _kth(acc, cand, n, k, heap)
            if rest[p] * (1.0 + _SLACK) < theta * (1.0 - _SLACK):
                break  # a row not seen yet scores under the k-th: the AND phase
    if p < m:
        n = _keep(acc, flag, cand, n, rest[p], theta)
    ascending = False  # cand sorted (``_keep`` keeps the order): done for the first probe
    while p < m:  # the AND phase: the candidates only
        i = order[p]
        t = terms[i]
        w = weights[i]
        start, stop = offsets[t], offsets[t + 1]
        if stop - start <= _PROBE * n:  # scan the list against the flags
            for b in range(boff[t], boff[t + 1]):
                s, e, wa, f = block_of(P, offsets, t, b)
                for j in range(s, e):
                    d = row_in_block(lo, wide, shift, wa, f, s, j)
                    if flag[d]:
                        tf = np.float64(tfs[j])
                        acc[d] += w * tf * k1p1 / (tf + c1 + c2 * doclen[d])
        else:  # probe it per candidate (rows ascend: blocks skipped by their last row)
            if not ascending:
                cand[:n].sort()
                ascending = True
            _probe(P, offsets, last, t, cand, n, tfs, doclen, w, k1p1, c1, c2, acc, True)
        p += 1
        if n >= k:
            theta = _kth(acc, cand, n, k, heap)
            n = _keep(acc, flag, cand, n, rest[p], theta)
    # exact scores of the candidates near theta, in query-term order (float32, as
    # ``postings._bm25_add``), then their top k
    if n > k:
        theta = _kth(acc, cand, n, k, heap)
        n = _keep(acc, flag, cand, n, 0.0, theta)
    for c in range(n):  # the buffers left zeroed
        d = cand[c]
        acc[d] = 0.0
        flag[d] = 0
    cand[:n].sort()
    exact = np.zeros(n, np.float32)
    for i in range(m):
        t = terms[i]
        w = weights[i]
        start, stop = offsets[t], offsets[t + 1]
        if stop - start <= _PROBE * n:  # merge the list with the candidates (both ascend)
            c = 0
            for b in range(boff[t], boff[t + 1]):
                s, e, wa, f = block_of(P, offsets, t, b)
                if c == n:
                    break
                if last[b] < cand[c]:
                    continue
                for j in range(s, e):
                    d = row_in_block(lo, wide, shift, wa, f, s, j)
                    while c < n and cand[c] < d:
                        c += 1
                    if c == n:
                        break
                    if cand[c] == d:
                        tf = np.float64(tfs[j])
                        exact[c] += w * tf * k1p1 / (tf + c1 + c2 * doclen[d])
        else:
            _probe(P, offsets, last, t, cand, n, tfs, doclen, w, k1p1, c1, c2, exact, False)
    size = min(k, n)
    for c in range(size):
        out_s[c] = exact[c]
        out_i[c] = cand[c]
    for q in range(size // 2 - 1, -1, -1):
        _sift_down(out_s, out_i, q, size)
    for c in range(size, n):
        if _worse(out_s[0], out_i[0], exact[c], cand[c]):
            out_s[0] = exact[c]
            out_i[0] = cand[c]
            _sift_down(out_s, out_i, 0, size)
    sort_heap(out_s, out_i, size, k)
