"""The text lane: a plain lexical query (one text, a profile of one lexical stage, no filter,
rerank, explain or stored payload) in one numba call over every segment of the snapshot.

This is the lexical kind's direct plan (``LexicalKind.direct_plan``, the protocol's
``PlansDirectly``), as ``index/dense/lane`` is the dense kind's. The general path
(``pipeline.run``) spends per query a ``Query``, the kind's ``prepare``, per segment a Python
iteration (term lookup, a kernel call, its buffers), a concatenation and sort of the
segments' lists, fusion of one list and the hits: ~50 us a segment, so 100 segments of an
uncompacted collection answered 31-37x slower than one (issue 38). Here what depends only
on the snapshot and the stage (the segments' arrays, as one typed list; the live masks; the collection statistics; per term, once, its id in
every segment and its idf) is made once per snapshot (``Plan``), and a query is: analyze,
the weights (a new term: one kernel call looks it up in every segment, by each segment's
vocabulary hash, and counts its df where the snapshot's df cache lacks it), one kernel call
that scores each segment (block-max MaxScore where ``blockmax.pays``, else
term-at-a-time, into the dense buffer where ``postings.dense_pays``: long queries), merges their top k inside the kernel and gathers the k ids (tie runs put in
id order there; asked for more than k, ``ties.ask_for``, and again for more while a run of
equal scores straddles the k-th place, so its smallest ids are kept, as the general path
keeps them), then the hits for the k rows returned only.

The answer is the general path's, bit for bit: the same weights (``LexicalKind._weigh``), the
same per-segment kernels (``postings._bm25_add``/``_select``, ``blockmax._query``) with the
same choice between them, and the same merge order (score, then the smaller key: the
general path's stable sort over segments in order), ties then put in id order as
``order_ties`` puts them. Tests compare the two (``tests/test_lexical_lane.py``). Anything the plan does
not take (BM25L and BM25+, whose absent-term constant the general path adds; RM3; params it
would refuse; segments whose arrays differ in type, e.g. files written before the compact
postings) makes no plan or returns None: the general path answers and reports.
"""
from __future__ import annotations

import numba
import numpy as np
from numba.typed import List

from polyindex.index.docids import count_live
from polyindex.index.lexical import blockmax, longquery
from polyindex.index.lexical.bm25 import WITH_DELTA
from polyindex.index.lexical.vocabulary import _cmp, encode_terms, hash_find
from polyindex.index.masks import freeze
from polyindex.index.postings import (SELECT_KEYS_K, _bm25_add, _bm25_add_dense, _select,
                                      _select_dense, _select_keys, dense_pays, readonly)
from polyindex.index.ranked import RankedPlan
from polyindex.index.ties import ask_for
from polyindex.types import Hit

_EMPTY_I32 = readonly(np.zeros(0, np.int32))
_TERM_CACHE = 5_000_000  # term ids a plan keeps (terms x segments; cleared past this)
SEP = "\x00"  # between the ids ``ids_in_order`` gathers: never inside a UTF-8 character
_NO_LIVE = readonly(np.ones(0, np.bool_))
_NO_OFF = readonly(np.zeros(1, np.int32))
_NO_BYTES = readonly(np.zeros(0, np.uint8))


def _ro(a):
    return readonly(np.ascontiguousarray(a))


def _segment_tuple(seg, live, base: int, idbuf):
    """A segment's arrays as the kernels take them (all read-only and contiguous, so every
    segment's tuple has one numba type), its id column's (offsets, bytes) last (empty where
    ``idbuf`` is None): one typed list per call, since unboxing one costs ~1.3 us."""
    boff, first, wide_at, lo, wide, shift = seg.P
    P = (_ro(boff), _ro(first), _ro(wide_at), _ro(lo), _ro(wide), int(shift))
    if seg.blocks is None:
        blocks, has_blocks = (_EMPTY_I32, _EMPTY_I32, _EMPTY_I32), False
    else:
        blocks, has_blocks = tuple(_ro(x) for x in seg.blocks), True
    has_live = live is not None
    return (_ro(seg._voff), _ro(seg._vdata), seg.term_table(), _ro(seg.offsets), P,
            _ro(seg.tfs), _ro(seg.doclen), _ro(seg.df), *blocks, has_blocks, has_live,
            _ro(live) if has_live else _NO_LIVE, np.int64(base),
            *(idbuf if idbuf is not None else (_NO_OFF, _NO_BYTES)))


