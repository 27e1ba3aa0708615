"""numba kernels of the lexical rerank features (one call per segment for a whole query batch).

Inputs are a segment's forward index (row offsets, title lengths, term ids in text order) and
collection-wide statistics per segment-local term id (``stats.FieldStats.arrays``, filled for
the candidates' terms). A query is a run
of *slots*, one per distinct analyzed term, with its segment-local term id (-1 when the segment
lacks it), count in the query, and collection-wide idf / collection probability per field. A
scratch array ``slot_of`` (term id -> slot, -1 elsewhere) makes the scan of a document O(its
length); the kernel leaves it (and ``tf_scratch``) as it found them.

Per field (0 title, 1 body, 2 all) the kernel writes ``schema.PER_FIELD`` in that order.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from polyindex.index.lexical.vocabulary import hash_find
from polyindex.rerank import schema

FPF = len(schema.PER_FIELD)
(K1A, BA), (K1B, BB) = schema.BM25_SETTINGS
MU1, MU2 = schema.DIRICHLET_MU
LAM = schema.JM_LAMBDA


@numba.njit(cache=True, nogil=True)
def field_counts(row_ptr, title_len, ids, n_terms, has_live, live):
    """Per field and term over live rows: (df (3, n_terms), cf (3, n_terms), lengths (3,), rows)."""
    df = np.zeros((3, n_terms), np.int64)
    cf = np.zeros((3, n_terms), np.int64)
    last = np.full((3, n_terms), -1, np.int64)
    lens = np.zeros(3, np.float64)
    n = 0
    for r in range(len(row_ptr) - 1):
        if has_live and not live[r]:
            continue
        n += 1
        st, en = row_ptr[r], row_ptr[r + 1]
        mid = st + title_len[r]
        lens[0] += mid - st
        lens[1] += en - mid
        lens[2] += en - st
        for p in range(st, en):
            t = ids[p]
            f = 0 if p < mid else 1
            cf[f, t] += 1
            cf[2, t] += 1
            if last[f, t] != r:
                last[f, t] = r
                df[f, t] += 1
            if last[2, t] != r:
                last[2, t] = r
                df[2, t] += 1
    return df, cf, lens, n


@numba.njit(cache=True, nogil=True)
def remove_rows(row_ptr, title_len, ids, rows, df, cf, lens):
    """Take rows out of ``field_counts``' (df, cf, lengths), in place: O(their length)."""
    for r in rows:
        st, en = row_ptr[r], row_ptr[r + 1]
        mid = st + title_len[r]
        for f, a, b in ((0, st, mid), (1, mid, en), (2, st, en)):
            lens[f] -= b - a
            terms = np.sort(ids[a:b])
            for j in range(len(terms)):
                cf[f, terms[j]] -= 1
                if j == 0 or terms[j] != terms[j - 1]:
                    df[f, terms[j]] -= 1


@numba.njit(cache=True, nogil=True)
def add_counts(table, voff, vdata, qoff, qdata, qids, df, cf, out_df, out_cf, found):
    """``out[:, j]`` += this segment's (df, cf) of term ``qids[j]`` of another vocabulary
    (``qoff``, ``qdata``), found by string through this segment's ``vocabulary.build_hash``
    ``table``; absent terms add nothing. ``found[j]``: the term's id here, -1 where absent."""
    for j in range(len(qids)):
        t = qids[j]
        i = hash_find(table, voff, vdata, qdata, qoff[t], qoff[t + 1])
        found[j] = i
        if i >= 0:
            for f in range(3):
                out_df[f, j] += df[f, i]
                out_cf[f, j] += cf[f, i]


@numba.njit(cache=True, nogil=True)
def scatter(found, idf, p, to_idf, to_p):
    """``to[:, found[j]] = (idf, p)[:, j]`` where ``found[j] >= 0``."""
    for j in range(len(found)):
        i = found[j]
        if i >= 0:
            for f in range(3):
                to_idf[f, i] = idf[f, j]
                to_p[f, i] = p[f, j]


@numba.njit(cache=True, nogil=True)
def row_terms(row_ptr, ids, rows, n_terms):
    """The distinct term ids (of ``n_terms``) of some rows of a forward index."""
    seen = np.zeros(n_terms, np.bool_)
    n = 0
    for r in rows:
        n += row_ptr[r + 1] - row_ptr[r]
    out = np.empty(n, np.int64)
    m = 0
    for r in rows:
        for p in range(row_ptr[r], row_ptr[r + 1]):
            t = ids[p]
            if not seen[t]:
                seen[t] = True
                out[m] = t
                m += 1
    return out[:m]


