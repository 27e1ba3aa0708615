"""Block-max MaxScore: lexical top-k that skips what cannot reach the top (dynamic pruning).

Term-at-a-time scoring (``postings.bm25_search``) reads every posting of every query term, so
a query with one frequent word reads a large part of the postings file, and the pages it
touches stay resident. Here the postings are read document-at-a-time in row order, and:

- **MaxScore** (Turtle and Flood, 1995): the query terms are ordered by their largest possible
  contribution. Once the k-th best score ``theta`` is at least the sum of the bounds of the
  weakest terms, those terms are *non-essential*: a row found only in them cannot enter the
  top k, so their lists are no longer walked, only probed for rows the other terms found.
- **Block max** (Ding and Suel, 2011): each term's postings are cut into blocks of
  ``BLOCK`` postings; per block the file ``lexical.blocks.arrow`` keeps its last row, its
  largest term frequency and its shortest document. A probe first bounds the term's
  contribution by its block's (tf, length) pair and skips the block, without reading its
  postings, when even that cannot lift the row above ``theta``.

The bounds are valid for any BM25 parameters (the term-frequency part grows with tf and
shrinks with the document's length), so one file serves every variant, k1, b and avgdl. The
pruning is safe: the top k (rows, order and float32 score bits) equal term-at-a-time scoring's,
because a kept row's score is summed in query-term order in float32 as there, and a row is
skipped only when its bound, widened by a relative ``_SLACK`` for rounding, is at most
``theta`` (a tie at ``theta`` loses anyway: rows come in ascending order and ties go to the
smaller row).
"""
from __future__ import annotations

import numba
import numpy as np

from polyindex.index.docids import BLOCK, doc_at, find
from polyindex.index import postings
from polyindex.index.postings import _sift_down, _worse, sort_heap
from polyindex.index.ranges import concat_ranges

MIN_POSTINGS = 16_384  # below this a query's term-at-a-time cost is too small to prune
MAX_K = 300  # past this the k-th score rises too late for pruning to pay
_SLACK = 1e-5  # relative widening of every bound before it is compared with theta
_NO_ROW = np.iinfo(np.int32).max


@numba.njit(cache=True, nogil=True)
def build_blocks(offsets, docs, tfs, doclen):
    """(last row, max tf, min document length) of every block, terms in order."""
    n_terms = len(offsets) - 1
    total = 0
    for t in range(n_terms):
        total += (offsets[t + 1] - offsets[t] + BLOCK - 1) // BLOCK
    last = np.empty(total, np.int32)
    max_tf = np.empty(total, np.int32)
    min_len = np.empty(total, np.int32)
    b = 0
    for t in range(n_terms):
        for s in range(offsets[t], offsets[t + 1], BLOCK):
            e = min(s + BLOCK, offsets[t + 1])
            mt = 0
            ml = np.iinfo(np.int32).max
            for j in range(s, e):
                mt = max(mt, tfs[j])
                ml = min(ml, doclen[docs[j]])
            last[b] = docs[e - 1]
            max_tf[b] = mt
            min_len[b] = ml
            b += 1
    return last, max_tf, min_len


@numba.njit(cache=True, nogil=True, inline="always")
def _tf_part(tf, dl, k1p1, c1, c2):
    return tf * k1p1 / (tf + c1 + c2 * dl)