@numba.njit(cache=True, nogil=True)
def lookup(segs, qoff, qdata, need_df, tids, total):
    """``tids[i, s]``: term i's id in segment s (-1 where absent); ``total[i]`` (where
    ``need_df[i]``): its document frequency over the live rows of every segment."""
    for si in range(len(segs)):
        (voff, vdata, table, offsets, P, _tfs, _dl, df, _l, _m, _n, _hb, has_live, live,
         _b, _io, _id) = segs[si]
        for i in range(len(qoff) - 1):
            t = hash_find(table, voff, vdata, qdata, qoff[i], qoff[i + 1])
            tids[i, si] = t
            if t < 0 or not need_df[i]:
                continue
            if has_live:
                total[i] += count_live(P, offsets, t, live)
            else:
                total[i] += df[t]


@numba.njit(cache=True, nogil=True)
def search(segs, qtids, qw, k1, b, avgdl, use_blockmax, scores, seen, touched, acc,
           out_s, out_i):
    """One query's top-k over every segment (``out_s``/``out_i``: length k, best first,
    padded with -inf / -1; keys are segment base + row). Each segment's top k is the
    general path's (``use_blockmax`` 1: block-max MaxScore where ``blockmax.pays``, else
    term-at-a-time, into the dense buffer where ``postings.dense_pays``: a long query that
    touches most rows), merged by (score, smaller key). ``use_blockmax`` 0 scores
    term-at-a-time with seen flags, 2 prunes every query by block-max MaxScore, 3 every
    query by ``longquery``'s term-at-a-time MaxScore, 4 every query dense (the same answer;
    for measurements and tests: no rule picks 3, see its docstring)."""
    k = len(out_s)
    k1p1 = k1 + 1.0
    c1 = k1 * (1.0 - b)
    c2 = k1 * b / avgdl
    nt = len(qw)
    tids = np.empty(nt, np.int64)
    tws = np.empty(nt, np.float64)
    seg_s = np.empty(k, np.float32)
    seg_i = np.empty(k, np.int64)
    tmp_s = np.empty(k, np.float32)
    tmp_i = np.empty(k, np.int64)
    size = 0
    for si in range(len(segs)):
        (voff, vdata, table, offsets, P, tfs, doclen, _df, last, max_tf, min_len, has_blocks,
         has_live, live, base, _io, _id) = segs[si]
        m = 0
        nonneg = True
        for j in range(nt):
            t = qtids[j, si]  # looked up once per snapshot (``Plan._weights``)
            if t >= 0:
                tids[m] = t
                tws[m] = qw[j]
                nonneg = nonneg and qw[j] >= 0
                m += 1
        if m == 0:
            continue
        terms = tids[:m]
        ws = tws[:m]
        prune = use_blockmax > 0 and has_blocks and nonneg
        if prune and use_blockmax == 3:  # measured slower on every collection: see longquery
            longquery._query(offsets, P, tfs, doclen, last, max_tf, min_len, terms, ws,
                             k1p1, c1, c2, has_live, live, acc, seen, touched, seg_s, seg_i)
        elif prune and (use_blockmax == 2 or use_blockmax == 1
                        and blockmax.pays(offsets, terms, k)):
            blockmax._query(offsets, P, tfs, doclen, last, max_tf, min_len, terms, ws,
                            k1p1, c1, c2, has_live, live, seg_s, seg_i)
        elif use_blockmax == 4 or use_blockmax == 1 and dense_pays(offsets, terms, ws,
                                                                     len(doclen)):
            for j in range(m):  # most rows touched: no seen flags, one pass over the rows
                _bm25_add_dense(offsets, P, tfs, doclen, terms[j], ws[j], k1p1, c1, c2,
                                has_live, live, scores)
            _select_dense(scores, len(doclen), k, seg_s, seg_i)
        else:
            n = 0
            for j in range(m):
                n = _bm25_add(offsets, P, tfs, doclen, terms[j], ws[j], k1p1, c1, c2,
                              has_live, live, scores, seen, touched, n)
            if nonneg and k >= SELECT_KEYS_K and use_blockmax != 0:  # acc: zeroed scratch
                _select_keys(scores, seen, touched, n, k, seg_s, seg_i, acc.view(np.uint64))
            else:
                _select(scores, seen, touched, n, k, seg_s, seg_i)
        size = _merge(out_s, out_i, size, seg_s, seg_i, base, tmp_s, tmp_i)
    for j in range(size, k):
        out_s[j] = -np.inf
        out_i[j] = -1


