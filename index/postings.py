"""Posting lists shared by the sparse-vector kinds (lexical BM25 now, learned sparse later).

A posting index over one segment is CSR by term: ``offsets`` (n_terms + 1, int64) cuts the
``docs`` (int32, ascending within a term) and ``vals`` (per-posting value: a term frequency
for BM25, a weight for learned sparse vectors) arrays into one run per term. The BM25 kernels
read the lexical kind's doc ids through ``docids.doc_at`` (16-bit, block-relative); the
sparse-vector kernels read a plain ``docs`` array.

Files are Arrow IPC files, memory-mapped on read and exposed as zero-copy (read-only) numpy
arrays. Scoring is term-at-a-time in numba kernels: postings of the query terms are added into
a float32 score buffer the size of the segment while the rows touched are listed, so top-k
selection (a size-k heap) and the buffer reset only visit matched rows. One kernel call
handles a whole query batch for one segment. Buffers are reused through ``BufferPool``.

Top-k order is score descending, ties broken by the smaller row id; missing slots are
padded with ``-inf`` / ``-1``.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import numba
import numpy as np
import pyarrow as pa
from numba.core import types
from numba.extending import overload

from polyindex.errors import Corrupt
from polyindex.index import arrays, docids
from polyindex.index.docids import block_of, doc_at, find, row_in_block


def half_lut() -> np.ndarray:
    """float32 value of every float16 bit pattern (index = the uint16 bits): numba has no
    float16, so the sparse and multivector kernels read float16 weights through it."""
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def readonly(a: np.ndarray) -> np.ndarray:
    """``a`` as a read-only array (a view; O(1)). Numba compiles a kernel once per argument
    type, and a writable and a read-only array are different types: what the kernels read
    is passed read-only always, as the memory-mapped files are, so a segment or mask of a
    new kind never stops a query for a compile (3.3-3.9 s mid-query in bench_living, the
    first time a merge made a segment of more than 2^16 rows)."""
    if not a.flags.writeable:
        return a
    view = a.view()
    view.flags.writeable = False
    return view


_NO_ALLOW = readonly(np.ones(0, dtype=np.bool_))


# --------------------------------------------------------------------------- building

def build_csr(term_ids: np.ndarray, docs: np.ndarray, weights: np.ndarray | None,
              n_terms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR postings from ``(term_id, doc, weight)`` triples.

    Returns ``(offsets int64 (n_terms + 1,), docs int32, vals)``, grouped by term with docs
    ascending inside a term. Repeated ``(term, doc)`` pairs are merged by summing their
    weights; with ``weights=None`` every triple counts 1 and ``vals`` are int32 counts (term
    frequencies).
    """
    # int32 ids stay int32 (half the memory of a large build's sort arrays), others int64
    term_ids = np.asarray(term_ids)
    term_ids = term_ids if term_ids.dtype == np.int32 else term_ids.astype(np.int64)
    docs = np.asarray(docs)
    docs = docs if docs.dtype == np.int32 else docs.astype(np.int64)
    if term_ids.shape != docs.shape or term_ids.ndim != 1:
        raise ValueError("term_ids and docs must be 1-d arrays of the same length")
    offsets = np.zeros(n_terms + 1, dtype=np.int64)
    if len(term_ids) == 0:
        vals = np.zeros(0, np.int32 if weights is None else np.asarray(weights).dtype)
        return offsets, np.zeros(0, np.int32), vals
    if term_ids.min() < 0 or term_ids.max() >= n_terms:
        raise ValueError(f"term ids must be in [0, {n_terms})")
    if len(docs) < 2 or (docs[1:] >= docs[:-1]).all():
        # docs already ascending (a build's rows in order): a stable sort by term alone is
        # the lexsort's order, and a narrow key sorts by radix (0.05 s against 0.27 for 3M)
        key = term_ids.astype(np.uint16 if n_terms <= 1 << 16 else np.int32
                              if n_terms < 1 << 31 else np.int64)
        order = np.argsort(key, kind="stable")
    else:
        order = np.lexsort((docs, term_ids))
    t, d = term_ids[order], docs[order]
    first = np.empty(len(t), dtype=np.bool_)
    first[0] = True
    np.not_equal(t[1:], t[:-1], out=first[1:])
    first[1:] |= d[1:] != d[:-1]
    starts = np.flatnonzero(first)
    if weights is None:
        vals = np.diff(np.append(starts, len(t))).astype(np.int32)
    else:
        vals = np.add.reduceat(np.asarray(weights)[order], starts)
    t = t[starts]
    offsets[1:] = np.cumsum(np.bincount(t, minlength=n_terms))
    return offsets, d[starts].astype(np.int32), vals


