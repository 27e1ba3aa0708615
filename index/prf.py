"""Pseudo-relevance feedback: RM3 for the lexical index, Rocchio for the dense index.

Both are stage options (search params of a retrieve stage): ``prf=rm3`` on a lexical stage,
``prf=rocchio`` on a dense stage. A kind's ``prepare`` runs a first pass, takes the feedback
documents as the *global* top ``fb_docs`` over every segment of the snapshot (live rows; not
per segment), and returns the expanded query, which the stage then searches as usual.

**RM3** (Lavrenko and Croft's relevance model, interpolated with the query as in Anserini /
Pyserini; defaults ``fb_docs=10``, ``fb_terms=10``, ``fb_max_df=0.1`` as Pyserini/Anserini, but
``orig_weight=0.8`` instead of Pyserini's 0.5: chosen from {0.5, 0.7, 0.8} by leave-one-
collection-out over the ten shared collections, where every left-out collection picked 0.8;
at 0.5 the feedback terms outweighed the query and nDCG@10 fell on 6 of 10, see
bench/README.md). With first-pass scores ``s_i`` of the feedback documents ``D_i``:

1. a document keeps the terms whose collection-wide document frequency is at most
   ``fb_max_df`` x N (Anserini's df filter: collection-specific near-stopwords carry no
   topic); ``P(t|D_i) = tf(t, D_i) / (sum of tf of the kept terms of D_i)``;
2. ``RM1(t) = sum_i s_i P(t|D_i)``; the ``fb_terms`` largest are kept (ties: term order)
   and scaled to sum 1;
3. ``P(t|Q) = count(t, Q) / |Q|`` over the analyzed query;
4. ``w(t) = orig_weight P(t|Q) + (1 - orig_weight) RM1(t)``.

The expanded query scores ``sum_t w(t) idf(t) tfc(t, D)`` with the collection's BM25 variant.
Document frequencies (the filter, the idf) are collection-wide, so the expansion does not
depend on how documents fell into segments. Unlike Anserini, a feedback document's vector is
not cut to its ``fb_terms`` most frequent terms before step 2: that cut breaks ties between
tf = 1 terms arbitrarily, and it lost in the same leave-one-collection-out comparison
(``fb_doc_terms=N`` makes the cut, to N terms, ties by term order).

**Rocchio** for the dense vector: ``q' = orig_weight q + (1 - orig_weight) mean(d_1..d_n)``
over the stored embeddings of the top ``fb_docs`` documents, L2-normalized (the index scores
inner products of unit vectors). Defaults ``fb_docs=3``, ``orig_weight=0.5`` (the query
and the mean of its three nearest documents weigh the same) were set before measuring, not
tuned on the shared collections.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from polyindex.errors import InvalidArgument

LEXICAL_KEYS = ("prf", "fb_docs", "fb_terms", "orig_weight", "fb_max_df", "fb_doc_terms")
DENSE_KEYS = ("prf", "fb_docs", "orig_weight")


@dataclass(frozen=True)
class RM3:
    fb_docs: int = 10
    fb_terms: int = 10
    orig_weight: float = 0.8
    max_df: float = 0.1
    doc_terms: int = 0  # > 0: Anserini's cut of each document to its most frequent terms


@dataclass(frozen=True)
class Rocchio:
    fb_docs: int = 3
    orig_weight: float = 0.5


def _int(opts, key, default, where, lo, hi):
    if key not in opts:
        return default
    try:
        v = int(opts[key])
    except ValueError:
        raise InvalidArgument(f"{where}: {key}={opts[key]!r} is not an integer") from None
    if not lo <= v <= hi:
        raise InvalidArgument(f"{where}: {key} must be in {lo}..{hi}, got {v}")
    return v


def _unit(opts, key, default, where):
    if key not in opts:
        return default
    try:
        v = float(opts[key])
    except ValueError:
        raise InvalidArgument(f"{where}: {key}={opts[key]!r} is not a number") from None
    if not 0.0 <= v <= 1.0:
        raise InvalidArgument(f"{where}: {key} must be in [0, 1], got {v}")
    return v


def _method(opts: dict[str, str], keys: Sequence[str], want: str, where: str) -> bool:
    """Whether ``prf=<want>`` is asked for; other feedback keys without it are an error."""
    method = opts.get("prf", "none").strip().lower()
    if method not in ("none", want):
        raise InvalidArgument(f"{where}: prf={opts['prf']!r}; this index knows prf={want} "
                              f"(or none)")
    given = sorted(k for k in keys if k != "prf" and k in opts)
    if given and method == "none":
        raise InvalidArgument(f"{where}: {', '.join(given)} need prf={want}")
    return method == want


def parse_rm3(opts: dict[str, str], where: str) -> RM3 | None:
    if not _method(opts, LEXICAL_KEYS, "rm3", where):
        return None
    return RM3(fb_docs=_int(opts, "fb_docs", RM3.fb_docs, where, 1, 1000),
               fb_terms=_int(opts, "fb_terms", RM3.fb_terms, where, 1, 1000),
               orig_weight=_unit(opts, "orig_weight", RM3.orig_weight, where),
               max_df=_unit(opts, "fb_max_df", RM3.max_df, where),
               doc_terms=_int(opts, "fb_doc_terms", RM3.doc_terms, where, 0, 100_000))


def parse_rocchio(opts: dict[str, str], where: str) -> Rocchio | None:
    if not _method(opts, DENSE_KEYS, "rocchio", where):
        return None
    return Rocchio(fb_docs=_int(opts, "fb_docs", Rocchio.fb_docs, where, 1, 1000),
                   orig_weight=_unit(opts, "orig_weight", Rocchio.orig_weight, where))


def global_top(segments: Sequence, live: Sequence[np.ndarray | None],
               search: Callable[[object, np.ndarray | None], tuple[np.ndarray, np.ndarray]],
               k: int, nq: int) -> list[list[tuple[int, int, float]]]:
    """Per query, the top ``k`` (segment ordinal, row, score) over all segments: each
    segment's top k by ``search(segment, live mask)``, merged (ties: earlier segment, then
    the segment's own order), the way the query pipeline merges a stage."""
    parts = []
    for s, (seg, mask) in enumerate(zip(segments, live)):
        if seg.n_rows == 0:
            continue
        scores, rows = search(seg, mask)
        parts.append((s, scores, rows))
    out = []
    for q in range(nq):
        cand = [(s, int(r), float(v)) for s, scores, rows in parts
                for r, v in zip(rows[q].tolist(), scores[q].tolist()) if r >= 0]
        cand.sort(key=lambda c: -c[2])  # stable: segment order, then rank within it
        out.append(cand[:k])
    return out


