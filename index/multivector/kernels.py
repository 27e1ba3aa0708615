"""Scoring kernels of the multivector kind (numba, CPU), behind a small backend seam.

Documents are CSR over tokens: document r's tokens are ``offsets[r]:offsets[r+1]`` of ``codes``
(centroid ids) and ``res`` (PQ residual codes, (n_tokens, M) uint8). A query is its tokens'
tables, transposed so the values for one code are contiguous over query tokens:

- ``lut_t`` (K, nqt): ``q_t . centroid`` (first pass: MaxSim over the codes alone);
- ``pq_t`` (M, 256, nqt): ``q_t`` sub-vector . PQ sub-centroid (final pass: ``q_t . (c + r)``
  summed from M lookups, which equals decoding the token and taking the dot product, times
  the token's stored 1 / |c + r| as float16 bits);
- ``qsig`` (nqt,) uint64 and ``csig`` (K,) uint64: b-bit signatures (binary first pass, the
  Hamming similarity ``(b - 2 * popcount(q ^ c)) / b``).

Every kernel is MaxSim: per document, the sum over query tokens of the best token's score;
a document without tokens scores 0. Kernels run in parallel over blocks of candidates.
``backend(device)`` is the seam: the CPU kernels here, or ``polyindex.cuda.multivector.Kernels``
(torch, the same functions; on a cuda placement, or on a CPU with ``POLYINDEX_KERNELS=torch``).
"""
from __future__ import annotations

import contextlib
import functools
import threading

import numba
import numpy as np
from numba import prange

BLOCK = 64  # candidates per parallel task (one scratch row per task)
# Fewer candidates than this run on the calling thread: one query's few hundred candidates
# cost 2-6 ms on one thread, 25 ms of CPU with the pool woken on 2 busy cores (issue 39)
PARALLEL_MIN = 4096


@contextlib.contextmanager
def threads_for(n_candidates: int):
    """numba's pool for a kernel call over ``n_candidates``, or only the calling thread for a
    small one (``numba.set_num_threads`` is per calling thread; scores do not change)."""
    if n_candidates >= PARALLEL_MIN:
        yield
        return
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


@numba.njit(cache=True, inline="always")
def _popcount64(x):
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@numba.njit(cache=True, parallel=True, fastmath=True, nogil=True)
def first_pass_lut(lut_t, offsets, codes, cand, out):
    """out[i] = sum_t max_{tokens of cand[i]} lut_t[code, t]."""
    nqt = lut_t.shape[1]
    nb = (len(cand) + BLOCK - 1) // BLOCK
    for b in prange(nb):
        best = np.empty(nqt, np.float32)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            r = cand[i]
            s, e = offsets[r], offsets[r + 1]
            if e <= s:
                out[i] = 0.0
                continue
            for t in range(nqt):
                best[t] = -np.inf
            for p in range(s, e):
                row = lut_t[codes[p]]
                for t in range(nqt):
                    best[t] = max(best[t], row[t])
            acc = np.float32(0.0)
            for t in range(nqt):
                acc += best[t]
            out[i] = acc


@numba.njit(cache=True, parallel=True, fastmath=True, nogil=True)
def first_pass_hamming(qsig, csig, nbits, offsets, codes, cand, out):
    """out[i] = sum_t max_{tokens} (nbits - 2 * hamming(qsig[t], csig[code])) / nbits."""
    nqt = len(qsig)
    nb = (len(cand) + BLOCK - 1) // BLOCK
    inv = np.float32(1.0) / np.float32(nbits)
    for b in prange(nb):
        best = np.empty(nqt, np.int64)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            r = cand[i]
            s, e = offsets[r], offsets[r + 1]
            if e <= s:
                out[i] = 0.0
                continue
            for t in range(nqt):
                best[t] = -(1 << 30)
            for p in range(s, e):
                c = csig[codes[p]]
                for t in range(nqt):
                    sim = nbits - 2 * np.int64(_popcount64(qsig[t] ^ c))
                    if sim > best[t]:
                        best[t] = sim
            acc = np.int64(0)
            for t in range(nqt):
                acc += best[t]
            out[i] = np.float32(acc) * inv


# Query tokens at most this many: the final pass keeps the query's columns in registers (4 or
# 8, below); longer queries go WIDE columns at a time (``_final_doc_wide``)
REGISTER_COLUMNS = 8


