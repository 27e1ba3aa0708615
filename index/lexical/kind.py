"""The ``lexical`` index kind: BM25 over an inverted index, scored with numba (term-at-a-time,
or block-max MaxScore for queries pruning pays for: ``polyindex.index.lexical.blockmax``).

Factory string ``lexical`` or ``lexical:[VARIANT][,k1=..][,b=..][,delta=..]``.
Default: ``lexical:bm25,k1=1.5,b=0.75``. The variants (``bm25``, ``lucene``, ``robertson``,
``atire``, ``bm25l``, ``bm25+``) are in ``polyindex.index.lexical.bm25``. Search params ``variant=``, ``k1=``,
``b=``, ``delta=`` override them per query, and ``prf=rm3`` (with ``fb_docs``, ``fb_terms``,
``orig_weight``, ``fb_max_df``) expands the query by RM3 pseudo-relevance feedback
(``polyindex.index.prf``). A collection's tuned scorer (``polyindex tune-bm25``) replaces the
factory's through ``set_scorer``. Per segment these Arrow IPC files:

- ``lexical.vocab.arrow``: ``term`` (string, sorted), ``offset`` (int64, first posting of the
  term), ``df`` (int32, rows of this segment containing it);
- ``lexical.postings.arrow``: ``lo`` (uint16: each posting's row, block-relative, see
  ``polyindex.index.docids``; rows ascend within a term) and ``tf`` (uint8, or uint16/int32
  when a count does not fit). Files written before hold ``doc`` (int32 rows) and an int32
  ``tf``, and open as they are;
- ``lexical.wide.arrow``: ``high`` (uint16), the high 16 bits of the rows of the blocks that
  span 2^16 rows or more (their low bits are in ``lo``);
- ``lexical.doclen.arrow``: ``len`` (int32, analyzed tokens per row);
- ``lexical.forward.arrow``: the forward index the rerank features read (``polyindex.rerank``):
  ``terms`` (large_list<int32>, each row's term ids in text order, title first) and
  ``title_len`` (int32, how many of them come from the title). Optional: segments built
  before it existed open without it (``LexicalSegment.forward`` is None).
- ``lexical.blocks.arrow``: per block of 128 postings of a term its ``last`` row, ``max_tf``
  and ``min_len`` (int32 each; the bounds of block-max MaxScore, ``polyindex.index.lexical.blockmax``),
  ``first`` row (int32) and ``wide_at`` (int64, where its rows start in the wide file, -1
  for a block of 16-bit rows). Segments written before may lack it (scored term-at-a-time,
  the same answer) or hold only the bounds.

Corpus statistics are collection-wide (``prepare`` sums them over the snapshot's live rows),
so a document scores the same whatever segment it is in. Default term score (Lucene idf):
``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))`` with
``idf = log(1 + (N - df + 0.5) / (df + 0.5))``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from polyindex.config import settings
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index import docids, postings, prf
from polyindex.index.lexical import blockmax, bm25, vocabulary
from polyindex.index.lexical.analyzer import Analyzer
from polyindex.index.lexical.bm25 import Scorer
from polyindex.index.masks import MaskCache
from polyindex.index.protocol import (
    BuildBatch,
    IndexKind,
    Query,
    SegmentIndex,
    check_format,
    empty_result,
)
from polyindex.index.ranges import concat_ranges
from polyindex.index.lexical.files import (
    _DOCLEN_SCHEMA, _VOCAB_SCHEMA, BLOCKS_FILE, DOCLEN_FILE, FORMAT, FORWARD_FILE, POSTINGS_FILE,
    VOCAB_FILE, WIDE_FILE, _forward_arrays, _read_forward, _read_postings)

# Snapshot cache entry of a shard of a larger collection: an object with ``n_docs``, ``avgdl``
# and ``doc_freqs(terms)`` over the whole collection (polyindex.rerank.stats.TermTable), so a
# shard scores with the statistics one node holding every document would use.
GLOBAL = "lexical:global"

# POLYINDEX_BLOCKMAX=0 scores every query term-at-a-time (same answer; for comparisons)
BLOCKMAX = settings().blockmax
# Builds analyze their texts as Arrow columns (``Analyzer.analyze_columns``: the same terms);
# False: text by text (bench_bulk's reference path)
ANALYZE_COLUMNS = True

_ANALYZER = Analyzer()  # shared: its word -> stem cache serves every lexical index
_PARAMS = bm25.KNOBS + prf.LEXICAL_KEYS


def _check_params(params: dict[str, str], where: str = "lexical search params") -> None:
    unknown = sorted(set(params) - set(_PARAMS))
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; the lexical "
                              f"index knows {', '.join(_PARAMS)}")


@dataclass
class LexicalPrepared:
    """Per query of a batch: its unique terms (first-occurrence order) and their weights."""

    terms: list[list[str]]
    weights: list[list[float]]  # idf x times in the query (RM3: idf x the RM3 weight)
    scorer: Scorer
    avgdl: float
    n_docs: int
    # RM3: per query, each expansion term's weight before idf (``prf.rm3_weights``)
    expansion: list[dict[str, float]] | None = None
    _encoded: tuple | None = field(default=None, repr=False, compare=False)

    def encoded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Every query's terms as UTF-8 (offsets, bytes), their weights and the per-query
        pointers into them: encoded once per batch, looked up in every segment."""
        if self._encoded is None:
            qoff, qdata = vocabulary.encode_terms([t for ts in self.terms for t in ts])
            qw = np.array([w for ws in self.weights for w in ws], np.float64)
            ptr = [0]
            for ts in self.terms:
                ptr.append(ptr[-1] + len(ts))
            self._encoded = (qoff, qdata, qw, np.array(ptr, np.int64))
        return self._encoded

    @property
    def k1(self) -> float:
        return self.scorer.k1

    @property
    def b(self) -> float:
        return self.scorer.b