@numba.njit(cache=True, nogil=True)
def _merge(out_s, out_i, size, seg_s, seg_i, base, tmp_s, tmp_i):
    """Merge a segment's top k (best first, -1 padded; rows + ``base``) into the first
    ``size`` of ``out`` (best first; every key there is smaller, so a tie keeps it): the
    general path's stable sort of the segments' lists in order. Returns the new size."""
    k = len(out_s)
    if size == 0:
        for j in range(k):
            if seg_i[j] < 0:
                return j
            out_s[j] = seg_s[j]
            out_i[j] = seg_i[j] + base
        return k
    if seg_i[0] < 0 or (size == k and not seg_s[0] > out_s[k - 1]):
        return size  # nothing of the segment enters
    a = 0
    b = 0
    n = 0
    while n < k:
        has_b = b < k and seg_i[b] >= 0
        if a < size and (not has_b or not seg_s[b] > out_s[a]):
            tmp_s[n] = out_s[a]
            tmp_i[n] = out_i[a]
            a += 1
        elif has_b:
            tmp_s[n] = seg_s[b]
            tmp_i[n] = seg_i[b] + base
            b += 1
        else:
            break
        n += 1
    out_s[:n] = tmp_s[:n]
    out_i[:n] = tmp_i[:n]
    return n