# --------------------------------------------------------------------------- files

def write_arrow(path: Path, columns: dict[str, np.ndarray | list | pa.Array]) -> None:
    """Write columns as one record batch of an Arrow IPC file."""
    table = pa.table({name: col if isinstance(col, pa.Array) else pa.array(col)
                      for name, col in columns.items()})
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)


def read_arrow(path: Path, schema: dict[str, pa.DataType | tuple[pa.DataType, ...]]
               ) -> tuple[pa.Table, dict[str, object]]:
    """Memory-map an Arrow IPC file; numeric columns come back as zero-copy numpy arrays.

    ``schema`` names the expected columns and their type (or a tuple of the types allowed);
    string columns come back as the Arrow column itself. Raises ``Corrupt`` when the file is
    unreadable or does not match.
    """
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise Corrupt(f"{path}: cannot read Arrow file: {exc}") from None
    out: dict[str, object] = {}
    for name, allowed in schema.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        if name not in table.column_names or not any(
                table.schema.field(name).type.equals(t) for t in allowed):
            raise Corrupt(f"{path}: expected column {name!r} of type "
                          f"{' or '.join(map(str, allowed))}, file schema is {table.schema}")
        col = table.column(name)
        typ = col.type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            out[name] = col
        elif col.null_count:
            raise Corrupt(f"{path}: column {name!r} has nulls")
        elif col.num_chunks == 0:  # read-only as the mapped columns are (``readonly``)
            out[name] = readonly(np.zeros(0, dtype=typ.to_pandas_dtype()))
        else:
            out[name] = arrays.view(col)
    return table, out


def narrow_counts(counts: np.ndarray) -> np.ndarray:
    """Term frequencies in the narrowest unsigned type that holds them (uint8 nearly always):
    one byte a posting instead of 4, and the kernels compile once per type."""
    top = int(counts.max()) if len(counts) else 0
    return counts.astype(np.uint8 if top <= 0xFF else np.uint16 if top <= 0xFFFF else np.int32)


COUNT_TYPES = (pa.uint8(), pa.uint16(), pa.int32())  # int32: files written before narrowing


# --------------------------------------------------------------------------- buffers

