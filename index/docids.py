"""Doc ids of a lexical segment's postings in 16 bits: block-relative, random access kept.

A term's postings are cut into blocks of ``BLOCK`` (the blocks ``index/lexical/blockmax.py`` bounds).
Every posting stores its row's low 16 bits (``lo``, uint16). A block whose rows span fewer
than 65,536 also stores its first row (``first``, int32, one per block): rows ascend, so a
row is the first row plus the difference of their low bits modulo 2^16. A wider block (a
rare term in a large segment) keeps its rows' high 16 bits in ``wide`` (uint16) from
``wide_at[block]``; ``-1`` there marks a narrow block. A posting's row then costs 2 bytes
instead of 4 in the narrow blocks that hold nearly every posting, and 4 in the others.

``P = (boff, first, wide_at, lo, wide, shift)`` is what the numba kernels take; ``doc_at``
reads one row, ``block_of`` + ``row_in_block`` a block's rows in turn. Segments written
before (a plain int32 ``doc`` column) are the case where every block is wide, ``wide`` is
that column and ``shift`` 0 (``legacy``): one code path for both.
"""
from __future__ import annotations

import numba
import numpy as np

BLOCK = 128
_SHIFT = 7  # log2(BLOCK)
_SPAN = 1 << 16
SHIFT = 16  # a wide block's ``wide`` entries are its rows' high 16 bits


def block_offsets(offsets: np.ndarray) -> np.ndarray:
    """Per term, its first block (CSR over blocks, n_terms + 1): a term's postings make
    ``ceil(df / BLOCK)`` blocks, so this follows from the postings offsets alone."""
    nb = (np.diff(offsets) + (BLOCK - 1)) // BLOCK
    out = np.zeros(len(offsets), np.int64)
    np.cumsum(nb, out=out[1:])
    return out


@numba.njit(cache=True, nogil=True)
def _encode(offsets, docs, n_blocks):
    first = np.empty(n_blocks, np.int32)
    wide_at = np.empty(n_blocks, np.int64)
    lo = np.zeros(len(docs), np.uint16)
    n_wide = 0
    b = 0
    for t in range(len(offsets) - 1):
        for s in range(offsets[t], offsets[t + 1], BLOCK):
            e = min(s + BLOCK, offsets[t + 1])
            first[b] = docs[s]
            if docs[e - 1] - docs[s] >= _SPAN:
                wide_at[b] = n_wide
                n_wide += e - s
            else:
                wide_at[b] = -1
            for j in range(s, e):
                lo[j] = docs[j] & 0xFFFF
            b += 1
    wide = np.empty(n_wide, np.uint16)
    b = 0
    for t in range(len(offsets) - 1):
        for s in range(offsets[t], offsets[t + 1], BLOCK):
            if wide_at[b] >= 0:
                e = min(s + BLOCK, offsets[t + 1])
                for j in range(s, e):
                    wide[wide_at[b] + j - s] = docs[j] >> 16
            b += 1
    return first, wide_at, lo, wide


def encode(offsets: np.ndarray, docs: np.ndarray):
    """(first int32, wide_at int64 per block; lo uint16 per posting; wide uint16) of CSR
    postings whose rows ascend within each term (``P`` is these after the block offsets,
    with ``SHIFT``)."""
    return _encode(offsets, np.asarray(docs, np.int32), int(block_offsets(offsets)[-1]))


def legacy(offsets: np.ndarray, docs: np.ndarray) -> tuple:
    """``P`` of a plain int32 doc column: every block wide, ``wide`` the column itself."""
    boff = block_offsets(offsets)
    nb = np.diff(boff)
    term = np.repeat(np.arange(len(nb)), nb)
    wide_at = offsets[:-1][term] + (np.arange(boff[-1]) - boff[:-1][term]) * BLOCK
    return (boff, np.zeros(0, np.int32), wide_at.astype(np.int64), np.zeros(0, np.uint16),
            docs, 0)