@numba.njit(cache=True, nogil=True)
def _final_doc_registers(lut, pq, n, offsets, codes, res, scale, half, r, best):
    """Final-pass MaxSim of document ``r`` for a query of ``n`` <= 8 tokens: per stored token
    the 8 columns' sums ``lut[code] + sum_m pq[m, res[m]]`` stay in registers through the M
    lookups (one load and add per column and sub-quantizer, no store), instead of an
    accumulator row in memory. Columns past ``n`` read column ``n - 1`` again (any table
    width >= n works, so one query's own table and a batch's wider stack give the same
    bits) and are not summed. Not fastmath: reassociation lets LLVM turn the M loop into
    gathers, 2x slower."""
    s, e = offsets[r], offsets[r + 1]
    if e <= s:
        return np.float32(0.0)
    m_sub = pq.shape[0]
    last = n - 1
    x1, x2, x3 = min(1, last), min(2, last), min(3, last)
    x4, x5, x6, x7 = min(4, last), min(5, last), min(6, last), min(7, last)
    ninf = np.float32(-np.inf)
    b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = ninf
    for p in range(s, e):
        row = lut[codes[p]]
        a0, a1, a2, a3 = row[0], row[x1], row[x2], row[x3]
        a4, a5, a6, a7 = row[x4], row[x5], row[x6], row[x7]
        for m in range(m_sub):
            tab = pq[m, res[p, m]]
            a0 += tab[0]
            a1 += tab[x1]
            a2 += tab[x2]
            a3 += tab[x3]
            a4 += tab[x4]
            a5 += tab[x5]
            a6 += tab[x6]
            a7 += tab[x7]
        f = half[scale[p]] if len(scale) > 0 else np.float32(1.0)
        b0, b1, b2, b3 = max(b0, a0 * f), max(b1, a1 * f), max(b2, a2 * f), max(b3, a3 * f)
        b4, b5, b6, b7 = max(b4, a4 * f), max(b5, a5 * f), max(b6, a6 * f), max(b7, a7 * f)
    best[0], best[1], best[2], best[3] = b0, b1, b2, b3
    best[4], best[5], best[6], best[7] = b4, b5, b6, b7
    tot = np.float32(0.0)
    for t in range(n):
        tot += best[t]
    return tot


@numba.njit(cache=True, nogil=True)
def _final_doc_registers4(lut, pq, n, offsets, codes, res, scale, half, r, best):
    """``_final_doc_registers`` for a query of ``n`` <= 4 tokens: 4 register columns, half
    the loads and adds of 8 (nfcorpus's queries have 3.6 tokens on average)."""
    s, e = offsets[r], offsets[r + 1]
    if e <= s:
        return np.float32(0.0)
    m_sub = pq.shape[0]
    last = n - 1
    x1, x2, x3 = min(1, last), min(2, last), min(3, last)
    ninf = np.float32(-np.inf)
    b0 = b1 = b2 = b3 = ninf
    for p in range(s, e):
        row = lut[codes[p]]
        a0, a1, a2, a3 = row[0], row[x1], row[x2], row[x3]
        for m in range(m_sub):
            tab = pq[m, res[p, m]]
            a0 += tab[0]
            a1 += tab[x1]
            a2 += tab[x2]
            a3 += tab[x3]
        f = half[scale[p]] if len(scale) > 0 else np.float32(1.0)
        b0, b1, b2, b3 = max(b0, a0 * f), max(b1, a1 * f), max(b2, a2 * f), max(b3, a3 * f)
    best[0], best[1], best[2], best[3] = b0, b1, b2, b3
    tot = np.float32(0.0)
    for t in range(n):
        tot += best[t]
    return tot


# Longer queries: the final pass takes their columns WIDE at a time, each chunk's sums in 16
# scalar locals that LLVM's SLP vectorizer packs into vector registers (``_slp``): 2-5x faster
# a document than the loop over columns it replaces, which kept its sums in memory
WIDE = 16


