"""Term lookup in a segment's vocabulary without Python strings: binary search over the
sorted Arrow string column's offsets and UTF-8 bytes, in numba (the lexical kind's)."""
from __future__ import annotations

import numba
import numpy as np
import pyarrow as pa

from polyindex.index.docids import count_live

# A segment's vocabulary is its sorted Arrow string column, memory-mapped: terms are found by
# binary search over the column's offsets and UTF-8 bytes (byte order is code point order, the
# order ``sorted`` gives Python strings), not through a dict of Python strings per segment.


def string_buffers(arr) -> tuple[np.ndarray, np.ndarray]:
    """Zero-copy (offsets int32 (n + 1,), data uint8) of an Arrow string array or column."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else (
            arr.combine_chunks() if arr.num_chunks else pa.array([], pa.string()))
    n = len(arr)
    _, obuf, dbuf = arr.buffers()
    if n == 0 or obuf is None:
        return np.zeros(1, np.int32), np.zeros(0, np.uint8)
    offsets = np.frombuffer(obuf, np.int32)[arr.offset:arr.offset + n + 1]
    data = np.zeros(0, np.uint8) if dbuf is None else np.frombuffer(dbuf, np.uint8)
    return offsets, data


def encode_terms(terms) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 (n + 1,), UTF-8 bytes uint8) of Python strings, for ``find_terms``."""
    enc = [t.encode("utf-8", "surrogatepass") for t in terms]
    offsets = [0]
    at = 0
    for b in enc:  # a query's few terms: plain Python beats numpy's per-call overhead here
        at += len(b)
        offsets.append(at)
    return np.array(offsets, np.int64), np.frombuffer(b"".join(enc), np.uint8)


@numba.njit(cache=True, nogil=True, inline="always")
def _cmp(a, a0, a1, b, b0, b1):
    """Compare the byte strings a[a0:a1] and b[b0:b1]: -1, 0 or 1."""
    la, lb = a1 - a0, b1 - b0
    for i in range(min(la, lb)):
        x, y = a[a0 + i], b[b0 + i]
        if x != y:
            return -1 if x < y else 1
    return -1 if la < lb else (1 if la > lb else 0)


@numba.njit(cache=True, nogil=True)
def _find_one(voff, vdata, qdata, q0, q1):
    lo, hi = 0, len(voff) - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        if _cmp(vdata, voff[mid], voff[mid + 1], qdata, q0, q1) < 0:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(voff) - 1 and _cmp(vdata, voff[lo], voff[lo + 1], qdata, q0, q1) == 0:
        return lo
    return -1


@numba.njit(cache=True, nogil=True, inline="always")
def _fnv(data, a, b):
    """FNV-1a hash of the bytes data[a:b]."""
    h = np.uint64(14695981039346656037)
    for i in range(a, b):
        h = (h ^ np.uint64(data[i])) * np.uint64(1099511628211)
    return h


@numba.njit(cache=True, nogil=True)
def build_hash(voff, vdata):
    """An open-addressing table (a power of two >= 2 x the terms; -1 free) of a vocabulary's
    term ids by their bytes' hash: many lookups of another vocabulary's terms cost a hash
    and a compare or two each, where a binary search costs ~15 compares on scattered bytes."""
    n = len(voff) - 1
    size = 2
    while size < 2 * n:
        size *= 2
    table = np.full(size, -1, np.int32)
    mask = np.uint64(size - 1)
    for t in range(n):
        j = _fnv(vdata, voff[t], voff[t + 1]) & mask
        while table[j] >= 0:
            j = (j + np.uint64(1)) & mask
        table[j] = t
    return table


@numba.njit(cache=True, nogil=True, inline="always")
def hash_find(table, voff, vdata, qdata, q0, q1):
    """The term id of the bytes qdata[q0:q1] in a vocabulary with its ``build_hash`` table,
    -1 where absent."""
    mask = np.uint64(len(table) - 1)
    j = _fnv(qdata, q0, q1) & mask
    while True:
        t = table[j]
        if t < 0:
            return -1
        if _cmp(vdata, voff[t], voff[t + 1], qdata, q0, q1) == 0:
            return t
        j = (j + np.uint64(1)) & mask


@numba.njit(cache=True, nogil=True)
def find_terms(voff, vdata, qoff, qdata):
    """Term id (position in the sorted vocabulary) of each query term, -1 where absent."""
    out = np.empty(len(qoff) - 1, np.int64)
    for i in range(len(qoff) - 1):
        out[i] = _find_one(voff, vdata, qdata, qoff[i], qoff[i + 1])
    return out


@numba.njit(cache=True, nogil=True)
def query_terms(voff, vdata, qoff, qdata, qweights, qptr, scale):
    """Per query of a batch (``qptr`` cuts the flat encoded terms), the segment-local ids and
    weights (x ``scale``) of its terms found in the vocabulary, in order: (qptr, ids, ws)."""
    n = len(qoff) - 1
    ids = np.empty(n, np.int64)
    ws = np.empty(n, np.float64)
    out_ptr = np.zeros(len(qptr), np.int64)
    m = 0
    for q in range(len(qptr) - 1):
        for j in range(qptr[q], qptr[q + 1]):
            t = _find_one(voff, vdata, qdata, qoff[j], qoff[j + 1])
            if t >= 0:
                ids[m] = t
                ws[m] = qweights[j] * scale
                m += 1
        out_ptr[q + 1] = m
    return out_ptr, ids[:m], ws[:m]


@numba.njit(cache=True, nogil=True)
def add_doc_freqs(voff, vdata, qoff, qdata, offsets, P, df, has_live, live, total):
    """``total[i]`` += the segment's document frequency of term i (over live rows when
    ``has_live``); terms absent from the vocabulary add nothing."""
    for i in range(len(qoff) - 1):
        t = _find_one(voff, vdata, qdata, qoff[i], qoff[i + 1])
        if t < 0:
            continue
        if has_live:
            total[i] += count_live(P, offsets, t, live)
        else:
            total[i] += df[t]


