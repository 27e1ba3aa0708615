"""Collection-wide per-field statistics for the rerank features, computed once per snapshot.

Fields are ``title``, ``body`` and ``all`` (title + text, what the lexical index scores). From
each segment's forward index (``lexical.forward.arrow``: each row's term ids in order, title
first) we count, over live rows, per term and field: document frequency and collection term
frequency, plus total field lengths. Sealed segments without tombstones keep their counts for
the life of the process (they never change); the collection-wide sums (and from them idf and
collection probabilities per segment-local term id) live in the snapshot's cache, so scores do
not depend on how documents fell into segments.

Segments built before the forward index existed get one built in memory from their documents
(same analyzer, so the same term ids), once per process.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from polyindex.index import postings
from polyindex.index.masks import MaskCache
from polyindex.index.protocol import TermStatistics, implements
from polyindex.rerank import kernels

CACHE_KEY = "rerank:fields"
GLOBAL = "lexical:global"  # the lexical index's entry for a shard's collection-wide table
_FORWARD: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lexical seg -> arrays
_COUNTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # lexical seg -> unmasked counts
# lexical seg -> counts per live mask: after a write only the segments whose mask changed
# are counted again
_MASKED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forward_index(opened) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row offsets int64, title_len int32, term ids int32) of an opened segment."""
    lex = lexical_of(opened)
    if lex.forward is not None:
        return lex.forward
    fwd = _FORWARD.get(lex)
    if fwd is None:
        fwd = _FORWARD[lex] = _build_forward(opened.docs, lex)
    return fwd


def lexical_of(opened) -> TermStatistics:
    """The segment's lexical index, through the capability the rerank features rely on."""
    lex = opened.indexes["lexical"]
    if not implements(lex, TermStatistics):
        raise TypeError(f"the lexical index {type(lex).__name__} does not expose term statistics")
    return lex


def _build_forward(docs, lex: TermStatistics) -> tuple:
    """Forward index of a segment built before it existed, with the index's own analyzer."""
    analyzer = lex.analyzer
    titles = docs.column("title")
    texts = docs.column("text")
    analyzed = analyzer.analyze_many(f"{ti or ''} {te or ''}" for ti, te in zip(titles, texts))
    title_len = np.fromiter(map(len, analyzer.analyze_many(t or "" for t in titles)), np.int32,
                            count=len(titles))
    get = lex.term_id
    ids = np.fromiter((-1 if (i := get(t)) is None else i for terms in analyzed for t in terms),
                      np.int32)
    row_ptr = np.concatenate([[0], np.cumsum([len(d) for d in analyzed])]).astype(np.int64)
    if len(ids) and ids.min() < 0:  # cannot happen with the index's own analyzer
        raise RuntimeError("lexical forward index: a document term is missing from the vocabulary")
    return row_ptr, title_len, ids