@numba.njit(cache=True, nogil=True)
def ids_in_order(segs, bases, keys, scores):
    """The UTF-8 ids of ``keys`` (best first), each run of equal scores in id order (byte
    order is code point order, as ``ties.order_ties`` sorts), joined by NUL bytes: one
    decode and one split give the hits' ids. (False, _) when a key is out of range.

    A segment's tuple is read from the typed list once per segment the keys fall in, not
    per key: each read copies its 17 members (and counts their references), which cost
    ~0.2 us a key."""
    n = len(keys)
    seg = np.empty(n, np.int64)
    start = np.empty(n, np.int64)
    stop = np.empty(n, np.int64)
    for i in range(n):
        key = keys[i]
        lo, hi = 0, len(bases)
        while hi - lo > 1:  # the last base <= key
            mid = (lo + hi) >> 1
            if bases[mid] <= key:
                lo = mid
            else:
                hi = mid
        if key < 0:
            return False, np.zeros(0, np.uint8)
        seg[i] = lo
        start[i] = -1
    total = 0
    for i in range(n):  # the offsets of each segment once, for all its keys
        if start[i] >= 0:
            continue
        s = seg[i]
        offsets = segs[s][15]
        for x in range(i, n):
            if seg[x] == s:
                r = keys[x] - bases[s]
                if r >= len(offsets) - 1:
                    return False, np.zeros(0, np.uint8)
                start[x] = offsets[r]
                stop[x] = offsets[r + 1]
                total += stop[x] - start[x]
    ids = np.empty(total, np.uint8)  # the ids in key order, then sorted within tie runs
    at = np.empty(n + 1, np.int64)
    at[0] = 0
    for i in range(n):
        at[i + 1] = at[i] + stop[i] - start[i]
    done = np.zeros(n, np.bool_)
    for i in range(n):  # each segment's bytes once
        if done[i]:
            continue
        s = seg[i]
        data = segs[s][16]
        for x in range(i, n):
            if seg[x] == s:
                done[x] = True
                ids[at[x]:at[x + 1]] = data[start[x]:stop[x]]
    order = np.arange(n)
    i = 0
    while i < n:  # insertion sort of each tie run by id bytes
        j = i + 1
        while j < n and scores[j] == scores[i]:
            j += 1
        for a in range(i + 1, j):
            x = order[a]
            b = a - 1
            while b >= i:
                y = order[b]
                if _cmp(ids, at[y], at[y + 1], ids, at[x], at[x + 1]) <= 0:
                    break
                order[b + 1] = y
                b -= 1
            order[b + 1] = x
        i = j
    out = np.zeros(total + max(n - 1, 0), np.uint8)  # zero: the separators
    w = 0
    for i in range(n):
        x = order[i]
        m = at[x + 1] - at[x]
        out[w:w + m] = ids[at[x]:at[x + 1]]
        w += m + 1
    return True, out


@numba.njit(cache=True, nogil=True)
def search_ids(segs, bases, qtids, qw, k1, b, avgdl, use_blockmax, scores, seen,
               touched, acc, k):
    """``search`` then ``ids_in_order`` in one call (one dispatch fewer a query): (scores,
    keys, how many are hits, whether the ids were gathered, the gathered ids)."""
    out_s = np.empty(k, np.float32)
    out_i = np.empty(k, np.int64)
    search(segs, qtids, qw, k1, b, avgdl, use_blockmax, scores, seen, touched, acc,
           out_s, out_i)
    n = 0
    while n < k and out_i[n] >= 0:
        n += 1
    ok, buf = ids_in_order(segs, bases, out_i[:n], out_s[:n])
    return out_s, out_i, n, ok, buf


def _ties_in_id_order(ids: list[str], eq: np.ndarray) -> None:
    """Sort each run of equal scores' ids in place (``eq[i]``: place i ties place i + 1).
    Python orders strings by code point, as ``ties.order_ties`` (numpy's and Arrow's sorts)
    does; the ids are in hand already, so no second read of them."""
    edges = np.flatnonzero(np.diff(np.concatenate(([False], eq, [False])).astype(np.int8)))
    for a, b in zip(edges[0::2].tolist(), edges[1::2].tolist()):  # run: places a..b
        ids[a:b + 1] = sorted(ids[a:b + 1])


