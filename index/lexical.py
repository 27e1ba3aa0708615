"""The ``lexical`` index kind: BM25 over an inverted index, scored term-at-a-time with numba.

Factory string ``lexical:bm25[,k1=K1][,b=B]``. Default: ``lexical:bm25,k1=1.5,b=0.75``.
Search params ``k1=...``/``b=...`` override them per query. Per segment three Arrow IPC files:

- ``lexical.vocab.arrow``: ``term`` (string, sorted), ``offset`` (int64, first posting of the
  term), ``df`` (int32, rows of this segment containing it);
- ``lexical.postings.arrow``: ``doc`` (int32 segment row, ascending within a term), ``tf``
  (int32);
- ``lexical.doclen.arrow``: ``len`` (int32, analyzed tokens per row);
- ``lexical.forward.arrow``: the forward index the rerank features read (``polyindex.rerank``):
  ``terms`` (large_list<int32>, each row's term ids in text order, title first) and
  ``title_len`` (int32, how many of them come from the title). Optional: segments built
  before it existed open without it (``LexicalSegment.forward`` is None).

Corpus statistics are collection-wide (``prepare`` sums them over the snapshot's live rows),
so a document scores the same whatever segment it is in. Term score (Lucene/bm25s idf):
``idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))`` with
``idf = log(1 + (N - df + 0.5) / (df + 0.5))``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index import postings
from polyindex.index.analyzer import Analyzer
from polyindex.index.protocol import (
    BuildBatch,
    IndexKind,
    Query,
    SegmentIndex,
    check_format,
    empty_result,
    option,
    parse_options,
    register,
)

VOCAB_FILE = "lexical.vocab.arrow"
POSTINGS_FILE = "lexical.postings.arrow"
DOCLEN_FILE = "lexical.doclen.arrow"
FORWARD_FILE = "lexical.forward.arrow"
FORMAT = 1

_VOCAB_SCHEMA = {"term": pa.string(), "offset": pa.int64(), "df": pa.int32()}
_POSTINGS_SCHEMA = {"doc": pa.int32(), "tf": pa.int32()}
_DOCLEN_SCHEMA = {"len": pa.int32()}
_FORWARD_SCHEMA = {"terms": pa.large_list(pa.int32()), "title_len": pa.int32()}  # own reader

_ANALYZER = Analyzer()  # shared: its word -> stem cache serves every lexical index
_KNOBS = ("k1", "b")


def _fmt(x: float) -> str:
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _bm25_knobs(opts: dict[str, str], k1: float, b: float, where: str) -> tuple[float, float]:
    unknown = sorted(set(opts) - set(_KNOBS))
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; "
                              f"the lexical index knows k1 and b")
    k1 = option(opts, "k1", float, k1, where=where)
    b = option(opts, "b", float, b, where=where)
    if not (math.isfinite(k1) and k1 >= 0):
        raise InvalidArgument(f"{where}: k1 must be a finite number >= 0, got {k1}")
    if not (math.isfinite(b) and 0 <= b <= 1):
        raise InvalidArgument(f"{where}: b must be in [0, 1], got {b}")
    return k1, b


@dataclass
class LexicalPrepared:
    """Per query of a batch: its unique terms (first-occurrence order) and their weights."""

    terms: list[list[str]]
    weights: list[list[float]]  # idf x number of times the term is in the query
    k1: float
    b: float
    avgdl: float
    n_docs: int


class LexicalSegment(SegmentIndex):  # and TermStatistics
    """One segment's BM25 postings, memory-mapped."""

    analyzer = _ANALYZER

    def __init__(self, terms: list[str], offsets: np.ndarray, df: np.ndarray, docs: np.ndarray,
                 tfs: np.ndarray, doclen: np.ndarray, keep: tuple = (),
                 forward: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None):
        self._terms = terms
        self.term_index = dict(zip(terms, range(len(terms))))
        self.n_terms = len(terms)
        # (row offsets int64 (n_rows + 1), title_len int32, term ids int32) or None
        self.forward = forward
        self.offsets = offsets  # (n_terms + 1,) int64
        self.df = df
        self.docs = docs
        self.tfs = tfs
        self.doclen = doclen
        self.n_rows = len(doclen)
        self.total_len = int(doclen.sum(dtype=np.int64))
        self._keep = keep  # Arrow tables owning the memory maps
        self._pool = postings.BufferPool(self.n_rows)

    # -- TermStatistics ----------------------------------------------------------------------
    def terms(self) -> list[str]:
        """The vocabulary in term-id order."""
        return self._terms

    def term_id(self, term: str) -> int | None:
        return self.term_index.get(term)

    def _query_terms(self, prepared: LexicalPrepared):
        """Segment-local term ids and weights of each query, flattened with pointers."""
        get = self.term_index.get
        qptr = [0]
        ids: list[int] = []
        ws: list[float] = []
        for terms, weights in zip(prepared.terms, prepared.weights):
            for term, w in zip(terms, weights):
                tid = get(term)
                if tid is not None:
                    ids.append(tid)
                    ws.append(w)
            qptr.append(len(ids))
        return (np.array(qptr, np.int64), np.array(ids, np.int64), np.array(ws, np.float64))

    def _knobs(self, prepared: LexicalPrepared, params: dict[str, str]) -> tuple[float, float]:
        if not params:
            return prepared.k1, prepared.b
        return _bm25_knobs(params, prepared.k1, prepared.b, where="lexical search params")

    def search(self, prepared: LexicalPrepared, k: int, params: dict[str, str],
               allow: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        k1, b = self._knobs(prepared, params)
        nq = len(prepared.terms)
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        qptr, qterms, qweights = self._query_terms(prepared)
        if k == 0 or len(qterms) == 0:
            return empty_result(nq, k)
        allow = postings.check_allow(allow, self.n_rows, "lexical search")
        args = (self.offsets, self.docs, self.tfs, self.doclen, qptr, qterms, qweights,
                k1, b, prepared.avgdl)
        return postings.run_search(postings.bm25_search, args, self._pool, nq, k, allow)

    def score(self, prepared: LexicalPrepared, row_ids: np.ndarray) -> np.ndarray:
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        qptr, qterms, qweights = self._query_terms(prepared)
        out = np.empty((len(prepared.terms), len(rows)), np.float32)
        postings.bm25_score_rows(self.offsets, self.docs, self.tfs, self.doclen, qptr, qterms,
                                 qweights, prepared.k1, prepared.b, prepared.avgdl, rows, out)
        return out


def _read_forward(path: Path) -> pa.Table:
    try:
        table = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise Corrupt(f"{path}: cannot read Arrow file: {exc}") from None
    for name, typ in _FORWARD_SCHEMA.items():
        if name not in table.column_names or not table.schema.field(name).type.equals(typ):
            raise Corrupt(f"{path}: expected column {name!r} of type {typ}, "
                          f"file schema is {table.schema}")
    return table


def _forward_arrays(folder: Path, table: pa.Table, doclen: np.ndarray,
                    n_terms: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Zero-copy (row offsets, title_len, term ids) of a forward index file, checked."""
    def one(name):
        col = table.column(name)
        return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    lists = one("terms")
    row_ptr = lists.offsets.to_numpy(zero_copy_only=False)
    ids = lists.values.to_numpy(zero_copy_only=False)
    title_len = one("title_len").to_numpy(zero_copy_only=False)
    if len(row_ptr) != len(doclen) + 1 or (np.diff(row_ptr) != doclen).any() \
            or (title_len > doclen).any() or (len(ids) and (ids.min() < 0 or ids.max() >= n_terms)):
        raise Corrupt(f"{folder}: {FORWARD_FILE} disagrees with the lexical index")
    return row_ptr, title_len, ids


@register
class LexicalKind(IndexKind):
    kind = "lexical"

    def __init__(self, body: str):
        where = f"index factory string {f'lexical:{body}' if body else 'lexical'!r}"
        parts = [p.strip() for p in (body or "").split(",") if p.strip()]
        if parts and "=" not in parts[0]:
            if parts[0] != "bm25":
                raise InvalidArgument(f"{where}: unknown scorer {parts[0]!r}; the lexical "
                                      f"index scores with bm25")
            parts = parts[1:]
        opts = parse_options(",".join(parts), where=where)
        self.k1, self.b = _bm25_knobs(opts, 1.5, 0.75, where)
        self.analyzer = _ANALYZER
        super().__init__(f"bm25,k1={_fmt(self.k1)},b={_fmt(self.b)}")

    # -- segments ------------------------------------------------------------------------
    def build(self, batch: BuildBatch, folder: Path) -> dict:
        folder = Path(folder)
        n = len(batch.ids)
        titles, texts = batch.titles, batch.texts
        if len(titles) != n or len(texts) != n:
            raise InvalidArgument(f"lexical build: {n} ids but {len(titles)} titles and "
                                  f"{len(texts)} texts")
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
        row_of = np.repeat(np.arange(n, dtype=np.int64), lens)
        offsets, docs, tfs = postings.build_csr(remap[flat], row_of, None, len(terms))
        folder.mkdir(parents=True, exist_ok=True)
        postings.write_arrow(folder / VOCAB_FILE, {
            "term": pa.array([terms[i] for i in order], pa.string()),
            "offset": offsets[:-1], "df": np.diff(offsets).astype(np.int32)})
        postings.write_arrow(folder / POSTINGS_FILE, {"doc": docs, "tf": tfs})
        postings.write_arrow(folder / DOCLEN_FILE, {"len": lens.astype(np.int32)})
        # Title and text are analyzed as "title text", so a row's first title_len terms are
        # its title's: reranking reads per-field statistics from here without re-analyzing.
        title_len = np.fromiter(map(len, self.analyzer.analyze_many(ti or "" for ti in titles)),
                                dtype=np.int32, count=n)
        row_ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        postings.write_arrow(folder / FORWARD_FILE, {
            "terms": pa.LargeListArray.from_arrays(pa.array(row_ptr),
                                                   pa.array(remap[flat].astype(np.int32))),
            "title_len": title_len})
        return {"format": FORMAT, "n_rows": n, "n_terms": len(terms), "n_postings": int(len(docs)),
                "total_len": int(lens.sum()),
                "files": [VOCAB_FILE, POSTINGS_FILE, DOCLEN_FILE, FORWARD_FILE]}

    def open(self, folder: Path, info: dict, docs=None) -> LexicalSegment:
        folder = Path(folder)
        check_format(folder, info, "lexical", FORMAT)
        vt, vocab = postings.read_arrow(folder / VOCAB_FILE, _VOCAB_SCHEMA)
        pt, post = postings.read_arrow(folder / POSTINGS_FILE, _POSTINGS_SCHEMA)
        dt, dl = postings.read_arrow(folder / DOCLEN_FILE, _DOCLEN_SCHEMA)
        n_rows, n_post = len(dl["len"]), len(post["doc"])
        offsets = np.append(vocab["offset"], np.int64(n_post))
        counts = np.diff(offsets)
        if ("n_rows" in info and info["n_rows"] != n_rows) or (counts < 0).any() \
                or (len(offsets) > 1 and offsets[0] != 0) or (counts != vocab["df"]).any() \
                or (n_post and (post["doc"].min() < 0 or post["doc"].max() >= n_rows)):
            raise Corrupt(f"{folder}: lexical index files are inconsistent "
                          f"(rows {n_rows}, info {info.get('n_rows')}, postings {n_post})")
        forward, keep = None, (vt, pt, dt)
        if (folder / FORWARD_FILE).exists():
            ft = _read_forward(folder / FORWARD_FILE)
            forward, keep = _forward_arrays(folder, ft, dl["len"], len(offsets) - 1), keep + (ft,)
        return LexicalSegment(vocab["term"].to_pylist(), offsets, vocab["df"], post["doc"],
                              post["tf"], dl["len"], keep=keep, forward=forward)

    # -- queries -------------------------------------------------------------------------
    def _collection_stats(self, segments: Sequence[LexicalSegment],
                          live: Sequence[np.ndarray | None], cache: dict) -> tuple[int, float]:
        stats = cache.get("lexical:stats")
        if stats is None:
            n_docs = total = 0
            for seg, mask in zip(segments, live):
                if mask is None:
                    n_docs += seg.n_rows
                    total += seg.total_len
                else:
                    mask = postings.check_allow(mask, seg.n_rows, "lexical live mask")
                    n_docs += int(np.count_nonzero(mask))
                    total += int(seg.doclen.sum(where=mask, dtype=np.int64))
            stats = cache["lexical:stats"] = (n_docs, total / n_docs if total else 1.0)
        return stats

    def _doc_freqs(self, terms: list[str], segments: Sequence[LexicalSegment],
                   live: Sequence[np.ndarray | None]) -> list[int]:
        """df over live rows of the snapshot of each term."""
        df = [0] * len(terms)
        for seg, mask in zip(segments, live):
            get = seg.term_index.get
            found = [(i, tid) for i, tid in enumerate(map(get, terms)) if tid is not None]
            if not found:
                continue
            if mask is None:
                for i, tid in found:
                    df[i] += int(seg.df[tid])
            else:
                tids = np.array([tid for _, tid in found], np.int64)
                counts = postings.count_live(seg.offsets, seg.docs, tids, mask)
                for (i, _), c in zip(found, counts.tolist()):
                    df[i] += c
        return df

    def prepare(self, queries: Sequence[Query], segments: Sequence[SegmentIndex],
                live: Sequence[np.ndarray | None], params: dict[str, str], cache: dict) -> Any:
        k1, b = (self.k1, self.b) if not params else \
            _bm25_knobs(params, self.k1, self.b, where="lexical search params")
        if len(live) != len(segments):
            raise ValueError("lexical prepare: one live mask (or None) per segment")
        n_docs, avgdl = self._collection_stats(segments, live, cache)
        dfs: dict[str, int] = cache.setdefault("lexical:df", {})
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
        missing = list({t for counts in all_terms for t in counts if t not in dfs})
        if missing:
            dfs.update(zip(missing, self._doc_freqs(missing, segments, live)))
        terms_out, weights_out = [], []
        log = math.log
        for counts in all_terms:
            ts, ws = [], []
            for t, c in counts.items():
                df = dfs[t]
                if df:  # a term no live row has matches nothing
                    ts.append(t)
                    ws.append(c * log(1.0 + (n_docs - df + 0.5) / (df + 0.5)))
            terms_out.append(ts)
            weights_out.append(ws)
        return LexicalPrepared(terms_out, weights_out, k1, b, avgdl, n_docs)