@numba.njit(cache=True, nogil=True, inline="always")
def doc_at(P, offsets, t, j):
    """The row of term t's posting j (an index into the term's run of the postings)."""
    boff, first, wide_at, lo, wide, shift = P
    i = j - offsets[t]
    b = boff[t] + (i >> _SHIFT)
    w = wide_at[b]
    return row_in_block(lo, wide, shift, w, np.int64(first[b]) if w < 0 else np.int64(0),
                        j - (i & (BLOCK - 1)), j)


@numba.njit(cache=True, nogil=True, inline="always")
def row_in_block(lo, wide, shift, w, f, s, j):
    """The row of posting j of the block that starts at posting s (its ``wide_at`` w, its
    first row f): sequential reads look up a block's metadata once (``block_of``), then call
    this with P's arrays unpacked. Unpack ``P`` whole (``a, _, _, b, c, d = P``): reading
    it by index (``P[3]``) made numba's scan 2x slower."""
    if w < 0:  # rows ascend and span < 2^16 from f: the distance is the low bits' difference
        return f + ((np.int64(lo[j]) - (f & 0xFFFF)) & 0xFFFF)
    if shift:
        return (np.int64(wide[w + j - s]) << 16) | np.int64(lo[j])
    return np.int64(wide[w + j - s])


@numba.njit(cache=True, nogil=True, inline="always")
def block_of(P, offsets, t, b):
    """(first posting, end, wide_at, first row) of term t's block b (a global block index)."""
    boff, first, wide_at, _, _, _ = P
    s = offsets[t] + (b - boff[t]) * BLOCK
    w = wide_at[b]
    return s, min(s + BLOCK, offsets[t + 1]), w, np.int64(first[b]) if w < 0 else np.int64(0)


@numba.njit(cache=True, nogil=True, inline="always")
def find(P, offsets, t, row, lo, hi):
    """First posting of term t in [lo, hi) whose row is >= ``row`` (hi if none); the whole
    term is ``lo, hi = offsets[t], offsets[t + 1]``."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if doc_at(P, offsets, t, mid) < row:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def count_live(P, offsets, t, live):
    """How many of term t's postings are on live rows (its df over live documents)."""
    boff, _, _, lo, wide, shift = P
    c = 0
    for b in range(boff[t], boff[t + 1]):
        s, e, w, f = block_of(P, offsets, t, b)
        for j in range(s, e):
            if live[row_in_block(lo, wide, shift, w, f, s, j)]:
                c += 1
    return c


@numba.njit(cache=True, nogil=True)
def blocks_valid(P, offsets, n_rows):
    """Whether every block's metadata stays inside the arrays and the rows: a narrow block's
    first row in [0, n_rows), a wide block's run inside ``wide`` (a block's work, not a
    posting's: checked at every open, since the kernels do not bounds-check)."""
    boff, first, wide_at, lo, wide, shift = P
    if shift != SHIFT or len(first) != boff[-1] or len(wide_at) != boff[-1] \
            or len(lo) != offsets[-1]:
        return False
    for t in range(len(offsets) - 1):
        for b in range(boff[t], boff[t + 1]):
            n = min(BLOCK, offsets[t + 1] - offsets[t] - (b - boff[t]) * BLOCK)
            w = wide_at[b]
            if w >= 0:
                if w + n > len(wide):
                    return False
            elif w != -1 or first[b] < 0 or first[b] >= n_rows:
                return False
    return True


@numba.njit(cache=True, nogil=True)
def decode(P, offsets):
    """Every posting's row (int32), terms in order: checks of unsummed files, and tests."""
    out = np.empty(offsets[-1], np.int32)
    boff, _, _, lo, wide, shift = P
    for t in range(len(offsets) - 1):
        for b in range(boff[t], boff[t + 1]):
            s, e, w, f = block_of(P, offsets, t, b)
            for j in range(s, e):
                out[j] = row_in_block(lo, wide, shift, w, f, s, j)
    return out