@numba.njit(cache=True, nogil=True)
def _final_doc_wide(lut, pq, n, offsets, codes, res, scale, half, r, best):
    """Final-pass MaxSim of document ``r`` for a query of ``n`` > 8 tokens, ``WIDE`` columns
    at a time (the tables' width must be a multiple of ``WIDE``: ``_widened``; columns past
    ``n`` are computed and not summed). The register paths' sums, in the same order."""
    s, e = offsets[r], offsets[r + 1]
    if e <= s:
        return np.float32(0.0)
    m_sub = pq.shape[0]
    ninf = np.float32(-np.inf)
    for c in range((n + WIDE - 1) // WIDE):
        o = c * WIDE
        b0 = b1 = b2 = b3 = b4 = b5 = b6 = b7 = ninf
        b8 = b9 = b10 = b11 = b12 = b13 = b14 = b15 = ninf
        for p in range(s, e):
            row = lut[codes[p]]
            a0, a1, a2, a3 = row[o], row[o + 1], row[o + 2], row[o + 3]
            a4, a5, a6, a7 = row[o + 4], row[o + 5], row[o + 6], row[o + 7]
            a8, a9, a10, a11 = row[o + 8], row[o + 9], row[o + 10], row[o + 11]
            a12, a13, a14, a15 = row[o + 12], row[o + 13], row[o + 14], row[o + 15]
            for m in range(m_sub):
                tab = pq[m, res[p, m]]
                a0 += tab[o]
                a1 += tab[o + 1]
                a2 += tab[o + 2]
                a3 += tab[o + 3]
                a4 += tab[o + 4]
                a5 += tab[o + 5]
                a6 += tab[o + 6]
                a7 += tab[o + 7]
                a8 += tab[o + 8]
                a9 += tab[o + 9]
                a10 += tab[o + 10]
                a11 += tab[o + 11]
                a12 += tab[o + 12]
                a13 += tab[o + 13]
                a14 += tab[o + 14]
                a15 += tab[o + 15]
            f = half[scale[p]] if len(scale) > 0 else np.float32(1.0)
            b0, b1, b2, b3 = max(b0, a0 * f), max(b1, a1 * f), max(b2, a2 * f), max(b3, a3 * f)
            b4, b5, b6, b7 = max(b4, a4 * f), max(b5, a5 * f), max(b6, a6 * f), max(b7, a7 * f)
            b8, b9 = max(b8, a8 * f), max(b9, a9 * f)
            b10, b11 = max(b10, a10 * f), max(b11, a11 * f)
            b12, b13 = max(b12, a12 * f), max(b13, a13 * f)
            b14, b15 = max(b14, a14 * f), max(b15, a15 * f)
        best[o], best[o + 1], best[o + 2], best[o + 3] = b0, b1, b2, b3
        best[o + 4], best[o + 5], best[o + 6], best[o + 7] = b4, b5, b6, b7
        best[o + 8], best[o + 9], best[o + 10], best[o + 11] = b8, b9, b10, b11
        best[o + 12], best[o + 13], best[o + 14], best[o + 15] = b12, b13, b14, b15
    tot = np.float32(0.0)
    for t in range(n):
        tot += best[t]
    return tot


@numba.njit(cache=True, nogil=True)
def _final_doc(lut, pq, n, offsets, codes, res, scale, half, r, best):
    """One document's final-pass MaxSim (``final_pass_pq``): the same function of the query's
    first ``n`` columns for one query's call and a batch's, so their scores are identical."""
    if n == 0:
        return np.float32(0.0)
    if n <= 4:
        return _final_doc_registers4(lut, pq, n, offsets, codes, res, scale, half, r, best)
    if n <= REGISTER_COLUMNS:
        return _final_doc_registers(lut, pq, n, offsets, codes, res, scale, half, r, best)
    return _final_doc_wide(lut, pq, n, offsets, codes, res, scale, half, r, best)


@numba.njit(cache=True, parallel=True, nogil=True)
def _final_pass_pq(lut_t, pq_t, nqt, offsets, codes, res, scale, half, cand, out):
    nb = (len(cand) + BLOCK - 1) // BLOCK
    for b in prange(nb):
        best = np.empty(max(lut_t.shape[1], REGISTER_COLUMNS), np.float32)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            out[i] = _final_doc(lut_t, pq_t, nqt, offsets, codes, res, scale, half, cand[i],
                                best)


def final_pass_pq(lut_t, pq_t, offsets, codes, res, scale, half, cand, out):
    """out[i] = sum_t max_{tokens} q_t . (centroid[code] + PQ_decode(res[token])) * s[token],
    where s = half[scale[token]] (float16 bits, the codec's per-token scale) when ``scale`` is
    not empty."""
    nqt = lut_t.shape[1]
    if nqt > REGISTER_COLUMNS:
        lut_t, pq_t = _widened(lut_t), _widened(pq_t)
    _slp(_final_pass_pq, lut_t, pq_t, nqt, offsets, codes, res, scale, half, cand, out)


def _widened(t: np.ndarray) -> np.ndarray:
    """``t`` (..., T) with zero columns up to a multiple of ``WIDE`` (``_final_doc_wide``)."""
    w = t.shape[-1]
    if w % WIDE == 0:
        return t
    out = np.zeros(t.shape[:-1] + (w + WIDE - w % WIDE,), np.float32)
    out[..., :w] = t
    return out


_SLP_LOCK = threading.Lock()


def _slp(kernel, *args):
    """``kernel(*args)``, compiled (its first call with these argument types) with LLVM's SLP
    vectorizer on: numba leaves it off by default, and the final pass's WIDE path is written
    for it (its scalar locals become vector lanes). It is numba's global switch,
    flipped only while this compile holds the lock."""
    sig = tuple(numba.typeof(a) for a in args)
    if sig not in kernel.overloads:
        with _SLP_LOCK:
            before = numba.config.SLP_VECTORIZE
            numba.config.SLP_VECTORIZE = True
            try:
                kernel.compile(sig)
            finally:
                numba.config.SLP_VECTORIZE = before
    kernel(*args)


@numba.njit(cache=True, parallel=True, fastmath=True, nogil=True)
def first_pass_lut_batch(luts, nqt, qid, offsets, codes, cand, out):
    """``first_pass_lut`` of many queries in one call: ``luts`` (nq, K, T) (query q's first
    ``nqt[q]`` columns are its table), candidate i belongs to query ``qid[i]``; blocks of
    every query's candidates run in parallel. Per candidate the same sums as one query."""
    nb = (len(cand) + BLOCK - 1) // BLOCK
    for b in prange(nb):
        best = np.empty(luts.shape[2], np.float32)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            r, q = cand[i], qid[i]
            n = nqt[q]
            s, e = offsets[r], offsets[r + 1]
            if e <= s:
                out[i] = 0.0
                continue
            lut = luts[q]
            for t in range(n):
                best[t] = -np.inf
            for p in range(s, e):
                row = lut[codes[p]]
                for t in range(n):
                    best[t] = max(best[t], row[t])
            acc = np.float32(0.0)
            for t in range(n):
                acc += best[t]
            out[i] = acc


@numba.njit(cache=True, parallel=True, fastmath=True, nogil=True)
def first_pass_pruned_batch(luts, kept, nqt, qid, offsets, codes, cand, out):
    """PLAID's centroid interaction with pruning: ``first_pass_lut_batch`` over a table whose
    rows of centroids not ``kept[q]`` (their best score over the query's tokens below the
    threshold) are zero. A pruned token only offers 0 to each max, so the row is not read:
    a document costs one flag test per token plus the kept tokens' rows (2-4% of them)."""
    nb = (len(cand) + BLOCK - 1) // BLOCK
    for b in prange(nb):
        best = np.empty(luts.shape[2], np.float32)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            r, q = cand[i], qid[i]
            n = nqt[q]
            s, e = offsets[r], offsets[r + 1]
            if e <= s:
                out[i] = 0.0
                continue
            lut, keep = luts[q], kept[q]
            for t in range(n):
                best[t] = -np.inf
            pruned = False
            for p in range(s, e):
                c = codes[p]
                if keep[c] == 0:
                    pruned = True
                    continue
                row = lut[c]
                for t in range(n):
                    best[t] = max(best[t], row[t])
            if pruned:
                for t in range(n):
                    best[t] = max(best[t], np.float32(0.0))
            acc = np.float32(0.0)
            for t in range(n):
                acc += best[t]
            out[i] = acc


@numba.njit(cache=True, parallel=True, nogil=True)
def _final_pass_pq_batch(luts, pqs, nqt, qid, offsets, codes, res, scale, half, cand, out):
    nb = (len(cand) + BLOCK - 1) // BLOCK
    for b in prange(nb):
        best = np.empty(max(luts.shape[2], REGISTER_COLUMNS), np.float32)
        for i in range(b * BLOCK, min(len(cand), (b + 1) * BLOCK)):
            q = qid[i]
            out[i] = _final_doc(luts[q], pqs[q], nqt[q], offsets, codes, res, scale, half,
                                cand[i], best)


def final_pass_pq_batch(luts, pqs, nqt, qid, offsets, codes, res, scale, half, cand, out):
    """``final_pass_pq`` of many queries in one call (``pqs`` (nq, M, 256, T); see
    ``first_pass_lut_batch``)."""
    if len(nqt) and nqt.max() > REGISTER_COLUMNS:
        luts, pqs = _widened(luts), _widened(pqs)
    _slp(_final_pass_pq_batch, luts, pqs, nqt, qid, offsets, codes, res, scale, half, cand,
         out)


@numba.njit(cache=True, nogil=True)
def probe_tables(lut, nprobe, lut_t, best):
    """One pass over a query's centroid scores ``lut`` (nqt, K) for its tables: writes the
    transposed table ``lut_t`` (K, nqt) and ``best`` (K,), each centroid's best score over the
    tokens; returns the probes, each token's ``nprobe`` best centroids (ties: the lower id),
    ascending, each once (``nprobe`` 0: none; the caller probes every centroid). numpy's
    argpartition and unique took 2.5 ms of a 28-token query."""
    nqt, k = lut.shape
    for c in range(k):
        best[c] = -np.inf
    mark = np.zeros(k, np.uint8)
    top_s = np.empty(nprobe, np.float32)
    top_c = np.empty(nprobe, np.int64)
    for t in range(nqt):
        row = lut[t]
        filled = 0
        for c in range(k):
            v = row[c]
            lut_t[c, t] = v
            if v > best[c]:
                best[c] = v
            if nprobe == 0:
                continue
            if filled < nprobe:
                j = filled
                filled += 1
            elif v > top_s[nprobe - 1]:
                j = nprobe - 1
            else:
                continue
            while j > 0 and top_s[j - 1] < v:  # strict: an equal score stays behind
                top_s[j], top_c[j] = top_s[j - 1], top_c[j - 1]
                j -= 1
            top_s[j], top_c[j] = v, c
        for j in range(filled):
            mark[top_c[j]] = 1
    n = 0
    for c in range(k):
        n += mark[c]
    out = np.empty(n, np.int64)
    n = 0
    for c in range(k):
        if mark[c]:
            out[n] = c
            n += 1
    return out


@numba.njit(cache=True, nogil=True)
def gather_candidates(ivf_offsets, ivf_docs, probes, allow, use_allow, mark, out):
    """Documents listed under any probed centroid (each once, allowed only); returns how many
    were written to ``out``. ``mark`` (uint8, n_rows) must be zero and is left zero."""
    n = 0
    for j in range(len(probes)):
        c = probes[j]
        for p in range(ivf_offsets[c], ivf_offsets[c + 1]):
            r = ivf_docs[p]
            if mark[r] == 0 and (not use_allow or allow[r]):
                mark[r] = 1
                out[n] = r
                n += 1
    for i in range(n):
        mark[out[i]] = 0
    return n


def top(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Best k (score desc, then row asc) of parallel arrays; ties at the k-th score keep the
    lowest rows (so the cut does not depend on the candidates' order)."""
    if len(scores) > k:
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        above = np.flatnonzero(scores > kth)
        ties = np.flatnonzero(scores == kth)
        ties = ties[np.argsort(rows[ties], kind="stable")[:k - len(above)]]
        sel = np.concatenate([above, ties])
        scores, rows = scores[sel], rows[sel]
    order = np.lexsort((rows, -scores))
    return scores[order], rows[order]


class CpuKernels:
    name = "cpu"
    first_pass_lut = staticmethod(first_pass_lut)
    first_pass_hamming = staticmethod(first_pass_hamming)
    final_pass_pq = staticmethod(final_pass_pq)
    first_pass_lut_batch = staticmethod(first_pass_lut_batch)
    first_pass_pruned_batch = staticmethod(first_pass_pruned_batch)
    final_pass_pq_batch = staticmethod(final_pass_pq_batch)
    gather_candidates = staticmethod(gather_candidates)


def backend(device: str = "cpu"):
    """The kernels for a placement: the torch kernels of ``polyindex.cuda.multivector`` on a
    cuda placement (or any placement with ``POLYINDEX_KERNELS=torch``: the GPU's code path on
    a CPU), else the numba kernels here. One torch backend per device and process."""
    from polyindex.cuda.device import kernel_device, torch_kernels
    if not torch_kernels(device):
        return CpuKernels
    return _torch_backend(kernel_device(device))


@functools.cache
def _torch_backend(device: str):
    from polyindex.cuda.multivector import Kernels
    from polyindex.index.postings import half_lut
    return Kernels(device, half_lut())
