"""Feature vectors of (query, candidate) pairs for the rerank stage, a query batch at a time.

``compute`` returns a float32 matrix, one row per candidate (queries' candidates one after the
other, in the given order) and one column per ``schema.names_for(kinds)`` (``schema.NAMES``,
then ``vec_sim@FIELD`` per named vector field), and the row offsets of each query. Lexical features come from the numba kernel over each segment's forward index with
collection-wide statistics (``stats``); the dense cosine from the stored embeddings; fusion
features from the retrieve stages' lists; the other kinds' own scores (``kind_scores``) when
the collection has them, and so the named vector fields' similarities. Missing values are NaN.
"""
from __future__ import annotations

import weakref
from typing import Sequence

import numpy as np

from polyindex.index.lexical import vocabulary
from polyindex.index.protocol import StoredVectors, implements
from polyindex.rerank import kernels, kind_scores, quality, schema, window
from polyindex.rerank.stats import (
    candidate_terms,
    field_stats,
    forward_index,
    lexical_of,
    vocab_buffers,
)

F = len(schema.NAMES)  # columns of a collection without named vector fields
_COL = schema.INDEX
_SCRATCH: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lexical seg -> free buffers


def compute(snapshot, queries: Sequence, candidates: Sequence[tuple[np.ndarray, np.ndarray]],
            stage_lists: Sequence[list], stage_names: Sequence[str],
            blind=None) -> tuple[np.ndarray, np.ndarray]:
    """(features (n, len(names(snapshot))) float32, query row offsets (nq + 1,) int64) of a
    batch's candidates. ``blind``: (pruned keys among them, per stage whether it is blind to
    them), or None (``query.pipeline.blind_keys``)."""
    X, qptr = compute_local(snapshot, queries, [k for k, _ in candidates])
    if not len(X):
        return X, qptr
    keys = np.concatenate([np.asarray(k, np.int64) for k, _ in candidates])
    if "dense" in snapshot.kinds:
        dense_features(stored_vectors(snapshot, keys), queries, qptr, X)
    fusion_features(keys, stage_lists, stage_names, qptr, X, blind)
    X[:, _COL["fused_score"]] = np.concatenate([np.asarray(f, np.float32) for _, f in candidates])
    return X, qptr


