"""Query-agnostic document quality estimates (issue 21 part 4, the cheap estimators), as
rerank features of the candidates.

From each segment's lexical forward index (the document's analyzed terms, title first) and
the collection-wide statistics (``stats``): the unique-term ratio (distinct terms over
length: low for repetitive or boilerplate text) and the divergence of the document's
language model from the collection's, KL(P(t|D) || P(t|C)) over the document's terms (low
for text that says nothing particular: Bendersky et al. 2011's quality signals). Length is
already a feature (``all.length_norm``). Missing (empty documents): NaN.
"""
from __future__ import annotations

import math

import numba
import numpy as np

from polyindex.rerank.stats import forward_index


def compute(snapshot, stats, groups: dict[int, np.ndarray], rows: np.ndarray,
            out: np.ndarray) -> None:
    """out[:, 0]: unique-term ratio, out[:, 1]: KL from the collection, of each candidate
    (``groups``: per segment, its candidates, their terms' numbers filled in ``stats``):
    worked out for the candidates only, as the collection language model is the
    snapshot's (a table of every row would be rebuilt after every write)."""
    for s, sel in groups.items():
        row_ptr, _, ids = forward_index(snapshot.segments[s])
        _, p_coll = stats.arrays(s)
        vals = np.full((len(sel), 2), np.nan, np.float32)
        _estimates(row_ptr, ids, p_coll[2], rows[sel], vals)
        out[sel] = vals


@numba.njit(cache=True, nogil=True)
def _estimates(row_ptr, ids, p_coll, rows, out):
    for i in range(len(rows)):
        lo, hi = row_ptr[rows[i]], row_ptr[rows[i] + 1]
        if hi == lo:
            continue
        out[i, 0], out[i, 1] = term_estimates(np.sort(ids[lo:hi]), p_coll)


@numba.njit(cache=True, nogil=True)
def term_estimates(terms, p_coll):
    """(unique-term ratio, KL(P(t|D) || P(t|C))) of a document's sorted term ids (not empty);
    ids < 0 (terms the collection model never saw) count for the ratio, not for KL."""
    n = len(terms)
    distinct = 0
    kl = 0.0
    run = 1
    for j in range(1, n + 1):
        if j < n and terms[j] == terms[j - 1]:
            run += 1
            continue
        distinct += 1
        t = terms[j - 1]
        if t >= 0 and p_coll[t] > 0:
            p_d = run / n
            kl += p_d * math.log(p_d / p_coll[t])
        run = 1
    return distinct / n, kl