@numba.njit(cache=True, nogil=True)
def _doc_norm(ids, st, en, f, idf, tf_scratch):
    """|(1 + log tf) x idf| of one document field (all its terms)."""
    for p in range(st, en):
        tf_scratch[ids[p]] += 1
    acc = 0.0
    for p in range(st, en):
        t = ids[p]
        c = tf_scratch[t]
        if c > 0:
            w = (1.0 + math.log(c)) * idf[f, t]
            acc += w * w
            tf_scratch[t] = 0
    return math.sqrt(acc)


@numba.njit(cache=True, nogil=True)
def _query_constants(s0, ns, slot_qtf, slot_idf, slot_pc):
    """Per slot 1 + log(qtf); per field (rows) [sum of qtf, the Dirichlet mu1 / mu2 and
    Jelinek-Mercer log terms of a document without the term (summed), |query tf-idf|, idf sum],
    over the slots the field's collection holds (others are the same for every document)."""
    qlog = np.empty(max(ns, 1), np.float64)
    qc = np.zeros((3, 6), np.float64)
    for k in range(ns):
        qtf = slot_qtf[s0 + k]
        qlog[k] = 1.0 + math.log(qtf)
        for f in range(3):
            pcf = slot_pc[s0 + k, f]
            if pcf > 0:
                g = slot_idf[s0 + k, f]
                qc[f, 0] += qtf
                qc[f, 1] += qtf * math.log(MU1 * pcf)
                qc[f, 2] += qtf * math.log(MU2 * pcf)
                qc[f, 3] += qtf * math.log(LAM * pcf)
                qc[f, 4] += (qlog[k] * g) ** 2
                qc[f, 5] += g
    for f in range(3):
        qc[f, 4] = math.sqrt(qc[f, 4])
    return qlog, qc


@numba.njit(cache=True, nogil=True)
def _field(ids, st, en, f, o, s0, ns, qseq, big, tf, cnt, mpos, mslot, slot_of, slot_qtf,
           slot_idf, slot_pc, qlog, qc, idf, avg_len, tf_scratch, out):
    length = en - st
    for k in range(ns):
        tf[k] = 0
    m = len(qseq)
    nm = nb = nph = 0
    prev = -1
    for p in range(st, en):
        k = slot_of[ids[p]]
        if k >= 0:
            tf[k] += 1
            mpos[nm] = p
            mslot[nm] = k
            nm += 1
            if prev >= 0 and big[prev, k]:
                nb += 1
            if m >= 2 and k == qseq[0] and p + m <= en:
                ok = True
                for a in range(1, m):
                    if slot_of[ids[p + a]] != qseq[a]:
                        ok = False
                        break
                if ok:
                    nph += 1
        prev = k
    avg = avg_len[f]
    # Unmatched terms add constants precomputed per query (``qc``); only matched ones need logs.
    ql1 = qc[f, 1] - qc[f, 0] * math.log(length + MU1)
    ql2 = qc[f, 2] - qc[f, 0] * math.log(length + MU2)
    jm = qc[f, 3]
    ka = K1A * (1.0 - BA + BA * length / avg)
    kb = K1B * (1.0 - BB + BB * length / avg)
    bma = bmb = dot = 0.0
    matched = 0
    isum = 0.0
    imax, imin = -np.inf, np.inf
    tsum = tmax = 0
    for k in range(ns):
        x = tf[k]
        if x > 0:
            g = slot_idf[s0 + k, f]
            pcf = slot_pc[s0 + k, f]
            qtf = slot_qtf[s0 + k]
            matched += 1
            isum += g
            imax = max(imax, g)
            imin = min(imin, g)
            tsum += x
            tmax = max(tmax, x)
            bma += qtf * g * x * (K1A + 1.0) / (x + ka)
            bmb += qtf * g * x * (K1B + 1.0) / (x + kb)
            dot += qlog[k] * g * (1.0 + math.log(x)) * g
            if pcf > 0:
                ql1 += qtf * (math.log(x + MU1 * pcf) - math.log(MU1 * pcf))
                ql2 += qtf * (math.log(x + MU2 * pcf) - math.log(MU2 * pcf))
                jm += qtf * (math.log((1.0 - LAM) * x / length + LAM * pcf) - math.log(LAM * pcf))
    qn, iall = qc[f, 4], qc[f, 5]
    dn = _doc_norm(ids, st, en, f, idf, tf_scratch)  # O(its length): no cache per snapshot
    win = np.nan
    if matched > 0:
        for k in range(ns):
            cnt[k] = 0
        covered = left = 0
        best = en - st + 1
        for right in range(nm):
            k = mslot[right]
            if cnt[k] == 0:
                covered += 1
            cnt[k] += 1
            while covered == matched:
                best = min(best, mpos[right] - mpos[left] + 1)
                kl = mslot[left]
                cnt[kl] -= 1
                if cnt[kl] == 0:
                    covered -= 1
                left += 1
        win = best
    b = f * FPF
    out[o, b + 0] = bma
    out[o, b + 1] = bmb
    out[o, b + 2] = dot / (qn * dn) if qn > 0 and dn > 0 else 0.0
    out[o, b + 3] = ql1
    out[o, b + 4] = ql2
    out[o, b + 5] = jm
    out[o, b + 6] = matched
    out[o, b + 7] = matched / ns if ns > 0 else np.nan
    out[o, b + 8] = isum
    out[o, b + 9] = isum / matched if matched > 0 else np.nan
    out[o, b + 10] = imax if matched > 0 else np.nan
    out[o, b + 11] = imin if matched > 0 else np.nan
    out[o, b + 12] = isum / iall if iall > 0 else np.nan
    out[o, b + 13] = tsum
    out[o, b + 14] = tmax
    out[o, b + 15] = length
    out[o, b + 16] = length / avg
    out[o, b + 17] = win
    out[o, b + 18] = nb
    out[o, b + 19] = nph if m >= 2 else np.nan


