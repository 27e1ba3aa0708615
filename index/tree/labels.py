"""Node labels of the ``tree`` kind: each concept's most characteristic terms.

Terms are the lexical analyzer's (``index/lexical/analyzer.py``: lowercase, stopwords out, Snowball
stems), counted once per document (document frequency). A node's term ``t`` scores
``p_n(t) * log(p_n(t) / p_parent(t))`` with ``p_n(t)`` = share of the node's documents that
contain ``t``: frequent in the node and more frequent than in its parent, i.e. what sets the
node apart from its siblings (the root is contrasted with a uniform background: ``p log 1/p``).
Nodes of five or more documents skip terms found in only one of them. Labels show a surface
word for each stem (the shortest word of the texts that stems to it).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from polyindex.index.lexical.analyzer import Analyzer

N_TERMS = 3
MIN_DF2_SIZE = 5  # nodes this large label only with terms of two or more of their documents
_WORD = re.compile(r"\w\w+", re.UNICODE)
_ANALYZER = Analyzer()


def node_labels(texts: Sequence[str], docs: np.ndarray, doc_start: np.ndarray,
                doc_end: np.ndarray, parent: np.ndarray, count: np.ndarray,
                n_terms: int = N_TERMS) -> list[str]:
    """One label per node (nodes in breadth-first order, parents first); ``docs`` are the rows
    in depth-first order and ``docs[doc_start[i]:doc_end[i]]`` those under node i."""
    n_nodes = len(parent)
    terms = _ANALYZER.analyze_many(texts)
    vocab: dict[str, int] = {}
    indptr, indices = [0], []
    for row in docs.tolist():  # depth-first order: every node's documents are one row range
        ids = {vocab.setdefault(t, len(vocab)) for t in terms[row]}
        indices.extend(ids)
        indptr.append(len(indices))
    if not vocab:
        return [""] * n_nodes
    m = sp.csr_matrix((np.ones(len(indices), np.float32), np.asarray(indices, np.int64),
                       np.asarray(indptr, np.int64)), shape=(len(docs), len(vocab)))
    lengths = doc_end - doc_start
    a = sp.csr_matrix((np.ones(int(lengths.sum()), np.float32),
                       np.concatenate([np.arange(s, e) for s, e in zip(doc_start, doc_end)]),
                       np.concatenate([[0], np.cumsum(lengths)])), shape=(n_nodes, len(docs)))
    df = (a @ m).tocsr()  # node x term document frequency
    df.sort_indices()
    has_parent = parent >= 0
    par_df = df[np.where(has_parent, parent, 0)]
    # a child's terms are a subset of its parent's: same pattern, so the data arrays align
    par_on = par_df.multiply(df.astype(bool)).tocsr()
    par_on.sort_indices()
    size = np.maximum(count, 1).astype(np.float64)
    rows = np.repeat(np.arange(n_nodes), np.diff(df.indptr))
    p_node = df.data / size[rows]
    par_size = np.where(has_parent, size[np.maximum(parent, 0)], 1.0)
    p_par = np.where(has_parent[rows], par_on.data / par_size[rows], 1.0)
    score = p_node * np.log(np.where(has_parent[rows], p_node / p_par, 1.0 / p_node))
    score[(df.data < 2) & (count[rows] >= MIN_DF2_SIZE)] = -np.inf
    score[score <= 0] = -np.inf
    stems = np.empty(len(vocab), object)
    stems[list(vocab.values())] = list(vocab.keys())
    picked: list[list[str]] = []
    for i in range(n_nodes):
        lo, hi = df.indptr[i], df.indptr[i + 1]
        s = score[lo:hi]
        top = np.argsort(-s, kind="stable")[:n_terms]
        picked.append([stems[df.indices[lo + j]] for j in top if np.isfinite(s[j])])
    surface = _surface_words(texts, {t for p in picked for t in p})
    return [", ".join(surface.get(t, t) for t in p) for p in picked]


def _surface_words(texts: Sequence[str], stems: set[str]) -> dict[str, str]:
    """stem -> the shortest word of the texts that the analyzer turns into it."""
    if not stems:
        return {}
    words: set[str] = set()
    for text in texts:
        if text:
            words.update(_WORD.findall(text.lower()))
    out: dict[str, str] = {}
    for word in sorted(words, key=lambda w: (len(w), w)):
        stem = _ANALYZER.analyze(word)
        if len(stem) == 1 and stem[0] in stems and stem[0] not in out:
            out[stem[0]] = word
    return out
