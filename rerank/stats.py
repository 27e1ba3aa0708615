"""Collection-wide per-field statistics for the rerank features, per snapshot.

Fields are ``title``, ``body`` and ``all`` (title + text, what the lexical index scores). From
each segment's forward index (``lexical.forward.arrow``: each row's term ids in order, title
first) we count, over live rows, per term and field: document frequency and collection term
frequency, plus total field lengths. Those counts are kept per segment and live mask (a
segment without tombstones for the life of the process), so after a write only the segments
it changed are counted again. The collection-wide sums of a term (and from them its idf and
collection probability) are summed over the segments by string when a query or a candidate
first reads the term, and kept in the snapshot's cache: scores do not depend on how
documents fell into segments, and a write never costs the next query the whole vocabulary.

Segments built before the forward index existed get one built in memory from their documents
(same analyzer, so the same term ids), once per process.
"""
from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from polyindex.index import postings

from polyindex.index.lexical import vocabulary
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
_BUFFERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lexical seg -> vocabulary
_HASHES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # lexical seg -> hash table
# lexical seg -> (its last live mask, the counts under it): the next mask's counts are those
# less the rows a write hid. Held strongly (a byte a row): the snapshot that made the mask is
# usually gone by the next write.
_LAST: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


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


class FieldStats:
    """One snapshot's statistics: the collection-wide numbers of live rows (count, field
    lengths) and, per segment, idf and collection probability of its segment-local term ids
    (rows: title, body, all), worked out for the terms a query or a candidate reads (NaN
    until then). After a write the next query counts only the segments whose live rows
    changed (``_local_counts``) and sums each term it reads over the segments by string:
    its cost follows its candidates, not the collection's vocabulary or rows."""

    def __init__(self, lexes: list, counts: list, n_docs: int, total_len: np.ndarray,
                 table: "TermTable | None" = None):
        self.n_docs = n_docs
        self.total_len = np.asarray(total_len, np.float64)  # (3,) over live rows
        self.avg_len = np.where(self.total_len > 0, self.total_len / max(n_docs, 1), 1.0)
        self.table = table          # a shard: the collection-wide table (its terms by string)
        self._lexes = lexes         # per segment, its lexical index
        self._counts = counts       # per segment, (df, cf) (3, n_terms) int64 over live rows
        self._terms: dict[str, tuple] = {}  # query term -> ((3,) idf, (3,) p_coll)
        self._numbers: dict[int, tuple] = {}  # segment -> (idf, p_coll) (3, n_terms) float32
        self._lock = threading.Lock()  # queries of one snapshot may run in several threads

    def arrays(self, s: int) -> tuple[np.ndarray, np.ndarray]:
        """(idf, p_coll) (3, n_terms) float32 of segment ``s``: what ``fill`` filled, NaN
        elsewhere."""
        return self._numbers[s]

    def fill(self, needs: dict[int, np.ndarray]) -> None:
        """Fill the numbers of several segments' term ids (segment -> ids). A term summed
        for one segment is filled in every other segment whose arrays exist and that holds
        it (the sum's own lookups found it there), so a term the candidates of several
        segments share is summed once."""
        with self._lock:
            for s in needs:
                if s not in self._numbers:
                    n = self._lexes[s].n_terms
                    self._numbers[s] = (np.full((3, n), np.nan, np.float32),
                                        np.full((3, n), np.nan, np.float32))
            for s, need in needs.items():
                idf, p = self._numbers[s]
                todo = need[np.isnan(idf[2, need])]
                if not len(todo):
                    continue
                df, cf, found = self._segment_terms(s, todo)
                got = _term_numbers(self.n_docs, self.total_len, df, cf)
                idf[:, todo], p[:, todo] = got
                if found is None:
                    continue
                for s2 in needs:  # the later segments of this call skip what is filled here
                    if s2 != s and s2 in self._numbers:
                        kernels.scatter(found[s2], got[0], got[1], *self._numbers[s2])

    def query_terms(self, terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(idf, p_coll) (len(terms), 3) float64 of query terms (0 in no live row: p 0)."""
        with self._lock:
            todo = [t for t in dict.fromkeys(terms) if t not in self._terms]
            if todo:
                df, cf = self._string_terms(todo)
                idf, p = _term_numbers(self.n_docs, self.total_len, df, cf)
                self._terms.update((t, (idf[:, j], p[:, j])) for j, t in enumerate(todo))
            got = [self._terms[t] for t in terms]
        return (np.array([g[0] for g in got], np.float64).reshape(-1, 3),
                np.array([g[1] for g in got], np.float64).reshape(-1, 3))

    def _segment_terms(self, s: int, ids: np.ndarray):
        """Collection-wide (df, cf) (3, len(ids)) of segment ``s``'s term ids ``ids``, and
        where each is in every segment ((n_segments, len(ids)), -1 where absent; None for a
        shard, whose sums come from the router's table)."""
        if self.table is not None:
            terms = _vocab(self._lexes[s]).take(pa.array(ids)).to_pylist()
            return (*self._from_table(terms), None)
        return self._sum(*vocab_buffers(self._lexes[s]), ids, own=s)

    def _string_terms(self, terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Collection-wide (df, cf) (3, len(terms)) of terms given as strings."""
        if self.table is not None:
            return self._from_table(terms)
        qoff, qdata = vocabulary.encode_terms(terms)
        return self._sum(qoff, qdata, np.arange(len(terms), dtype=np.int64))[:2]

    def _sum(self, qoff, qdata, ids, own: int | None = None):
        """(df, cf) (3, len(ids)) summed over the segments of the terms ``ids`` of the
        encoded strings (``qoff``, ``qdata``), and each term's id in every segment (-1
        where absent); ``own``: the segment those strings are the vocabulary of (its ids
        are the terms' own, no lookup)."""
        df, cf = (np.zeros((3, len(ids)), np.int64) for _ in range(2))
        found = np.empty((len(self._lexes), len(ids)), np.int64)
        for s2, (lex2, (df2, cf2)) in enumerate(zip(self._lexes, self._counts)):
            if s2 == own:
                df += df2[:, ids]
                cf += cf2[:, ids]
                found[s2] = ids
            else:
                kernels.add_counts(*vocab_lookup(lex2), qoff, qdata, ids, df2, cf2, df, cf,
                                   found[s2])
        return df, cf, found

    def _from_table(self, terms: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """A shard: the router's collection-wide table (a term it has not seen yet: 0)."""
        at = [self.table.index_of(t) for t in terms]
        found = np.array([i is not None for i in at], bool)
        g = np.array([i or 0 for i in at], np.int64)
        return self.table.df[:, g] * found, self.table.cf[:, g] * found


def candidate_terms(segments, groups: dict[int, np.ndarray], rows: np.ndarray
                    ) -> dict[int, np.ndarray]:
    """Per segment, the distinct term ids of its candidates (``rows[groups[s]]``)."""
    out = {}
    for s, sel in groups.items():
        row_ptr, _, ids = forward_index(segments[s])
        out[s] = kernels.row_terms(row_ptr, ids, rows[sel], lexical_of(segments[s]).n_terms)
    return out


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
    counts = _less(row_ptr, title_len, ids, lex, live)
    if counts is None:
        has_live = live is not None
        counts = kernels.field_counts(row_ptr, title_len, ids, lex.n_terms, has_live,
                                      postings.readonly(live) if has_live else postings._NO_ALLOW)
    if live is None:
        _COUNTS[lex] = counts
    else:
        _LAST[lex] = (live, counts)
    return counts


def _less(row_ptr, title_len, ids, lex, live):
    """The counts under ``live`` from those of the segment's previous mask (or of every row)
    less the rows a write hid since: the write's rows, not the segment's. None where no
    such counts are kept, or a row came back to life."""
    if live is None:
        return None
    prev = _LAST.get(lex)
    before = prev[0] if prev is not None else None
    if before is not None and before.shape == live.shape and not (live & ~before).any():
        counts, hidden = prev[1], np.flatnonzero(before & ~live)
    elif lex in _COUNTS:
        counts, hidden = _COUNTS[lex], np.flatnonzero(~live)
    else:
        return None
    if 2 * len(hidden) > len(live):  # most rows gone: counting the rest costs less
        return None
    df, cf, lens = counts[0].copy(), counts[1].copy(), counts[2].copy()
    kernels.remove_rows(row_ptr, title_len, ids, hidden, df, cf, lens)
    return df, cf, lens, counts[3] - len(hidden)


def _vocab(lex) -> pa.Array:
    """A segment's vocabulary as an Arrow string array (the lexical index's own, memory-mapped,
    when it offers one; else built from ``terms()``)."""
    arr = getattr(lex, "term_array", None)
    return arr() if arr is not None else pa.array(lex.terms(), pa.string())


def vocab_buffers(lex) -> tuple[np.ndarray, np.ndarray]:
    """A segment's sorted vocabulary as (offsets, UTF-8 bytes), for the numba term lookup
    (zero-copy views of the mapped column; built once per segment otherwise)."""
    got = _BUFFERS.get(lex)
    if got is None:
        got = _BUFFERS[lex] = vocabulary.string_buffers(_vocab(lex))
    return got


def vocab_lookup(lex) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hash table, offsets, bytes) of a segment's vocabulary, for ``kernels.add_counts``:
    the table (``vocabulary.build_hash``, 8-16 bytes a term) is built once per segment and
    process, the first time another segment's terms are summed (a lookup ~40 ns, a binary
    search ~300-650)."""
    table = _HASHES.get(lex)
    if table is None:
        table = _HASHES[lex] = vocabulary.build_hash(*vocab_buffers(lex))
    return (table, *vocab_buffers(lex))


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
    lexes = [lexical_of(s) for s in snapshot.segments]
    glob = snapshot.cache.get("lexical", {}).get(GLOBAL)
    if glob is not None:  # a shard: the whole collection's counts, looked up by term
        return FieldStats(lexes, [], glob.n_docs, glob.total, glob)
    local = [_local_counts(s, m) for s, m in zip(snapshot.segments, snapshot.live)]
    n_docs = int(sum(c[3] for c in local))
    total = np.sum([c[2] for c in local], axis=0) if local else np.zeros(3)
    return FieldStats(lexes, [(c[0], c[1]) for c in local], n_docs, total)


def _term_numbers(n_docs: int, total: np.ndarray, df: np.ndarray, cf: np.ndarray):
    """(idf, collection probability) float32, (3, n) each, of terms' (3, n) df and cf."""
    total = np.asarray(total, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        idf = np.log1p((n_docs - df + 0.5) / (df + 0.5)).astype(np.float32)
        p = np.where(total[:, None] > 0, cf / np.maximum(total[:, None], 1), 0.0)
    return idf, p.astype(np.float32)