class Plan(RankedPlan):
    """One snapshot's lexical stage, ready to search (``takes``: what a query is)."""

    takes = "text"
    __slots__ = ("kind", "segs", "stats", "cache", "scorer", "blockmax", "n_max", "_free",
                 "has_ids", "bases", "global_key", "_terms", "_terms_for", "_term_cap")

    def __init__(self, snapshot, kind, segments, scorer, use_blockmax: bool, global_key: str):
        """``global_key``: the snapshot cache's entry of a shard's collection-wide
        statistics (``lexical.kind.GLOBAL``), whose df then count."""
        self.global_key = global_key
        self.kind = kind
        self.scorer = scorer  # None: the kind's, read per query (``set_scorer`` swaps it)
        self.blockmax = int(use_blockmax)  # 0 off, 1 where ``blockmax.pays``, 2 always
        self.cache = snapshot.cache[kind.name]
        live = list(snapshot.live)
        for mask in live:
            freeze(mask)
        self.stats = kind._collection_stats(segments, live, self.cache)
        # the segments' id columns (offsets, bytes), for ``ids_in_order``; None: ``ids_of``
        bufs = [getattr(s.docs, "id_buffers", lambda: None)() for s in snapshot.segments]
        self.has_ids = bool(bufs) and all(b is not None for b in bufs)
        tuples = [_segment_tuple(seg, mask, base, idbuf if self.has_ids else None)
                  for seg, mask, base, idbuf in zip(segments, live, snapshot.bases, bufs)]
        if len({numba.typeof(t) for t in tuples}) != 1:
            raise TypeError("segments of different layouts")  # direct_plan: no plan
        self.segs = List(tuples)
        self.n_max = max(seg.n_rows for seg in segments)
        self._free: list = []
        self._terms: dict = {}  # ``_weights``
        self._terms_for = None
        self._term_cap = max(1000, _TERM_CACHE // len(tuples))  # ids: 4 bytes a segment
        self.bases = readonly(np.asarray(snapshot.bases, np.int64))

    def weigh(self, text):
        """(scorer, terms as UTF-8 offsets and bytes, their weights) of a query: what
        ``LexicalKind.prepare`` and ``_weigh`` give (idf x count; terms no live row has, or
        weighing nothing, left out), x the variant's scale as ``vocabulary.query_terms``
        applies it; None for a query the general path must answer."""
        if not isinstance(text, str) or not text.strip():
            return None
        scorer = self.scorer or self.kind.scorer
        if scorer.variant in WITH_DELTA:
            return None  # the general path adds their absent-term constant
        counts: dict[str, int] = {}
        for t in self.kind.analyzer.analyze(text):
            counts[t] = counts.get(t, 0) + 1
        return (scorer, *self._weights(scorer, counts))

    def _weights(self, scorer, counts: dict[str, int]):
        # per term of the snapshot: its idf under ``scorer`` and its id in every segment
        # (None: no live row has it, or it weighs nothing), worked out on its first query
        # (one lookup kernel over every segment, which counts its df too where the
        # snapshot's df cache, the general path's, lacks it); later ones cost a dict lookup
        terms = self._terms
        if self._terms_for is not scorer or len(terms) > self._term_cap:
            terms = self._terms = {}
            self._terms_for = scorer
        missing = [t for t in counts if t not in terms]
        if missing:
            self._learn(scorer, missing)
        scale = scorer.weight_scale
        ws, rows = [], []
        for t, c in counts.items():
            got = terms[t]
            if got is not None:
                w = c * got[0]  # as ``LexicalKind._weigh``: idf x count, then the scale
                ws.append(w * scale if scale != 1.0 else w)
                rows.append(got[1])
        if not rows:
            return np.zeros((0, len(self.segs)), np.int32), np.zeros(0, np.float64)
        return np.array(rows, np.int32), np.array(ws, np.float64)

    def _learn(self, scorer, missing: list[str]) -> None:
        dfs = self.cache.setdefault("lexical:df", {})
        g = self.cache.get(self.global_key)
        need = np.array([g is None and t not in dfs for t in missing], np.bool_)
        qoff, qdata = encode_terms(missing)
        tids = np.empty((len(missing), len(self.segs)), np.int32)
        total = np.zeros(len(missing), np.int64)
        lookup(self.segs, qoff, qdata, need, tids, total)
        if need.any():
            dfs.update((t, n) for t, n, x in zip(missing, total.tolist(), need) if x)
        if g is not None:  # a shard: the whole collection's df
            unknown = [t for t in missing if t not in dfs]
            if unknown:
                dfs.update(zip(unknown, g.doc_freqs(unknown)))
        n_docs, idf = self.stats[0], scorer.idf
        for t, row in zip(missing, tids):
            df = dfs[t]
            i = idf(df, n_docs) if df else 0.0
            self._terms[t] = (i, row) if i > 0 else None

    def _buffers(self):
        """A query's scratch, zeroed (kernels leave it zeroed): float32 scores, seen flags,
        touched rows, float64 accumulators (``longquery``)."""
        n = self.n_max
        return (np.zeros(n, np.float32), np.zeros(n, np.uint8), np.zeros(n, np.int32),
                np.zeros(n, np.float64))

    def top(self, scorer, qtids, qw, k: int):
        """(scores, keys) of a weighed query's top k over every segment (one kernel call)."""
        out_s = np.empty(k, np.float32)
        out_i = np.empty(k, np.int64)
        if not len(qw):
            return out_s[:0], out_i[:0]
        try:
            bufs = self._free.pop()
        except IndexError:
            bufs = self._buffers()
        search(self.segs, qtids, qw, scorer.k1, scorer.b, self.stats[1], self.blockmax,
               *bufs, out_s, out_i)
        if len(self._free) < 8:  # not on an exception: the buffers may not be zeroed then
            self._free.append(bufs)
        n = k if out_i[-1] >= 0 else int(np.count_nonzero(out_i >= 0))
        return out_s[:n], out_i[:n]

    def ids(self, snapshot, scores, keys) -> list[str]:
        """The ids of ``keys``, each run of equal scores in id order."""
        if self.has_ids:
            ok, buf = ids_in_order(self.segs, self.bases, keys, scores)
            if ok:
                ids = buf.tobytes().decode("utf-8").split(SEP)
                if len(ids) == len(keys):  # else an id holds SEP
                    return ids
        ids = snapshot.ids_of(keys)
        if len(keys) > 1:
            eq = scores[1:] == scores[:-1]
            if eq.any():
                _ties_in_id_order(ids, eq)
        return ids

    def _ranked(self, snapshot, text, k: int):
        """(ids, float32 scores) of a query's top k; None: the general path answers."""
        if snapshot.cache.get(self.kind.name) is not self.cache:
            return None  # a shard swapped in the collection-wide statistics since the plan
        weighed = self.weigh(text)
        if weighed is None:
            return None
        if not len(weighed[2]):
            return [], np.zeros(0, np.float32)
        # More rows than k show a run of equal scores straddling the k-th place
        # (``ties.ask_for``); then more until the list ends below it: the whole run, in id
        # order, so the first k keep its smallest ids (``ties.cut_ties``, as the general
        # path cuts it)
        n = ask_for(k)
        while True:
            ids, scores = self._top_ids(snapshot, weighed, n)
            if len(scores) < n or scores[n - 1] != scores[k - 1]:
                return ids[:k], scores[:k]
            n *= 2

    def _top_ids(self, snapshot, weighed, k: int):
        """(ids, float32 scores) of a weighed query's top k, tie runs in id order."""
        scorer, qtids, qw = weighed
        if not self.has_ids:  # ids not one plain string chunk somewhere: two steps
            scores, keys = self.top(*weighed, k)
            ids = self.ids(snapshot, scores, keys)
        else:
            try:
                bufs = self._free.pop()
            except IndexError:
                bufs = self._buffers()
            out_s, out_i, n, ok, buf = search_ids(
                self.segs, self.bases, qtids, qw, scorer.k1, scorer.b,
                self.stats[1], self.blockmax, *bufs, k)
            if len(self._free) < 8:  # not on an exception: the buffers may not be zeroed
                self._free.append(bufs)
            scores = out_s[:n]
            ids = buf.tobytes().decode("utf-8").split(SEP) if ok and n else []
            if len(ids) != n:  # a key out of range, or an id holding SEP
                ids = self.ids(snapshot, scores, out_i[:n])
        return ids, scores

    def search_batch(self, snapshot, texts, k: int) -> list[list[Hit]] | None:
        out = []
        for text in texts:
            hits = self.search(snapshot, text, k)
            if hits is None:
                return None
            out.append(hits)
        return out