def _live_stats(seg: "LexicalSegment", mask: np.ndarray) -> tuple[int, int]:
    mask = postings.check_allow(mask, seg.n_rows, "lexical live mask")
    return int(np.count_nonzero(mask)), int(seg.doclen.sum(where=mask, dtype=np.int64))


class LexicalSegment(SegmentIndex):  # and TermStatistics
    """One segment's BM25 postings, memory-mapped."""

    analyzer = _ANALYZER

    def __init__(self, terms, offsets: np.ndarray, df: np.ndarray, P: tuple,
                 tfs: np.ndarray, doclen: np.ndarray, keep: tuple = (),
                 forward: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                 blocks: tuple[np.ndarray, ...] | None = None):
        # The vocabulary (sorted) stays an Arrow string column, memory-mapped: terms are found
        # by binary search over its bytes (``vocabulary.find_terms``), no dict per segment.
        vocab = terms if isinstance(terms, (pa.Array, pa.ChunkedArray)) \
            else pa.array(list(terms), pa.string())
        if isinstance(vocab, pa.ChunkedArray):
            vocab = vocab.chunk(0) if vocab.num_chunks == 1 else vocab.combine_chunks()
        self._vocab = vocab
        self._voff, self._vdata = vocabulary.string_buffers(vocab)
        if len(vocab) > 1 and not pc.all(pc.less(vocab.slice(0, len(vocab) - 1),
                                                 vocab.slice(1))).as_py():
            raise Corrupt("lexical vocabulary is not sorted (or has a duplicate term)")
        self.n_terms = len(vocab)
        # (row offsets int64 (n_rows + 1), title_len int32, term ids int32) or None
        self.forward = forward
        # block-max MaxScore: (last row, max tf, min length) per block, or None
        self.blocks = blocks
        self.offsets = offsets  # (n_terms + 1,) int64
        self.df = df
        self.P = P  # the postings' rows (``docids.doc_at``: boff, first, wide_at, lo, wide, shift)
        self.tfs = tfs
        self.doclen = doclen
        self.n_rows = len(doclen)
        self.total_len = int(doclen.sum(dtype=np.int64))
        self.live_stats = MaskCache()  # (live rows, their total length) per live mask
        self._keep = keep  # Arrow tables owning the memory maps
        self._pool = postings.BufferPool(self.n_rows)
        self._term_table = None  # ``term_table``

    # -- TermStatistics ----------------------------------------------------------------------
    def terms(self) -> list[str]:
        """The vocabulary in term-id order (a new list each call: ``term_array`` is free)."""
        return self._vocab.to_pylist()

    def term_array(self) -> pa.Array:
        """The vocabulary in term-id order as the (memory-mapped) Arrow string array."""
        return self._vocab

    def term_id(self, term: str) -> int | None:
        tid = int(self.term_ids([term])[0])
        return None if tid < 0 else tid

    def term_table(self) -> np.ndarray:
        """The vocabulary's hash table (``vocabulary.build_hash``), made on first use and
        kept for the segment's life: the text lane looks every query term up in every
        segment, and a hash probe costs a fraction of a ~15-step binary search."""
        table = self._term_table
        if table is None:
            table = self._term_table = postings.readonly(
                vocabulary.build_hash(self._voff, self._vdata))
        return table

    def term_ids(self, terms: Sequence[str]) -> np.ndarray:
        """Segment-local id of each term, -1 where the segment lacks it."""
        qoff, qdata = vocabulary.encode_terms(terms)
        return vocabulary.find_terms(self._voff, self._vdata, qoff, qdata)

    def _query_terms(self, prepared: LexicalPrepared, scale: float = 1.0):
        """Segment-local term ids and weights of each query, flattened with pointers."""
        qoff, qdata, qw, qptr = prepared.encoded()
        return vocabulary.query_terms(self._voff, self._vdata, qoff, qdata, qw, qptr, float(scale))

    def _scorer(self, prepared: LexicalPrepared, params: dict[str, str]) -> Scorer:
        if not params:
            return prepared.scorer
        _check_params(params)
        scorer = bm25.parse_scorer(params, prepared.scorer, "lexical search params")
        if scorer.variant != prepared.scorer.variant:  # the idf was computed for that one
            raise InvalidArgument(f"lexical search params: variant {scorer.variant} differs "
                                  f"from the one the query was prepared for "
                                  f"({prepared.scorer.variant})")
        return scorer

    @staticmethod
    def _absent(prepared: LexicalPrepared, scorer: Scorer) -> np.ndarray | None:
        """bm25l/bm25+: per query, what its terms score in a document lacking them."""
        z = scorer.tfc_absent()
        if z == 0.0:
            return None
        return np.array([sum(ws) * z for ws in prepared.weights], np.float64)

    def prepare_live(self, live: np.ndarray, before: np.ndarray | None = None,
                     hidden: np.ndarray | None = None) -> None:
        """The live rows and their total length under a new mask (collection statistics),
        worked out by the write that made the mask, not by the next query: from the
        previous mask's numbers less the rows it hid (the batch's work), where those are
        known; else counted over the mask."""
        was = (self.n_rows, self.total_len) if before is None else self.live_stats.peek(before)
        if was is None or hidden is None:
            self.live_stats.get(live, lambda: _live_stats(self, live))
        else:
            self.live_stats.put(live, (was[0] - len(hidden),
                                       was[1] - int(self.doclen[hidden].sum(dtype=np.int64))))

    def search(self, prepared: LexicalPrepared, k: int, params: dict[str, str],
               allow: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        scorer = self._scorer(prepared, params)
        nq = len(prepared.terms)
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        qptr, qterms, qweights = self._query_terms(prepared, scorer.weight_scale)
        if k == 0 or len(qterms) == 0:
            return empty_result(nq, k)
        allow = postings.check_allow(allow, self.n_rows, "lexical search")
        base = (self.offsets, self.P, self.tfs, self.doclen, qptr, qterms, qweights,
                scorer.k1, scorer.b, prepared.avgdl)
        if scorer.variant == "bm25l":
            scores, rows = postings.run_search(bm25.bm25l_search, base + (scorer.delta,),
                                               self._pool, nq, k, allow)
        elif BLOCKMAX and self.blocks is not None and (qweights >= 0).all():
            scores, rows = blockmax.search(*base[:4], self.blocks, qptr, qterms, qweights,
                                           scorer.k1, scorer.b, prepared.avgdl, self._pool, k,
                                           allow)
        else:
            scores, rows = postings.run_search(postings.bm25_search, base, self._pool, nq, k,
                                               allow)
        absent = self._absent(prepared, scorer)
        if absent is not None:
            scores = np.where(rows >= 0, scores + absent[:, None].astype(np.float32), scores)
        return scores, rows

    def score(self, prepared: LexicalPrepared, row_ids: np.ndarray) -> np.ndarray:
        scorer = prepared.scorer
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        qptr, qterms, qweights = self._query_terms(prepared, scorer.weight_scale)
        out = np.empty((len(prepared.terms), len(rows)), np.float32)
        args = (self.offsets, self.P, self.tfs, self.doclen, qptr, qterms, qweights,
                scorer.k1, scorer.b, prepared.avgdl)
        if scorer.variant == "bm25l":
            bm25.bm25l_score_rows(*args, scorer.delta, rows, out)
        else:
            postings.bm25_score_rows(*args, rows, out)
        absent = self._absent(prepared, scorer)
        if absent is not None:
            out += absent[:, None].astype(np.float32)  # NaN (rows out of range) stays NaN
        return out

    def feedback_terms(self, row: int) -> dict[str, int]:
        """Term counts of one row, from the forward index (RM3 feedback documents)."""
        if self.forward is None:
            raise InvalidArgument("prf=rm3 needs the lexical forward index, which this "
                                  "segment was built without; reindex the collection")
        row_ptr, _, ids = self.forward
        tids, counts = np.unique(ids[row_ptr[row]:row_ptr[row + 1]], return_counts=True)
        terms = self._vocab.take(pa.array(tids, pa.int64())).to_pylist()
        return dict(zip(terms, counts.tolist()))


class LexicalKind(IndexKind):
    kind = "lexical"
    completes_ties = True  # BM25 ties often: a top k cut by id (``ties.cut_ties``)

    def __init__(self, body: str):
        where = f"index factory string {f'lexical:{body}' if body else 'lexical'!r}"
        self.scorer = bm25.parse_body(body, where)
        self.analyzer = _ANALYZER
        super().__init__(self.scorer.describe())

    def __getstate__(self):  # the analyzer (a C stemmer) is this process's shared one
        state = self.__dict__.copy()
        state.pop("analyzer", None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.analyzer = _ANALYZER

    def set_scorer(self, body: str) -> None:
        """Replace the default scorer (a collection's tuned BM25); queries in flight keep the
        one they prepared with (one attribute, swapped whole)."""
        self.scorer = bm25.parse_body(body, f"lexical scorer {body!r}")
        self.body = self.scorer.describe()

    # -- segments ------------------------------------------------------------------------
    def build(self, batch: BuildBatch, folder: Path) -> dict:
        folder = Path(folder)
        n = len(batch.ids)
        titles, texts = batch.titles, batch.texts
        if len(titles) != n or len(texts) != n:
            raise InvalidArgument(f"lexical build: {n} ids but {len(titles)} titles and "
                                  f"{len(texts)} texts")
        if not ANALYZE_COLUMNS:  # the per-text path (bench_bulk's reference)
            return self._build_per_text(folder, titles, texts)
        # "title text", as analyze_many's callers join them; analyzed as columns
        title_col = pa.array(titles, pa.large_string()).fill_null("")
        joined = pc.binary_join_element_wise(
            title_col, pa.array(texts, pa.large_string()).fill_null(""),
            pa.scalar(" ", pa.large_string()))
        terms, flat, lens = self.analyzer.analyze_columns(joined)
        title_len = self.analyzer.analyze_columns(title_col)[2].astype(np.int32)
        return self._write(folder, terms, flat, lens, title_len)

    def _build_per_text(self, folder: Path, titles, texts) -> dict:
        n = len(titles)
        docs_terms = self.analyzer.analyze_many(
            f"{ti or ''} {te or ''}" for ti, te in zip(titles, texts))
        lens = np.fromiter(map(len, docs_terms), dtype=np.int64, count=n)
        vocab: dict[str, int] = {}
        flat = np.fromiter((vocab.setdefault(t, len(vocab)) for terms in docs_terms for t in terms),
                           dtype=np.int64, count=int(lens.sum()))
        terms = list(vocab)  # in id order
        order = sorted(range(len(terms)), key=terms.__getitem__)
        remap = np.empty(len(terms), np.int64)
        remap[order] = np.arange(len(terms))
        title_len = np.fromiter(map(len, self.analyzer.analyze_many(ti or "" for ti in titles)),
                                dtype=np.int32, count=n)
        return self._write(folder, [terms[i] for i in order], remap[flat], lens, title_len)

    def merge(self, parts, batch: BuildBatch, folder: Path) -> dict:
        """Merged segments are not analyzed again: each kept row's terms come from its
        source's forward index, re-numbered into the merged vocabulary (the terms the kept
        rows use, sorted), so the files equal a fresh build of the same rows. Sources
        written without a forward index are built from the text instead."""
        if any(seg.forward is None for seg, _ in parts):
            return self.build(batch, folder)
        # the union of the sources' vocabularies, sorted as a build sorts (UTF-8 byte order
        # is code point order), each source's term ids mapped into it, all in Arrow
        vocab = pc.unique(pa.chunked_array([seg.term_array() for seg, _ in parts], pa.string()))
        vocab = vocab.take(pc.sort_indices(vocab))
        flats, lens, title_len = [], [], []
        for seg, rows in parts:
            to_merged = pc.index_in(seg.term_array(), value_set=vocab).to_numpy(
                zero_copy_only=False).astype(np.int32)
            row_ptr, titles, ids = seg.forward
            starts, ends = row_ptr[rows], row_ptr[rows + 1]
            flats.append(to_merged[ids[concat_ranges(starts, ends)]])
            lens.append(ends - starts)
            title_len.append(titles[rows])
        # np.unique(return_inverse=True) without its sort: the ids are < len(vocab)
        flat = np.concatenate(flats)
        used = np.flatnonzero(np.bincount(flat, minlength=len(vocab)))
        remap = np.zeros(len(vocab), np.int32)
        remap[used] = np.arange(len(used))
        flat = remap[flat]
        return self._write(Path(folder), vocab.take(pa.array(used)).to_pylist(),
                           flat,
                           np.concatenate(lens).astype(np.int64),
                           np.concatenate(title_len).astype(np.int32))

    def _write(self, folder: Path, terms: list[str], flat: np.ndarray, lens: np.ndarray,
               title_len: np.ndarray) -> dict:
        """A segment's files from its rows' term ids (``flat``, ids into the sorted ``terms``,
        ``lens`` per row) and their title lengths."""
        n = len(lens)
        # int32 term ids and rows (a segment holds under 2^31 of each): half the memory of
        # the postings' sort at merge time
        flat = flat.astype(np.int32, copy=False)
        row_of = np.repeat(np.arange(n, dtype=np.int32), lens)
        offsets, docs, tfs = postings.build_csr(flat, row_of, None, len(terms))
        folder.mkdir(parents=True, exist_ok=True)
        postings.write_arrow(folder / VOCAB_FILE, {
            "term": pa.array(terms, pa.string()),
            "offset": offsets[:-1], "df": np.diff(offsets).astype(np.int32)})
        first, wide_at, lo, wide = docids.encode(offsets, docs)
        postings.write_arrow(folder / POSTINGS_FILE, {"lo": lo, "tf": postings.narrow_counts(tfs)})
        postings.write_arrow(folder / WIDE_FILE, {"high": wide})
        postings.write_arrow(folder / DOCLEN_FILE, {"len": lens.astype(np.int32)})
        # Title and text are analyzed as "title text", so a row's first title_len terms are
        # its title's: reranking reads per-field statistics from here without re-analyzing.
        row_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        postings.write_arrow(folder / FORWARD_FILE, {
            "terms": pa.LargeListArray.from_arrays(pa.array(row_ptr),
                                                   pa.array(flat.astype(np.int32, copy=False))),
            "title_len": title_len})
        last, max_tf, min_len = blockmax.build_blocks(offsets, docs, tfs, lens.astype(np.int32))
        postings.write_arrow(folder / BLOCKS_FILE, {"last": last, "max_tf": max_tf,
                                                    "min_len": min_len, "first": first,
                                                    "wide_at": wide_at})
        return {"format": FORMAT, "n_rows": n, "n_terms": len(terms), "n_postings": int(len(docs)),
                "total_len": int(lens.sum()),
                "files": [VOCAB_FILE, POSTINGS_FILE, DOCLEN_FILE, FORWARD_FILE, BLOCKS_FILE,
                          WIDE_FILE]}

    def open(self, folder: Path, info: dict, docs=None) -> LexicalSegment:
        folder = Path(folder)
        check_format(folder, info, "lexical", FORMAT)
        vt, vocab = postings.read_arrow(folder / VOCAB_FILE, _VOCAB_SCHEMA)
        dt, dl = postings.read_arrow(folder / DOCLEN_FILE, _DOCLEN_SCHEMA)
        n_rows = len(dl["len"])
        # Scans of every posting only for files no checksum vouches for (format 1): a file
        # whose xxh3 matched is the writer's own, and a scan would make every page of the
        # postings resident at open (~100 bytes a document).
        scan = docs is None or not docs.checksummed
        keep, P, tfs, blocks, offsets = _read_postings(folder, info, vocab, n_rows, scan)
        forward, keep = None, (vt, dt) + keep
        if (folder / FORWARD_FILE).exists():
            ft = _read_forward(folder / FORWARD_FILE)
            forward = _forward_arrays(folder, ft, dl["len"], len(offsets) - 1, scan)
            keep = keep + (ft,)
        return LexicalSegment(vocab["term"], offsets, vocab["df"], P, tfs, dl["len"],
                              keep=keep, forward=forward, blocks=blocks)

    # -- queries -------------------------------------------------------------------------
    def direct_plan(self, snapshot, segments, params: dict[str, str]):
        """The text lane's plan (``PlansDirectly``, ``index/lexical/lane``) of a stage over
        ``snapshot``'s ``segments``, or None where the general path must answer: RM3 or
        params it would refuse (it reports them), BM25L and BM25+ (their absent-term
        constant), no segment, segments whose arrays differ in layout."""
        from polyindex.index.lexical import lane
        if not segments:
            return None
        scorer = None  # the kind's own, read per query (``set_scorer`` swaps it)
        if params:
            try:
                _check_params(params)
                scorer = bm25.parse_scorer(params, self.scorer, "lexical search params")
                if prf.parse_rm3(params, "lexical search params") is not None:
                    return None
            except InvalidArgument:
                return None
            if scorer.variant in bm25.WITH_DELTA:
                return None
        try:
            return lane.Plan(snapshot, self, segments, scorer, BLOCKMAX, GLOBAL)
        except TypeError:
            return None

    def _collection_stats(self, segments: Sequence[LexicalSegment],
                          live: Sequence[np.ndarray | None], cache: dict) -> tuple[int, float]:
        stats = cache.get("lexical:stats")
        if stats is None and GLOBAL in cache:  # a shard: the whole collection's numbers
            g = cache[GLOBAL]
            stats = cache["lexical:stats"] = (g.n_docs, g.avgdl)
        if stats is None:
            n_docs = total = 0
            for seg, mask in zip(segments, live):
                if mask is None:
                    n_docs += seg.n_rows
                    total += seg.total_len
                else:  # remembered per mask: after a write only changed segments count
                    n, t = seg.live_stats.get(mask, lambda s=seg, m=mask: _live_stats(s, m))
                    n_docs += n
                    total += t
            stats = cache["lexical:stats"] = (n_docs, total / n_docs if total else 1.0)
        return stats

    def _doc_freqs(self, terms: list[str], segments: Sequence[LexicalSegment],
                   live: Sequence[np.ndarray | None]) -> list[int]:
        """df over live rows of the snapshot of each term."""
        qoff, qdata = vocabulary.encode_terms(terms)
        total = np.zeros(len(terms), np.int64)
        for seg, mask in zip(segments, live):
            has = mask is not None
            vocabulary.add_doc_freqs(seg._voff, seg._vdata, qoff, qdata, seg.offsets, seg.P,
                                   seg.df, has,
                                   postings.readonly(mask) if has else postings._NO_ALLOW, total)
        return total.tolist()

    def prepare(self, queries: Sequence[Query], segments: Sequence[SegmentIndex],
                live: Sequence[np.ndarray | None], params: dict[str, str], cache: dict) -> Any:
        scorer = self.scorer
        rm3 = None
        if params:
            _check_params(params)
            scorer = bm25.parse_scorer(params, scorer, "lexical search params")
            rm3 = prf.parse_rm3(params, "lexical search params")
        if len(live) != len(segments):
            raise ValueError("lexical prepare: one live mask (or None) per segment")
        n_docs, avgdl = self._collection_stats(segments, live, cache)
        analyze = self.analyzer.analyze
        all_terms: list[dict[str, int]] = []
        for q in queries:
            text = getattr(q, "text", None)
            if not isinstance(text, str) or not text.strip():
                raise InvalidArgument("the lexical index needs query text")
            # Duplicate query terms count once per occurrence, as in bm25s (its retrieve adds
            # a term's scores once per occurrence in the query): we keep each term once with
            # weight idf x (occurrences in the query).
            counts: dict[str, int] = {}
            for t in analyze(text):
                counts[t] = counts.get(t, 0) + 1
            all_terms.append(counts)
        dfs = self._dfs(all_terms, segments, live, cache)
        prepared = self._weigh(all_terms, dfs, scorer, avgdl, n_docs)
        if rm3 is None:
            return prepared
        expansion = self._rm3(prepared, all_terms, rm3, segments, live, cache, n_docs)
        out = self._weigh(expansion, self._dfs(expansion, segments, live, cache), scorer,
                          avgdl, n_docs)
        out.expansion = expansion
        return out

    def _dfs(self, term_maps, segments, live, cache: dict) -> dict[str, int]:
        """The snapshot's df cache, filled for every term of ``term_maps``."""
        dfs: dict[str, int] = cache.setdefault("lexical:df", {})
        missing = list({t for m in term_maps for t in m if t not in dfs})
        if missing:
            g = cache.get(GLOBAL)
            dfs.update(zip(missing, self._doc_freqs(missing, segments, live) if g is None
                           else g.doc_freqs(missing)))
        return dfs

    @staticmethod
    def _weigh(term_maps: Sequence[dict], dfs: dict[str, int], scorer: Scorer, avgdl: float,
               n_docs: int) -> LexicalPrepared:
        """Per query, its terms that some live row has, weighted by idf x the given weight."""
        terms_out, weights_out = [], []
        idf = scorer.idf
        for m in term_maps:
            ts, ws = [], []
            for t, c in m.items():
                df = dfs[t]
                if df:  # a term no live row has matches nothing
                    w = c * idf(df, n_docs)
                    if w > 0:  # (robertson: idf 0 for terms in over half the rows)
                        ts.append(t)
                        ws.append(w)
            terms_out.append(ts)
            weights_out.append(ws)
        return LexicalPrepared(terms_out, weights_out, scorer, avgdl, n_docs)

    def _rm3(self, first: LexicalPrepared, query_terms: list[dict[str, int]], rm3: prf.RM3,
             segments, live, cache, n_docs: int) -> list[dict[str, float]]:
        """Each query's RM3 weights, from the global top ``fb_docs`` of the first pass."""
        top = prf.global_top(segments, live,
                             lambda seg, mask: seg.search(first, rm3.fb_docs, {}, mask),
                             rm3.fb_docs, len(query_terms))
        docs = [[(segments[s].feedback_terms(r), score) for s, r, score in fb] for fb in top]
        dfs = self._dfs([c for fb in docs for c, _ in fb], segments, live, cache)
        limit = rm3.max_df * n_docs
        out = []
        for counts, fb in zip(query_terms, docs):
            kept = [({t: c for t, c in doc.items() if dfs[t] <= limit}, score)
                    for doc, score in fb]
            out.append(prf.rm3_weights(counts, kept, rm3))
        return out