@numba.njit(cache=True, nogil=True)
def lexical_features(row_ptr, title_len, ids, idf, avg_len, slot_tid, slot_qtf,
                     slot_idf, slot_pc, sptr, seq, seqptr, cand_q, cand_row, cand_out,
                     slot_of, tf_scratch, out):
    """Lexical features of candidate rows (grouped by query) into ``out[cand_out]``."""
    n = len(cand_q)
    maxlen = 1
    for c in range(n):
        r = cand_row[c]
        maxlen = max(maxlen, row_ptr[r + 1] - row_ptr[r])
    mpos = np.empty(maxlen, np.int64)
    mslot = np.empty(maxlen, np.int64)
    i = 0
    while i < n:
        q = cand_q[i]
        j = i
        while j < n and cand_q[j] == q:
            j += 1
        s0, s1 = sptr[q], sptr[q + 1]
        ns = s1 - s0
        for k in range(ns):
            if slot_tid[s0 + k] >= 0:
                slot_of[slot_tid[s0 + k]] = k
        qseq = seq[seqptr[q]:seqptr[q + 1]]
        big = np.zeros((max(ns, 1), max(ns, 1)), np.bool_)
        for a in range(len(qseq) - 1):
            big[qseq[a], qseq[a + 1]] = True
        tf = np.zeros(max(ns, 1), np.int64)
        cnt = np.zeros(max(ns, 1), np.int64)
        qlog, qc = _query_constants(s0, ns, slot_qtf, slot_idf, slot_pc)
        for c in range(i, j):
            r = cand_row[c]
            st, en = row_ptr[r], row_ptr[r + 1]
            mid = st + title_len[r]
            o = cand_out[c]
            _field(ids, st, mid, 0, o, s0, ns, qseq, big, tf, cnt, mpos, mslot, slot_of,
                   slot_qtf, slot_idf, slot_pc, qlog, qc, idf, avg_len, tf_scratch, out)
            _field(ids, mid, en, 1, o, s0, ns, qseq, big, tf, cnt, mpos, mslot, slot_of,
                   slot_qtf, slot_idf, slot_pc, qlog, qc, idf, avg_len, tf_scratch, out)
            _field(ids, st, en, 2, o, s0, ns, qseq, big, tf, cnt, mpos, mslot, slot_of,
                   slot_qtf, slot_idf, slot_pc, qlog, qc, idf, avg_len, tf_scratch, out)
        for k in range(ns):
            if slot_tid[s0 + k] >= 0:
                slot_of[slot_tid[s0 + k]] = -1
        i = j