@dataclass
class FieldStats:
    """One snapshot's statistics: per segment, idf and collection probability of every
    segment-local term id, per field (rows: title, body, all)."""

    n_docs: int
    total_len: np.ndarray            # (3,) float64, field lengths summed over live rows
    avg_len: np.ndarray              # (3,) float64
    idf: list[np.ndarray]            # per segment (3, n_terms) float32
    p_coll: list[np.ndarray]         # per segment (3, n_terms) float32, cf / total_len
    norms: list[np.ndarray]          # per segment (3, n_rows) float32, tf-idf norms (NaN = not yet)
    terms: dict = field(default_factory=dict)  # term -> ((3,) idf, (3,) p_coll), query terms
    table: "TermTable | None" = None  # a shard's collection-wide table

    def term_stats(self, term: str, segments) -> tuple[np.ndarray, np.ndarray]:
        got = self.terms.get(term)
        if got is None and self.table is not None:  # a shard: terms of other shards too
            i = self.table.index_of(term)
            df = self.table.df[:, i] if i is not None else np.zeros(3)
            cf = self.table.cf[:, i] if i is not None else np.zeros(3)
            idf, p = _term_numbers(self.n_docs, self.total_len, df[:, None], cf[:, None])
            got = self.terms[term] = (idf[:, 0], p[:, 0])
        if got is None:
            got = (self._idf_of_df(np.zeros(3)), np.zeros(3, np.float32))  # in no live row
            for s, seg in enumerate(segments):
                tid = lexical_of(seg).term_id(term)
                if tid is not None:
                    got = (self.idf[s][:, tid], self.p_coll[s][:, tid])
                    break
            self.terms[term] = got
        return got

    def _idf_of_df(self, df: np.ndarray) -> np.ndarray:
        return np.log1p((self.n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)


def field_stats(snapshot) -> FieldStats:
    """The snapshot's field statistics, computed on first use and cached with the snapshot."""
    cache = snapshot.cache.setdefault("lexical", {})
    stats = cache.get(CACHE_KEY)
    if stats is None:
        stats = cache[CACHE_KEY] = _compute(snapshot)
    return stats


def _local_counts(opened, live):
    lex = lexical_of(opened)
    if live is None and lex in _COUNTS:
        return _COUNTS[lex]
    if live is not None:
        cache = _MASKED.get(lex)
        if cache is None:
            cache = _MASKED.setdefault(lex, MaskCache())
        return cache.get(live, lambda: _count(opened, lex, live))
    return _count(opened, lex, live)


def _count(opened, lex, live):
    row_ptr, title_len, ids = forward_index(opened)
    n_terms = lex.n_terms
    has_live = live is not None
    counts = kernels.field_counts(row_ptr, title_len, ids, n_terms, has_live,
                                  postings.readonly(live) if has_live else postings._NO_ALLOW)
    if not has_live:
        _COUNTS[lex] = counts
    return counts


def _vocab(lex) -> pa.Array:
    """A segment's vocabulary as an Arrow string array (the lexical index's own, memory-mapped,
    when it offers one; else built from ``terms()``)."""
    arr = getattr(lex, "term_array", None)
    return arr() if arr is not None else pa.array(lex.terms(), pa.string())


@dataclass
class TermTable:
    """A collection's term statistics as one table: what a shard of a larger collection needs
    to score as one node would (``polyindex.distributed``). Per vocabulary term and field
    (rows title, body, all): document and collection frequency over live rows; the number
    of live rows and the field lengths summed. The lexical index reads its BM25 numbers from
    the ``all`` row (``doc_freqs``, ``n_docs``, ``avgdl``: the cache entry ``lexical.GLOBAL``)."""

    vocab: pa.Array                  # string, one entry per term
    df: np.ndarray                   # (3, V) float64
    cf: np.ndarray                   # (3, V) float64
    n_docs: int
    total: np.ndarray                # (3,) float64
    _index: dict | None = field(default=None, repr=False, compare=False)

    @property
    def avgdl(self) -> float:
        return float(self.total[2] / self.n_docs) if self.total[2] else 1.0

    def index_of(self, term: str) -> int | None:
        if self._index is None:  # once per table, not per query
            self._index = {t: i for i, t in enumerate(self.vocab.to_pylist())}
        return self._index.get(term)

    def doc_freqs(self, terms) -> list[int]:
        return [0 if (i := self.index_of(t)) is None else int(self.df[2, i]) for t in terms]

    def __getstate__(self):  # travels between processes without its lookup dict
        return {**self.__dict__, "_index": None}

    @classmethod
    def merge(cls, tables: "list[TermTable]") -> "TermTable":
        """The sum of several shards' tables (terms matched by string)."""
        uniq = pc.unique(pa.chunked_array([t.vocab for t in tables], pa.string()))
        uniq = uniq.combine_chunks() if isinstance(uniq, pa.ChunkedArray) else uniq
        df = np.zeros((3, len(uniq)), np.float64)
        cf = np.zeros((3, len(uniq)), np.float64)
        for t in tables:
            g = pc.index_in(t.vocab, value_set=uniq).to_numpy(zero_copy_only=False)
            for f in range(3):
                df[f] += np.bincount(g, weights=t.df[f], minlength=len(uniq))
                cf[f] += np.bincount(g, weights=t.cf[f], minlength=len(uniq))
        return cls(uniq, df, cf, sum(t.n_docs for t in tables),
                   np.sum([t.total for t in tables], axis=0))


def local_table(snapshot) -> TermTable:
    """This snapshot's own term statistics (for the collection-wide sum across shards)."""
    segs = snapshot.segments
    if not segs:
        return TermTable(pa.array([], pa.string()), np.zeros((3, 0)), np.zeros((3, 0)), 0,
                         np.zeros(3))
    local = [_local_counts(s, m) for s, m in zip(segs, snapshot.live)]
    parts = [TermTable(_vocab(lexical_of(s)), np.asarray(c[0], np.float64),
                       np.asarray(c[1], np.float64), int(c[3]), np.asarray(c[2], np.float64))
             for s, c in zip(segs, local)]
    return parts[0] if len(parts) == 1 else TermTable.merge(parts)


def _compute(snapshot) -> FieldStats:
    segs = snapshot.segments
    glob = snapshot.cache.get("lexical", {}).get(GLOBAL)
    if glob is not None:  # a shard: per segment, the whole collection's counts of its terms
        n_docs, total = glob.n_docs, glob.total
        per_seg = []
        for s in segs:
            g = pc.index_in(_vocab(lexical_of(s)), value_set=glob.vocab).to_numpy(
                zero_copy_only=False)  # every local term is in the sum
            per_seg.append((glob.df[:, g], glob.cf[:, g]))
        stats = _finish(segs, n_docs, total, per_seg)
        stats.table = glob
        return stats
    local = [_local_counts(s, m) for s, m in zip(segs, snapshot.live)]
    n_docs = int(sum(c[3] for c in local))
    total = np.sum([c[2] for c in local], axis=0) if local else np.zeros(3)
    if len(local) == 1:
        per_seg = [(local[0][0], local[0][1])]
    else:  # sum each term's counts over segments by term string (segment term ids differ)
        table = TermTable.merge([TermTable(_vocab(lexical_of(s)), c[0], c[1], 0, c[2])
                                 for s, c in zip(segs, local)])
        per_seg = [(table.df[:, g], table.cf[:, g]) for g in
                   (pc.index_in(_vocab(lexical_of(s)), value_set=table.vocab).to_numpy(
                       zero_copy_only=False) for s in segs)]
    return _finish(segs, n_docs, total, per_seg)


def _term_numbers(n_docs: int, total: np.ndarray, df: np.ndarray, cf: np.ndarray):
    """(idf, collection probability) float32, (3, n) each, of terms' (3, n) df and cf."""
    total = np.asarray(total, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        p = np.where(total[:, None] > 0, cf / np.maximum(total[:, None], 1), 0.0)
    return idf, p.astype(np.float32)


def _finish(segs, n_docs: int, total: np.ndarray, per_seg) -> FieldStats:
    avg = np.where(total > 0, total / max(n_docs, 1), 1.0)
    idf, p_coll, norms = [], [], []
    for (df, cf), s in zip(per_seg, segs):
        i, p = _term_numbers(n_docs, total, df, cf)
        # C order always (a column gather gives F order): the kernels compile once per layout
        idf.append(np.ascontiguousarray(i))
        p_coll.append(np.ascontiguousarray(p))
        norms.append(np.full((3, s.docs.n_rows), np.nan, np.float32))
    return FieldStats(n_docs, np.asarray(total, np.float64), avg.astype(np.float64), idf,
                      p_coll, norms)
