"""Searching the ``tree`` kind: coarse-to-fine, best-first with a node budget, and path-sum.

Node similarity ``sim(q, n)`` (``mode``): ``dot`` = ``q . mean_n`` (a document: ``q . x``),
``cos`` = the cosine of q and the mean (a document: of q and x), or
``gauss`` = the query's log-likelihood under the node's diagonal Gaussian, per dimension:
``-1/2 * mean_i((q_i - mean_i)^2 / v_i + log v_i)`` (a document: its vector as the mean, its
leaf's variances). Gaussian scores are translation invariant, so a large component common to
every vector (anisotropic embeddings) cancels, where a dot product does not.

A step from a node to one of its children scores ``u(child) - temp * log sum_siblings
exp(u / temp)`` with ``u = sim + temp * log(count)`` (the child's prior is its share of the
documents, as COBWEB weighs concepts by P(C)), and from a leaf to one of its documents the same
with ``u = sim``: the log-probability of choosing that child, in similarity units. With the
priors a query that likes every document alike gives every document the same path score, and
under ``dot`` (a node's similarity is the mean of its documents') the path score is the flat
score less each node's spread of similarities (and tends to the flat score as temp grows).
The **path score** of a document is the sum of those steps from the root down to it; it never
grows along a path, so best-first search over path scores is exact:
the first k documents it pops are the top k (``rank=path``). ``rank=best`` walks the same
best-first order but ranks the documents of the leaves it opens by ``sim(q, doc)``; with an
unlimited budget it scores every document, i.e. flat search. ``budget`` caps expanded nodes;
the search goes on past it only until it holds k documents.

``score_rows`` recomputes either score for given rows with the same arithmetic in the same
order as the search (identical floats), memoizing per-node terms per query.
"""
from __future__ import annotations

import numba as nb
import numpy as np

DOT, GAUSS, COS = 0, 1, 2


@nb.njit(cache=True, inline="always")
def _dot(a, b):
    acc = 0.0
    for i in range(b.shape[0]):
        acc += np.float64(a[i]) * b[i]
    return acc


@nb.njit(cache=True)
def _sim_node(q, q2, n, mode, mean, w, mw, cst):
    if mode == DOT:
        return _dot(mean[n], q)
    if mode == COS:  # cst holds 1 / ||mean||
        return _dot(mean[n], q) * cst[n]
    return -0.5 * (_dot(w[n], q2) - 2.0 * _dot(mw[n], q) + cst[n]) / q.shape[0]


@nb.njit(cache=True)
def _sim_doc(q, r, leaf, mode, X, w, logdet):
    if mode == DOT:
        return _dot(X[r], q)
    if mode == COS:  # logdet holds 1 / ||x|| per row
        return _dot(X[r], q) * logdet[r]
    acc = 0.0
    wl = w[leaf]
    x = X[r]
    for i in range(q.shape[0]):
        t = q[i] - x[i]
        acc += t * t * wl[i]
    return -0.5 * (acc + logdet[leaf]) / q.shape[0]


@nb.njit(cache=True)
def _lse(buf, k, temp):
    m = -np.inf
    for j in range(k):
        m = max(m, buf[j])
    acc = 0.0
    for j in range(k):
        acc += np.exp((buf[j] - m) / temp)
    return m + temp * np.log(acc)


@nb.njit(cache=True)
def _children_lse(q, q2, p, buf, temp, mode, child_start, n_child, logn, mean, w, mw, cst):
    """Fills buf with each child's ``sim + temp * log(count)`` (similarity plus the log of the
    child's prior, its share of the documents) and returns their temp-logsumexp."""
    c0 = child_start[p]
    k = n_child[p]
    for j in range(k):
        buf[j] = _sim_node(q, q2, c0 + j, mode, mean, w, mw, cst) + temp * logn[c0 + j]
    return _lse(buf, k, temp)


@nb.njit(cache=True)
def _docs_lse(q, p, buf, temp, mode, doc_start, doc_end, docs, X, w, logdet):
    a = doc_start[p]
    k = doc_end[p] - a
    for j in range(k):
        buf[j] = _sim_doc(q, docs[a + j], p, mode, X, w, logdet)
    return _lse(buf, k, temp)


# ------------------------------------------------------------------------------ heap

@nb.njit(cache=True)
def _push(keys, items, size, key, item):
    i = size
    keys[i] = key
    items[i] = item
    while i > 0:
        up = (i - 1) >> 1
        if keys[up] >= keys[i]:
            break
        keys[up], keys[i] = keys[i], keys[up]
        items[up], items[i] = items[i], items[up]
        i = up
    return size + 1


@nb.njit(cache=True)
def _pop(keys, items, size):
    size -= 1
    keys[0] = keys[size]
    items[0] = items[size]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= size:
            break
        big = left
        if left + 1 < size and keys[left + 1] > keys[left]:
            big = left + 1
        if keys[i] >= keys[big]:
            break
        keys[big], keys[i] = keys[i], keys[big]
        items[big], items[i] = items[i], items[big]
        i = big
    return size


# ---------------------------------------------------------------------------- search