def compute_local(snapshot, queries: Sequence, candidate_keys: Sequence[np.ndarray]
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The columns a candidate's own segment answers (lexical, the kinds' scores, the named
    vector fields); the dense and fusion columns, which depend on the whole window, are left
    NaN (``compute`` fills them; a sharded router fills them from every shard's rows)."""
    counts = np.fromiter((len(k) for k in candidate_keys), np.int64, count=len(candidate_keys))
    qptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    extra = schema.vector_features(snapshot.kinds)
    X = np.full((int(qptr[-1]), F + len(extra)), np.nan, np.float32)
    if not len(X):
        return X, qptr
    keys = np.concatenate([np.asarray(k, np.int64) for k in candidate_keys])
    q_of = np.repeat(np.arange(len(candidate_keys)), counts)
    seg, rows = snapshot.locate(keys)
    if "lexical" in snapshot.kinds:
        stats = field_stats(snapshot)
        groups = {s: np.flatnonzero(seg == s) for s in np.unique(seg).tolist()}
        needs = candidate_terms(snapshot.segments, groups, rows)
        stats.fill(needs)  # every segment's at once: a term shared by several is summed once
        _lexical(snapshot, stats, groups, queries, q_of, rows, X)
        quality.compute(snapshot, stats, groups, rows,
                        X[:, _COL["doc_unique_ratio"]:_COL["doc_kl_coll"] + 1])
    _doc_quality(snapshot, seg, rows, X[:, _COL["doc_quality"]])
    for kind, name in schema.KIND_SCORES.items():
        if kind in snapshot.kinds:
            X[:, _COL[name]] = kind_scores.score(snapshot, kind, queries, q_of, seg, rows)
    for i, name in enumerate(extra):  # NaN where the query has no vector for the field
        field = name[len(schema.VECTOR_PREFIX):]
        X[:, F + i] = kind_scores.score(snapshot, f"dense@{field}", queries, q_of, seg, rows)
    return X, qptr


def _doc_quality(snapshot, seg: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """The stored quality estimate of each candidate (``rerank.doc_quality``; NaN where its
    segment stores none)."""
    for s in np.unique(seg).tolist():
        docs = getattr(snapshot.segments[s], "docs", None)
        if hasattr(docs, "quality"):
            sel = np.flatnonzero(seg == s)
            out[sel] = docs.quality()[rows[sel]]


def names(snapshot) -> tuple[str, ...]:
    """The columns ``compute`` gives for a snapshot's collection."""
    return schema.names_for(snapshot.kinds)


# ------------------------------------------------------------------------------- lexical

def _query_slots(queries, stats, segments):
    """Slots (distinct analyzed terms) of every query: terms, counts, statistics, sequences."""
    analyzer = lexical_of(segments[0]).analyzer  # the analyzer the index was built with
    terms, qtf, seq, sptr, seqptr, has_text = [], [], [], [0], [0], []
    for q in queries:
        text = getattr(q, "text", None)
        has_text.append(isinstance(text, str))
        slots: dict[str, int] = {}
        for t in analyzer.analyze(text) if has_text[-1] else []:
            k = slots.setdefault(t, len(slots))
            if k == len(qtf) - sptr[-1]:
                terms.append(t)
                qtf.append(0)
            qtf[sptr[-1] + k] += 1
            seq.append(k)
        sptr.append(len(terms))
        seqptr.append(len(seq))
    idf, pc = stats.query_terms(terms)
    return (terms, np.array(qtf, np.float64), idf, pc, np.array(sptr, np.int64),
            np.array(seq, np.int64), np.array(seqptr, np.int64), np.array(has_text))


def _lexical(snapshot, stats, groups: dict[int, np.ndarray], queries, q_of, rows, X) -> None:
    """``groups``: per segment, its candidates (their term numbers filled in ``stats``)."""
    segments = snapshot.segments
    terms, qtf, idf, pc, sptr, seq, seqptr, has_text = _query_slots(queries, stats, segments)
    # Query-level features (NaN for queries without text: they have no lexical side).
    n_slots = np.diff(sptr)
    idf_all = np.where(pc[:, 2] > 0, idf[:, 2], 0.0)
    q_idf = np.bincount(np.repeat(np.arange(len(queries)), n_slots), weights=idf_all,
                        minlength=len(queries))
    per_q = np.stack([np.diff(seqptr), n_slots, q_idf], axis=1).astype(np.float32)
    per_q[~has_text] = np.nan
    X[:, _COL["q_terms"]:_COL["q_terms"] + 3] = per_q[q_of]
    X[:, _COL["q_idf_max"]:_COL["q_idf_max"] + 3] = _query_difficulty(qtf, idf, pc, sptr,
                                                                      has_text)[q_of]
    ok = has_text[q_of]
    qoff, qdata = vocabulary.encode_terms(terms)  # once; looked up in each segment
    for s, sel in groups.items():
        sel = sel[ok[sel]]
        if not len(sel):
            continue
        opened = segments[s]
        lex = lexical_of(opened)
        row_ptr, title_len, ids = forward_index(opened)
        slot_tid = vocabulary.find_terms(*vocab_buffers(lex), qoff, qdata)
        idf_s, _ = stats.arrays(s)
        bufs = _take_scratch(lex)
        kernels.lexical_features(row_ptr, title_len, ids, idf_s, stats.avg_len, slot_tid, qtf,
                                 idf, pc, sptr, seq, seqptr, q_of[sel], rows[sel], sel,
                                 bufs[0], bufs[1], X)
        _SCRATCH.setdefault(lex, []).append(bufs)  # not on an exception: maybe not reset


def _query_difficulty(qtf, idf, pc, sptr, has_text) -> np.ndarray:
    """(nq, 3): idf max and mean over the query's distinct terms found in the collection
    ("all" field), and its simplified clarity score, sum_t P(t|q) log(P(t|q) / P(t|C)) over
    those terms (He and Ounis 2004): what a collection's queries look like, query by query."""
    out = np.full((len(sptr) - 1, 3), np.nan, np.float32)
    for q in range(len(sptr) - 1):
        lo, hi = sptr[q], sptr[q + 1]
        found = pc[lo:hi, 2] > 0
        if not has_text[q] or not found.any():
            continue
        i = idf[lo:hi, 2][found]
        p_q = qtf[lo:hi][found] / qtf[lo:hi][found].sum()
        out[q] = (i.max(), i.mean(), float((p_q * np.log(p_q / pc[lo:hi, 2][found])).sum()))
    return out


def _take_scratch(lex) -> tuple[np.ndarray, np.ndarray]:
    try:
        return _SCRATCH[lex].pop()
    except (KeyError, IndexError):
        n = lex.n_terms
        return np.full(n, -1, np.int64), np.zeros(n, np.int32)


# ------------------------------------------------------------------------------- neural

def _stored(opened) -> StoredVectors:
    dense = opened.indexes["dense"]
    if not implements(dense, StoredVectors):
        raise TypeError(f"the dense index {type(dense).__name__} does not give stored vectors")
    return dense


def stored_vectors(snapshot, keys: np.ndarray) -> np.ndarray:
    """(len(keys), d) float32: the stored dense embeddings of snapshot keys."""
    seg, rows = snapshot.locate(keys)
    if len(snapshot.segments) == 1:
        return np.ascontiguousarray(_stored(snapshot.segments[0]).vectors(rows), np.float32)
    vecs = None
    for s in np.unique(seg).tolist():
        sel = np.flatnonzero(seg == s)
        v = _stored(snapshot.segments[s]).vectors(rows[sel])
        if vecs is None:
            vecs = np.empty((len(rows), v.shape[1]), np.float32)
        vecs[sel] = v
    return vecs


def dense_features(vecs: np.ndarray, queries, qptr, X) -> None:
    """Cosine of each candidate with the query and with its query's pseudo-relevant centroid
    (the mean embedding of the first ``schema.PRF_DOCS`` candidates in fused order)."""
    has_vec = np.array([getattr(q, "vector", None) is not None for q in queries])
    qv = np.zeros((len(queries), vecs.shape[1]), np.float32)
    for i, q in enumerate(queries):
        if has_vec[i]:
            qv[i] = q.vector
    window.dense_features(np.ascontiguousarray(vecs, np.float32), qptr, qv, has_vec,
                           schema.PRF_DOCS, _COL["dense_cos"], _COL["dense_prf_cos"], X)
    gone = np.isnan(vecs[:, 0]) if len(vecs) else np.zeros(0, bool)
    if gone.any():
        _abstain(gone, qptr, [_COL["dense_cos"], _COL["dense_prf_cos"]], X)


def _abstain(gone: np.ndarray, qptr, cols, X) -> None:
    """A candidate pruned out of dense (no vector) takes its window's median cosines: dense
    abstains on it, as it does in fusion (``query.pruning``). Left NaN, the general ranker
    (trained where every candidate has a vector) read it as a cosine of 0 and sank it:
    bench_prune's ltr lost 7% to 19% at P = 0.25."""
    for q in np.unique(np.searchsorted(qptr, np.flatnonzero(gone), side="right") - 1).tolist():
        lo, hi = int(qptr[q]), int(qptr[q + 1])
        miss = gone[lo:hi]
        if miss.all():
            continue
        for c in cols:
            X[lo:hi, c][miss] = np.median(X[lo:hi, c][~miss])


# ------------------------------------------------------------------------------- fusion

def _stand_in(keys, qptr, blind, all_scores, rrf, ranks) -> None:
    """A stage blind to a pruned candidate abstains, as fusion lets it (``query.pruning``):
    it ranks the candidate where the seeing stages best rank it, with the score it gives that
    rank, so its rank, score, RRF and agreement features look like a document every stage
    found. Left as "not found", the ranker (which never saw a pruned window) sank it."""
    pruned_keys, stage_blind = blind
    see = [2 * s for s, b in enumerate(stage_blind) if not b]
    if not see or all(not b for b in stage_blind):
        return
    rows = np.flatnonzero(np.isin(keys, pruned_keys))
    best = np.fmin.reduce(ranks[np.ix_(rows, see)], axis=1) if len(see) > 1 \
        else ranks[rows, see[0]]
    rows, best = rows[~np.isnan(best)], best[~np.isnan(best)]
    if not len(rows):
        return
    q_of = np.searchsorted(qptr, rows, side="right") - 1
    at = best.astype(np.int64) - 1
    for s, b in enumerate(stage_blind):
        if not b:
            continue
        sc = all_scores[s]
        ok = at < sc.shape[1]
        score = np.full(len(rows), np.nan, np.float32)
        score[ok] = sc[q_of[ok], at[ok]]
        ranks[rows, 2 * s] = best
        ranks[rows, 2 * s + 1] = np.where(np.isfinite(score), score, np.nan)
        rrf[rows] += 1.0 / (schema.RRF_K + best)


def fusion_features(keys, stage_lists, stage_names, qptr, X, blind=None) -> None:
    """Each retrieve stage's rank and score of the candidates, their RRF and fused rank.
    ``blind`` as in ``compute``: a blind stage abstains on a pruned candidate (``_stand_in``)."""
    rrf = np.zeros(len(keys))
    ranks = np.full((len(keys), max(len(stage_names), 1) * 2), np.nan, np.float32)
    all_scores = []
    for s, name in enumerate(stage_names):
        scores = np.stack([lists[s][0] for lists in stage_lists]).astype(np.float32, copy=False)
        skeys = np.stack([lists[s][1] for lists in stage_lists]).astype(np.int64, copy=False)
        window.stage_features(keys, qptr, skeys, scores, 2 * s, 2 * s + 1,
                              float(schema.RRF_K), rrf, ranks)
        all_scores.append(scores)
    if blind is not None and len(blind[0]):
        _stand_in(keys, qptr, blind, all_scores, rrf, ranks)
    for s, name in enumerate(stage_names):
        if name in schema.STAGES:
            X[:, _COL[f"{name}_rank"]] = ranks[:, 2 * s]
            X[:, _COL[f"{name}_score"]] = ranks[:, 2 * s + 1]
    X[:, _COL["rrf"]] = rrf
    stage_ranks = ranks[:, 0::2]  # agreement of every retrieve stage of the profile
    found = ~np.isnan(stage_ranks)
    X[:, _COL["n_found"]] = found.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        X[:, _COL["best_rank"]] = np.where(found.any(1), np.fmin.reduce(stage_ranks, 1), np.nan)
        X[:, _COL["mean_rank"]] = np.nansum(stage_ranks, 1) / found.sum(1)
    X[:, _COL["fused_rank"]] = np.arange(len(keys)) - np.repeat(qptr[:-1], np.diff(qptr)) + 1