def _search_buffers(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``*_search`` kernels' scratch: score buffer, seen flags, touched rows."""
    return np.zeros(n, np.float32), np.zeros(n, np.uint8), np.zeros(n, np.int32)


class BufferPool:
    """Reusable per-segment scratch, ``make(n_rows)`` (by default the search kernels');
    thread-safe. The kernels hand their scratch back zeroed; a caller puts it back only
    then (not after an exception)."""

    def __init__(self, n_rows: int, make=_search_buffers):
        self.n_rows = n_rows
        self._make = make
        self._free: list = []

    def get(self):
        try:
            return self._free.pop()
        except IndexError:
            return self._make(self.n_rows)

    def put(self, bufs) -> None:
        if len(self._free) < 8:
            self._free.append(bufs)


# --------------------------------------------------------------------------- kernels

@numba.njit(cache=True, nogil=True, inline="always")
def _worse(s1, i1, s2, i2):
    return s1 < s2 or (s1 == s2 and i1 > i2)


@numba.njit(cache=True, nogil=True)
def _sift_down(hs, hi, pos, size):
    s, i = hs[pos], hi[pos]
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and _worse(hs[child + 1], hi[child + 1], hs[child], hi[child]):
            child += 1
        if not _worse(hs[child], hi[child], s, i):
            break
        hs[pos], hi[pos] = hs[child], hi[child]
        pos = child
    hs[pos], hi[pos] = s, i


@numba.njit(cache=True, nogil=True)
def sort_heap(out_s, out_i, m, k):
    """The size-m heap (worst at the root) in ``out_s``/``out_i`` sorted best first, and the
    slots from m to k padded with ``-inf`` / ``-1``."""
    for end in range(m - 1, 0, -1):
        s, i = out_s[0], out_i[0]
        out_s[0], out_i[0] = out_s[end], out_i[end]
        out_s[end], out_i[end] = s, i
        _sift_down(out_s, out_i, 0, end)
    for j in range(m, k):
        out_s[j] = -np.inf
        out_i[j] = -1


@numba.njit(cache=True, nogil=True)
def _select(scores, seen, touched, n, k, out_s, out_i):
    """Top-k of the ``n`` touched rows into ``out_s``/``out_i`` (sorted); resets the buffers."""
    m = min(k, n)
    for j in range(m):
        d = touched[j]
        out_s[j] = scores[d]
        out_i[j] = d
    for pos in range(m // 2 - 1, -1, -1):  # heapify: worst at the root
        _sift_down(out_s, out_i, pos, m)
    for j in range(m, n):
        d = touched[j]
        s = scores[d]
        if m > 0 and _worse(out_s[0], out_i[0], s, d):
            out_s[0] = s
            out_i[0] = d
            _sift_down(out_s, out_i, 0, m)
    sort_heap(out_s, out_i, m, k)
    for j in range(n):
        d = touched[j]
        scores[d] = 0.0
        seen[d] = 0


@numba.njit(cache=True, nogil=True)
def topk_rows(scores, rows, k):
    """Top-k of ``scores[rows]`` (rows distinct): (scores float32 (k,), rows int64 (k,))."""
    n = len(rows)
    buf = np.zeros(len(scores), np.float32)
    seen = np.zeros(len(scores), np.uint8)
    touched = np.empty(n, np.int32)
    for j in range(n):
        buf[rows[j]] = scores[rows[j]]
        touched[j] = rows[j]
    out_s = np.empty(k, np.float32)
    out_i = np.empty(k, np.int64)
    _select(buf, seen, touched, n, k, out_s, out_i)
    return out_s, out_i


@numba.njit(cache=True, nogil=True)
def _bm25_add(offsets, P, tfs, doclen, t, w, k1p1, c1, c2, has_allow, allow,
              scores, seen, touched, n):
    """Add one term's BM25 contributions: w * tf * (k1 + 1) / (tf + c1 + c2 * dl)."""
    boff, _, _, lo, wide, shift = P
    for b in range(boff[t], boff[t + 1]):  # a block's metadata once, then its rows
        s, e, wa, f = block_of(P, offsets, t, b)
        for j in range(s, e):
            d = row_in_block(lo, wide, shift, wa, f, s, j)
            if has_allow and not allow[d]:
                continue
            tf = np.float64(tfs[j])
            scores[d] += w * tf * k1p1 / (tf + c1 + c2 * doclen[d])
            if seen[d] == 0:
                seen[d] = 1
                touched[n] = d
                n += 1
    return n


SELECT_KEYS_K = 64  # from this k, ``_select_keys`` (a partition) beats ``_select``'s heap


@numba.njit(cache=True, nogil=True)
def _select_keys(scores, seen, touched, n, k, out_s, out_i, keys):
    """``_select`` for scores >= 0 and a large k: each touched row's (score, row) packed into
    one uint64 whose order is ``_worse``'s (a non-negative float32's bits ascend with it;
    the row inverted, so the smaller row wins a tie), the k largest found by one partition
    and sorted. The same top k; ``keys`` (uint64, at least n) is left zeroed. Measured on
    the lane's kernel (nfcorpus, time; k=100): 8.6 vs 10.7 and 11.1 vs 14.3 us a query, but
    7.1 vs 4.0 at k=10: hence ``SELECT_KEYS_K``."""
    bits = scores.view(np.uint32)
    for j in range(n):
        d = touched[j]
        keys[j] = (np.uint64(bits[d]) << np.uint64(32)) | np.uint64(0xFFFFFFFF - d)
    m = min(k, n)
    if n > k:
        top = np.partition(keys[:n], n - k)[n - k:]
    else:
        top = keys[:n].copy()
    top.sort()
    for j in range(m):
        d = np.int64(0xFFFFFFFF - (top[m - 1 - j] & np.uint64(0xFFFFFFFF)))
        out_i[j] = d
        out_s[j] = scores[d]
    for j in range(m, k):
        out_s[j] = -np.inf
        out_i[j] = -1
    for j in range(n):
        d = touched[j]
        scores[d] = 0.0
        seen[d] = 0
        keys[j] = 0


DENSE_RATIO = 1.0  # ``dense_pays``: a query's postings per row of the segment


@numba.njit(cache=True, nogil=True)
def dense_pays(offsets, terms, weights, n_rows) -> bool:
    """Whether a query scores faster into the dense buffer (``_bm25_add_dense``, then
    ``_select_dense`` over every row): when its lists hold at least ``DENSE_RATIO``
    postings a row, most rows are touched, and the seen flags and touched list of
    ``_bm25_add`` cost more than one pass over the rows. Every weight must be positive, so
    a touched row's score is > 0 and the untouched rows' 0 tells them apart.

    Measured (kernel alone, one segment; docs/notes/query-cost-and-memory.md): arguana
    (8.2 postings a row) 185 vs 244 us, cisi (3.6) 17 vs 28 us at k=10; nfcorpus (0.15) 8.9
    vs 4.1 us."""
    total = 0
    for i in range(len(terms)):
        if not weights[i] > 1e-30:
            return False
        total += offsets[terms[i] + 1] - offsets[terms[i]]
    return total >= DENSE_RATIO * n_rows


@numba.njit(cache=True, nogil=True)
def _bm25_add_dense(offsets, P, tfs, doclen, t, w, k1p1, c1, c2, has_allow, allow, scores):
    """``_bm25_add`` without the seen flags and touched list (the same float32 sums)."""
    boff, _, _, lo, wide, shift = P
    for b in range(boff[t], boff[t + 1]):
        s, e, wa, f = block_of(P, offsets, t, b)
        for j in range(s, e):
            d = row_in_block(lo, wide, shift, wa, f, s, j)
            if has_allow and not allow[d]:
                continue
            tf = np.float64(tfs[j])
            scores[d] += w * tf * k1p1 / (tf + c1 + c2 * doclen[d])


@numba.njit(cache=True, nogil=True)
def _select_dense(scores, n_rows, k, out_s, out_i):
    """``_select`` over rows 0..n_rows-1 whose score is > 0 (the same top k: the order is
    total, by score then the smaller row); resets the scores."""
    m = 0
    for d in range(n_rows):
        s = scores[d]
        if s > 0:
            scores[d] = 0.0
            if m < k:
                out_s[m] = s
                out_i[m] = d
                m += 1
                if m == k:
                    for q in range(k // 2 - 1, -1, -1):
                        _sift_down(out_s, out_i, q, k)
            elif _worse(out_s[0], out_i[0], s, d):
                out_s[0] = s
                out_i[0] = d
                _sift_down(out_s, out_i, 0, k)
    if m < k:
        for q in range(m // 2 - 1, -1, -1):
            _sift_down(out_s, out_i, q, m)
    sort_heap(out_s, out_i, m, k)


@numba.njit(cache=True, nogil=True)
def bm25_search(offsets, P, tfs, doclen, qptr, qterms, qweights, k1, b, avgdl,
                has_allow, allow, scores, seen, touched, out_s, out_i):
    """BM25 top-k for a query batch over one segment (term-at-a-time).

    ``P``: the segment's doc ids (``polyindex.index.docids``); ``qterms[qptr[q]:qptr[q+1]]``
    are query q's segment-local term ids, ``qweights`` their weights (idf x query term
    count); ``out_s``/``out_i`` are (nq, k) outputs.
    """
    k1p1 = k1 + 1.0
    c1 = k1 * (1.0 - b)
    c2 = k1 * b / avgdl
    k = out_s.shape[1]
    for q in range(len(qptr) - 1):
        n = 0
        for j in range(qptr[q], qptr[q + 1]):
            n = _bm25_add(offsets, P, tfs, doclen, qterms[j], qweights[j], k1p1, c1, c2,
                          has_allow, allow, scores, seen, touched, n)
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])


@numba.njit(cache=True, nogil=True)
def _find(docs, lo, hi, row):
    """First position in the sorted run docs[lo:hi] whose doc is >= ``row`` (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if docs[mid] < row:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- the one "score these rows" loop -------------------------------------------------------
# Every kind's scoring of given rows (lexical BM25 and BM25L, sparse, learned sparse dot) is
# this loop; what differs, where a row's posting is and what it adds, is chosen by the type of
# ``how`` (a NamedTuple per scorer, below and in ``lexical/bm25``, ``sparse/kernels``) when
# numba compiles it, so each scorer's loop is as fast as its own copy was and can be cached.
# Every scorer adds in the order and precision its search kernel does (float32 accumulation
# of each term's product), so the scores equal the searches'.

def posting(how, offsets, t, row):
    """Position of ``row``'s posting in term ``t``'s run, or -1 (numba only)."""
    raise NotImplementedError("numba only")


def term_score(how, w, pos, row):
    """What query weight ``w`` and the posting at ``pos`` add to ``row``'s score (numba only;
    each scorer overloads it for its ``how``)."""
    raise NotImplementedError("numba only")


def scorer_of(how, cls) -> bool:
    """Whether the numba type ``how`` is the NamedTuple ``cls`` (for ``term_score``'s overloads)."""
    return isinstance(how, types.BaseNamedTuple) and how.instance_class is cls


@overload(posting, jit_options={"cache": True, "nogil": True})
def _posting(how, offsets, t, row):
    if not isinstance(how, types.BaseNamedTuple):
        return None
    if "P" in how.fields:  # the lexical kind's compressed doc ids (``docids``)
        def compressed(how, offsets, t, row):
            pos = find(how.P, offsets, t, row, offsets[t], offsets[t + 1])
            if pos < offsets[t + 1] and doc_at(how.P, offsets, t, pos) == row:
                return pos
            return -1
        return compressed
    if "docs" in how.fields:  # a plain ``docs`` array
        def plain(how, offsets, t, row):
            hi = offsets[t + 1]
            pos = _find(how.docs, offsets[t], hi, row)
            if pos < hi and how.docs[pos] == row:
                return pos
            return -1
        return plain
    return None


@numba.njit(cache=True, nogil=True)
def score_rows(offsets, how, n_rows, qptr, qterms, qweights, rows, out):
    """Scores of given rows (binary search per term) into ``out`` (nq, len(rows)); NaN for
    rows out of range."""
    for q in range(len(qptr) - 1):
        for r in range(len(rows)):
            row = rows[r]
            if row < 0 or row >= n_rows:
                out[q, r] = np.nan
                continue
            acc = np.float32(0.0)  # float32 accumulation, as in the score buffer of search
            for j in range(qptr[q], qptr[q + 1]):
                pos = posting(how, offsets, qterms[j], row)
                if pos >= 0:
                    acc = np.float32(acc + term_score(how, qweights[j], pos, row))
            out[q, r] = acc


class BM25Rows(NamedTuple):
    """BM25 over the lexical kind's postings (``tfs`` per posting, ``doclen`` per row)."""
    P: tuple
    tfs: np.ndarray
    doclen: np.ndarray
    k1p1: float
    c1: float
    c2: float


@overload(term_score, jit_options={"cache": True, "nogil": True})
def _bm25_term(how, w, pos, row):
    if scorer_of(how, BM25Rows):
        def bm25(how, w, pos, row):
            tf = np.float64(how.tfs[pos])
            return w * tf * how.k1p1 / (tf + how.c1 + how.c2 * how.doclen[row])
        return bm25
    return None


@numba.njit(cache=True, nogil=True)
def bm25_score_rows(offsets, P, tfs, doclen, qptr, qterms, qweights, k1, b, avgdl,
                    rows, out):
    """BM25 scores of given rows (binary search per term); NaN for rows out of range.

    Accumulates in the same order and precision as ``bm25_search``, so scores are equal.
    """
    how = BM25Rows(P, tfs, doclen, k1 + 1.0, k1 * (1.0 - b), k1 * b / avgdl)
    score_rows(offsets, how, len(doclen), qptr, qterms, qweights, rows, out)


@numba.njit(cache=True, nogil=True)
def dot_search(offsets, docs, vals, qptr, qterms, qweights, has_allow, allow,
               scores, seen, touched, out_s, out_i):
    """Sparse dot-product top-k (learned sparse vectors): sum of qweight x posting value."""
    k = out_s.shape[1]
    for q in range(len(qptr) - 1):
        n = 0
        for j in range(qptr[q], qptr[q + 1]):
            t = qterms[j]
            w = qweights[j]
            for p in range(offsets[t], offsets[t + 1]):
                d = docs[p]
                if has_allow and not allow[d]:
                    continue
                scores[d] += w * vals[p]
                if seen[d] == 0:
                    seen[d] = 1
                    touched[n] = d
                    n += 1
        _select(scores, seen, touched, n, k, out_s[q], out_i[q])


class DotRows(NamedTuple):
    """A sparse dot product over plain postings (``vals``: each posting's weight)."""
    docs: np.ndarray
    vals: np.ndarray


@overload(term_score, jit_options={"cache": True, "nogil": True})
def _dot_term(how, w, pos, row):
    if scorer_of(how, DotRows):
        return lambda how, w, pos, row: w * how.vals[pos]
    return None


@numba.njit(cache=True, nogil=True)
def dot_score_rows(offsets, docs, vals, n_rows, qptr, qterms, qweights, rows, out):
    """Sparse dot-product scores of given rows; NaN for rows out of range."""
    score_rows(offsets, DotRows(docs, vals), n_rows, qptr, qterms, qweights, rows, out)


@numba.njit(cache=True, nogil=True)
def count_live(offsets, P, terms, live):
    """Per term, how many of its postings are on live rows (df over live docs)."""
    out = np.zeros(len(terms), np.int64)
    for i in range(len(terms)):
        out[i] = docids.count_live(P, offsets, terms[i], live)
    return out


# --------------------------------------------------------------------------- helpers

def run_search(kernel, args: tuple, pool: BufferPool, nq: int, k: int,
               allow: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Call a ``*_search`` kernel (``args`` = its arguments before ``has_allow``)."""
    out_s = np.empty((nq, k), np.float32)
    out_i = np.empty((nq, k), np.int64)
    bufs = pool.get()
    if allow is None:
        kernel(*args, False, _NO_ALLOW, *bufs, out_s, out_i)
    else:
        kernel(*args, True, allow, *bufs, out_s, out_i)
    pool.put(bufs)  # not on an exception: the buffers may not be zeroed then
    return out_s, out_i


def check_allow(allow, n_rows: int, where: str) -> np.ndarray | None:
    """Validate an allow-mask (bool per segment row, or None)."""
    if allow is None:
        return None
    allow = np.asarray(allow)
    if allow.dtype != np.bool_ or allow.shape != (n_rows,):
        raise ValueError(f"{where}: allow must be a bool array of shape ({n_rows},), "
                         f"got {allow.dtype} {allow.shape}")
    return readonly(np.ascontiguousarray(allow))