@nb.njit(cache=True)
def search(Q, k, budget, path_rank, temp, mode, allow, child_start, n_child, logn, doc_start,
           doc_end, docs, mean, w, mw, cst, logdet, X, max_fan, out_s, out_r, expanded):
    """Best-first search of every query of ``Q``; ``budget`` <= 0 is unlimited. Fills
    ``out_s``/``out_r`` (nq, k) (-inf/-1 padded) and ``expanded`` (nodes opened per query)."""
    n_nodes = n_child.shape[0]
    n_rows = docs.shape[0]
    has_allow = allow.shape[0] > 0
    cap = n_nodes + (n_rows if path_rank else 0)  # a budget may be overrun to find k docs
    keys = np.empty(cap)
    items = np.empty(cap, np.int64)
    buf = np.empty(max_fan)
    ccap = n_rows
    cand_s = np.empty(ccap)
    cand_r = np.empty(ccap, np.int64)
    for qi in range(Q.shape[0]):
        q = Q[qi]
        q2 = q * q
        size = _push(keys, items, 0, 0.0, 0)
        opened = 0
        found = 0
        n_cand = 0
        on_heap = 0  # documents waiting on the frontier (path rank)
        while size > 0:
            key = keys[0]
            item = items[0]
            if item < 0:  # a document (path rank): popped in final order
                size = _pop(keys, items, size)
                on_heap -= 1
                out_s[qi, found] = key
                out_r[qi, found] = -item - 1
                found += 1
                if found == k:
                    break
                continue
            if budget > 0 and opened >= budget and (found + on_heap >= k or n_cand >= k):
                break  # budget spent and k documents in hand
            size = _pop(keys, items, size)
            opened += 1
            nd = item
            if n_child[nd] > 0:
                lse = _children_lse(q, q2, nd, buf, temp, mode, child_start, n_child, logn,
                                    mean, w, mw, cst)
                c0 = child_start[nd]
                for j in range(n_child[nd]):
                    size = _push(keys, items, size, key + (buf[j] - lse), c0 + j)
            elif path_rank:
                lse = _docs_lse(q, nd, buf, temp, mode, doc_start, doc_end, docs, X, w,
                                logdet)
                a = doc_start[nd]
                for j in range(doc_end[nd] - a):
                    r = docs[a + j]
                    if has_allow and not allow[r]:
                        continue
                    size = _push(keys, items, size, key + (buf[j] - lse), -r - 1)
                    on_heap += 1
            else:
                for j in range(doc_start[nd], doc_end[nd]):
                    r = docs[j]
                    if has_allow and not allow[r]:
                        continue
                    cand_s[n_cand] = _sim_doc(q, r, nd, mode, X, w, logdet)
                    cand_r[n_cand] = r
                    n_cand += 1
        expanded[qi] = opened
        if path_rank:  # budget spent: the documents already on the frontier, best first
            while found < k and size > 0:
                key = keys[0]
                item = items[0]
                size = _pop(keys, items, size)
                if item < 0:
                    out_s[qi, found] = key
                    out_r[qi, found] = -item - 1
                    found += 1
        else:
            order = np.argsort(-cand_s[:n_cand])
            for j in range(min(k, n_cand)):
                out_s[qi, j] = cand_s[order[j]]
                out_r[qi, j] = cand_r[order[j]]


@nb.njit(cache=True)
def score_rows(Q, rows, path_rank, temp, mode, parent, leaf_of, child_start, n_child, logn,
               doc_start, doc_end, docs, mean, w, mw, cst, logdet, X, max_fan, max_depth, out):
    """The ranking rule's score of given rows (NaN for rows out of range), as ``search``."""
    n_nodes = n_child.shape[0]
    n_rows = leaf_of.shape[0]
    buf = np.empty(max_fan)
    path = np.empty(max_depth + 1, np.int64)
    for qi in range(Q.shape[0]):
        q = Q[qi]
        q2 = q * q
        sims = np.full(n_nodes, np.nan)
        lses = np.full(n_nodes, np.nan)
        for j in range(rows.shape[0]):
            r = rows[j]
            if r < 0 or r >= n_rows:
                out[qi, j] = np.nan
                continue
            leaf = leaf_of[r]
            if not path_rank:
                out[qi, j] = _sim_doc(q, r, leaf, mode, X, w, logdet)
                continue
            depth = 0
            nd = leaf
            while nd != 0:
                path[depth] = nd
                depth += 1
                nd = parent[nd]
            total = 0.0
            for lvl in range(depth - 1, -1, -1):
                c = path[lvl]
                p = parent[c]
                if np.isnan(lses[p]):
                    lses[p] = _children_lse(q, q2, p, buf, temp, mode, child_start, n_child,
                                            logn, mean, w, mw, cst)
                    c0 = child_start[p]
                    for t in range(n_child[p]):
                        sims[c0 + t] = buf[t]
                total += sims[c] - lses[p]
            if np.isnan(lses[leaf]):  # a leaf has no children: the slot holds its documents'
                lses[leaf] = _docs_lse(q, leaf, buf, temp, mode, doc_start, doc_end, docs, X,
                                       w, logdet)
            out[qi, j] = total + (_sim_doc(q, r, leaf, mode, X, w, logdet) - lses[leaf])