@numba.njit(cache=True, nogil=True)
def _query(offsets, P, tfs, doclen, last, max_tf, min_len, terms, weights,
           k1p1, c1, c2, has_allow, allow, out_s, out_i):
    """One query's top-k (``out_s``/``out_i`` of length k, best first, padded)."""
    m = len(terms)
    k = len(out_s)
    boff, _, _, _, _, _ = P
    ub = np.empty(m, np.float64)
    pos = np.empty(m, np.int64)
    end = np.empty(m, np.int64)
    cur = np.empty(m, np.int64)  # the row at pos (of an essential term), _NO_ROW past its end
    blk = np.empty(m, np.int64)
    for i in range(m):
        t = terms[i]
        pos[i] = offsets[t]
        end[i] = offsets[t + 1]
        cur[i] = doc_at(P, offsets, t, pos[i]) if pos[i] < end[i] else _NO_ROW
        blk[i] = boff[t]
        best = 0.0
        for bi in range(boff[t], boff[t + 1]):  # block metadata only, no postings
            best = max(best, _tf_part(np.float64(max_tf[bi]), min_len[bi], k1p1, c1, c2))
        ub[i] = weights[i] * best * (1.0 + _SLACK)
    order = np.argsort(ub)  # weakest first: the prefix that stops being essential
    prefix = np.empty(m, np.float64)
    acc = 0.0
    for p in range(m):
        acc += ub[order[p]]
        prefix[p] = acc
    contrib = np.zeros(m, np.float64)
    size = 0
    theta = -np.inf
    first = 0  # order[first:] are the essential terms
    while first < m:
        d = _NO_ROW
        for p in range(first, m):
            i = order[p]
            if cur[i] < d:
                d = cur[i]
        if d == _NO_ROW:
            break
        got = 0.0
        skip = has_allow and not allow[d]
        for p in range(first, m):
            i = order[p]
            if cur[i] == d:
                if not skip:
                    c = weights[i] * _tf_part(np.float64(tfs[pos[i]]), doclen[d], k1p1, c1, c2)
                    contrib[i] = c
                    got += c
                pos[i] += 1
                cur[i] = doc_at(P, offsets, terms[i], pos[i]) if pos[i] < end[i] else _NO_ROW
        if skip:
            continue
        full = size == k
        alive = not full or got * (1.0 + _SLACK) + (prefix[first - 1] if first > 0 else 0.0) \
            > theta
        p = first - 1
        while alive and p >= 0:  # non-essential terms, strongest first
            i = order[p]
            t = terms[i]
            more = prefix[p - 1] if p > 0 else 0.0
            bi = blk[i]
            while bi < boff[t + 1] and last[bi] < d:  # metadata only
                bi += 1
            blk[i] = bi
            if bi < boff[t + 1]:
                if full and got * (1.0 + _SLACK) + more + weights[i] * _tf_part(
                        np.float64(max_tf[bi]), min_len[bi], k1p1, c1, c2) \
                        * (1.0 + _SLACK) <= theta:
                    alive = False  # the block's bound: its postings need no reading
                    break
                start = offsets[t] + (bi - boff[t]) * BLOCK
                lo = find(P, offsets, t, d, max(pos[i], start), min(start + BLOCK, end[i]))
                pos[i] = lo
                if lo < end[i] and doc_at(P, offsets, t, lo) == d:
                    c = weights[i] * _tf_part(np.float64(tfs[lo]), doclen[d], k1p1, c1, c2)
                    contrib[i] = c
                    got += c
                    pos[i] = lo + 1
            else:
                pos[i] = end[i]
            if full and got * (1.0 + _SLACK) + more <= theta:
                alive = False
            p -= 1
        s = np.float32(0.0)  # as the term-at-a-time score buffer: float32, query-term order;
        for i in range(m):  # an absent term adds 0.0, which leaves a float32 sum unchanged
            s = np.float32(s + contrib[i])
            contrib[i] = 0.0
        if not alive:
            continue
        if size < k:
            out_s[size] = s
            out_i[size] = d
            size += 1
            if size == k:
                for q in range(k // 2 - 1, -1, -1):
                    _sift_down(out_s, out_i, q, k)
                theta = out_s[0]
        elif _worse(out_s[0], out_i[0], s, d):
            out_s[0] = s
            out_i[0] = d
            _sift_down(out_s, out_i, 0, k)
            theta = out_s[0]
        if size == k:
            while first < m and prefix[first] <= theta:
                first += 1
    if size < k:  # never filled: not a heap yet
        for q in range(size // 2 - 1, -1, -1):
            _sift_down(out_s, out_i, q, size)
    sort_heap(out_s, out_i, size, k)


@numba.njit(cache=True, nogil=True)
def pays(offsets, terms, k) -> bool:
    """Whether pruning is worth it for a query: its largest posting list dwarfs the rest, and
    k is small enough for ``theta`` to rise early.

    A row taken document-at-a-time costs ~2.5x a posting added term-at-a-time, and MaxScore
    still walks every list but the frequent ones; so the other lists must hold under a fifth
    of the postings, and the query enough postings for the bookkeeping not to dominate.
    Measured on 1M generated documents (bench/README.md): such queries took 0.26 instead of
    0.42 ms at k=10, 0.38 instead of 0.42 at k=100, 0.49 instead of 0.45 at k=300 (but 30.5
    against 43.6 ms summed) and 0.77 instead of 0.58 at k=1000."""
    if k > MAX_K:
        return False
    total = 0
    most = 0
    for t in terms:
        n = offsets[t + 1] - offsets[t]
        total += n
        most = max(most, n)
    return total >= MIN_POSTINGS and 5 * (total - most) < total


@numba.njit(cache=True, nogil=True)
def pruned_queries(offsets, qptr, qterms, k):
    """Per query of a batch, whether ``pays`` picks pruning for it."""
    out = np.zeros(len(qptr) - 1, np.bool_)
    for q in range(len(qptr) - 1):
        out[q] = pays(offsets, qterms[qptr[q]:qptr[q + 1]], k)
    return out


@numba.njit(cache=True, nogil=True)
def bm25_search(offsets, P, tfs, doclen, last, max_tf, min_len, qptr, qterms, qweights, k1, b,
                avgdl, has_allow, allow, out_s, out_i):
    """BM25 top-k for a query batch over one segment by block-max MaxScore; the same answer
    as ``postings.bm25_search`` (weights must be >= 0). ``search`` picks which queries."""
    k1p1 = k1 + 1.0
    c1 = k1 * (1.0 - b)
    c2 = k1 * b / avgdl
    for q in range(len(qptr) - 1):
        a, z = qptr[q], qptr[q + 1]
        _query(offsets, P, tfs, doclen, last, max_tf, min_len, qterms[a:z], qweights[a:z],
               k1p1, c1, c2, has_allow, allow, out_s[q], out_i[q])


def search(offsets, P, tfs, doclen, blocks, qptr, qterms, qweights, k1, b, avgdl, pool, k,
           allow, always=False):
    """A batch's top-k: the queries pruning pays for (``pays``; every query with ``always``)
    by block-max MaxScore, the rest term-at-a-time (``postings.bm25_search``), each kernel
    over its own sub-batch (one kernel doing both measured 2x slower on its term-at-a-time
    half)."""
    nq = len(qptr) - 1
    prune = np.ones(nq, np.bool_) if always else pruned_queries(offsets, qptr, qterms, k)
    head, tail = (offsets, P, tfs, doclen), (k1, b, avgdl)
    scores = np.empty((nq, k), np.float32)
    rows = np.empty((nq, k), np.int64)
    for pruned in (True, False):
        at = np.flatnonzero(prune == pruned)
        if len(at) == nq:  # the whole batch (a single query always): no sub-batch to cut
            args = (qptr, qterms, qweights)
        elif len(at):
            flat = concat_ranges(qptr[at], qptr[at + 1])
            sub_ptr = np.concatenate([[0], np.cumsum(qptr[at + 1] - qptr[at])]).astype(np.int64)
            args = (sub_ptr, qterms[flat], qweights[flat])
        else:
            continue
        if pruned:
            s_out = np.empty((len(at), k), np.float32)
            r_out = np.empty((len(at), k), np.int64)
            bm25_search(*head, *blocks, *args, *tail, allow is not None,
                        postings._NO_ALLOW if allow is None else allow, s_out, r_out)
        else:
            s_out, r_out = postings.run_search(postings.bm25_search, head + args + tail, pool,
                                               len(at), k, allow)
        if len(at) == nq:
            return s_out, r_out
        scores[at] = s_out
        rows[at] = r_out
    return scores, rows