def rm3_weights(query_counts: dict[str, int], feedback: Sequence[tuple[dict[str, int], float]],
                opts: RM3) -> dict[str, float]:
    """RM3 term weights (steps 2-4 above) from the query's term counts and, per feedback
    document, its kept terms' counts (step 1 done by the caller) and first-pass score."""
    rm1: dict[str, float] = {}
    for counts, score in feedback:
        if opts.doc_terms:
            counts = dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:opts.doc_terms])
        norm = sum(counts.values())
        if norm <= 0:
            continue
        for t, c in counts.items():
            rm1[t] = rm1.get(t, 0.0) + score * c / norm
    top = sorted(rm1.items(), key=lambda kv: (-kv[1], kv[0]))[:opts.fb_terms]
    total = sum(v for _, v in top)
    qlen = sum(query_counts.values())
    lam = opts.orig_weight
    if total <= 0:  # no feedback: the query alone
        return {t: c / qlen for t, c in query_counts.items()}
    out = {t: lam * c / qlen for t, c in query_counts.items()}
    for t, v in top:
        out[t] = out.get(t, 0.0) + (1.0 - lam) * v / total
    return out


def rocchio(vectors: np.ndarray, feedback: Sequence[np.ndarray], opts: Rocchio) -> np.ndarray:
    """Rocchio-expanded query vectors, L2-normalized; ``feedback[q]`` is (n_q, d) stored
    embeddings of query q's feedback documents (n_q = 0: the query is kept as it is)."""
    out = np.array(vectors, dtype=np.float32, copy=True)
    for q, fb in enumerate(feedback):
        if len(fb) == 0:
            continue
        v = opts.orig_weight * out[q] + (1.0 - opts.orig_weight) * fb.mean(axis=0)
        norm = float(np.linalg.norm(v))
        if norm > 0:
            out[q] = v / norm
    return np.ascontiguousarray(out)
