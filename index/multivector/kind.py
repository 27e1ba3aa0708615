"""The ``multivector`` kind: late interaction (ColBERT/ColPali MaxSim) over compressed tokens.

Every document token is stored as a k-means centroid code (HPC-ColPali) plus a PQ code of its
residual (PLAID); ``residual=none`` is HPC-ColPali's pure-code mode (codes only, deduplicated per
document: a repeated code cannot change a MaxSim). Queries keep full-precision tokens.

Factory: ``multivector[:KMeans<K>][,residual=OPQ<M>[_<D>]|PQ<M>|none][,prune=P][,binary[=B]]
[,special=drop|keep][,seed=0][,niter=4][,nprobe=4][,ncandidates=2048][,tcs=0.45][,ndocs=256]
[,source=model|user][,dim=N]``.
``source=user``: the token matrices come from the user (ColBERT/ColPali run elsewhere): each
document carries ``tokens`` (n_tokens, d) (``polyindex.ingest.tokens``), queries carry
``query(tokens=...)``; the codebook (k-means codes + residuals) is trained on the user's
tokens, which are used as given (normalize them for cosine MaxSim). ``dim`` (else the first
matrix's) is checked on every document and query. Default ``source=model``: the collection
model's per-token embeddings.
Default: ``multivector:KMeans4096,residual=OPQ32`` (2-byte code + 32-byte rotated residual + a float16
scale per token that undoes most of the reconstruction's loss along the original, see
``multivector_codec.Codebook.scales``: 36 bytes, 42x smaller than float32 384-d tokens).
``prune=P`` keeps the top P (fraction, 0 < P <= 1) of each document's tokens by salience
(attention received in the encoder's last layer; without attention the IDF of the token id,
else of the token's code).
``binary``: B-bit (default 64) centroid signatures give a Hamming first pass instead of the
lookup table. ``special``: drop (default) or keep [CLS]/[SEP]-like tokens, for documents and
queries alike.

Search (end to end, PLAID-style; every cut keeps the collection's best over all segments,
``MultivectorKind.search_snapshot``, ties to the lower global key, so results do not depend on
how documents fell into segments): each query token's ``nprobe`` best centroids select the
documents listed under them (per-segment inverted lists centroid -> documents); PLAID's
centroid interaction with pruning scores them by MaxSim over their codes, reading only the
centroids whose best score over the query's tokens is >= ``tcs`` (a pruned token offers 0),
and keeps ``ncandidates`` (0: no pruned pass); the full centroid interaction (MaxSim over every
code: LUT, or Hamming in binary mode) keeps ``max(k, ndocs)``; those get the final pass, MaxSim
over centroid + decoded residual. The depths (``nprobe`` 4, ``ncandidates`` 2048, ``tcs`` 0.45,
``ndocs`` 256) were chosen on medline, cranfield and nfcorpus and checked on held-out ones
(docs/notes/multivector.md). No query scores every row unless the search param
``exhaustive=1`` asks for it (every row is a candidate; the cuts still apply). Search params:
``nprobe``, ``ncandidates``, ``tcs``, ``ndocs``, ``exhaustive``, ``final_tokens`` (a query over
that many tokens sends ``ndocs * final_tokens / its tokens`` documents to the final pass:
faster, and it cost quality on a held-out collection, so off by default).
``score(prepared, rows)`` is the final-pass MaxSim of arbitrary rows (rerank mode). One
query's kernels (under ``kernels.PARALLEL_MIN`` candidates) and tables run on the calling
thread.

Per segment (format 2): ``multivector.tokens.arrow`` (one row per stored token: ``codes``
uint16, uint8 when K <= 256; ``residual`` fixed_size_binary[M] and ``scale`` float16 unless
pure-code), ``multivector.docs.arrow`` (one row per document: ``n_tokens`` uint16, uint32 for
documents over 65,535 tokens; offsets are their running sum, computed at open) and
``multivector.ivf.arrow`` (one row per centroid: ``docs`` list<int32>, ascending). Format 1
(per-document list columns with int32 offsets in the tokens file) is still read.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from polyindex.cuda.device import torch_kernels
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index.multivector import codec
from polyindex.index.multivector.files import (
    DOCS_FILE,
    FORMAT,
    IVF_FILE,
    TOKENS_FILE,
    list_column,
    open_v1,
    open_v2,
    read_table,
    write_segment,
)
from polyindex.index.multivector.factory import DEFAULTS, check_memory
from polyindex.index.multivector.factory import parse as _parse
from polyindex.index.multivector.kernels import backend, probe_tables
from polyindex.index.multivector.kernels import top as _top
from polyindex.index.multivector.tables import QUERY_CHUNK, Tables
from polyindex.index.protocol import (
    BuildBatch,
    DocTokens,
    IndexKind,
    Query,
    TokenEncoder,
    check_format,
    empty_result,
)
from polyindex.index.ranges import concat_ranges
from polyindex.index.multivector.segment import (MVPrepared, MVQuery, MultivectorSegment,
                                                 _NO_SCALE)
from polyindex.types import document_text

_SEARCH_KNOBS = ("nprobe", "ncandidates", "tcs", "ndocs", "final_tokens", "exhaustive")
# a query over this many tokens sends fewer than ndocs documents to the final pass
# (``MVPrepared.final_docs``); 0: ndocs for every query
FINAL_TOKENS = 0


def _idf_salience(keys: np.ndarray, doc: np.ndarray, n_docs: int) -> np.ndarray:
    """IDF (over this batch's documents) of each token's key (vocabulary id or code)."""
    keys = keys.astype(np.int64)
    v = int(keys.max()) + 1 if len(keys) else 1
    pairs = np.unique(doc * v + keys)
    df = np.bincount(pairs % v, minlength=v)
    return np.log((n_docs + 1) / (df[keys] + 0.5)).astype(np.float32)


def _keep_top(salience: np.ndarray, lengths: np.ndarray, frac: float) -> np.ndarray:
    """Mask keeping the ceil(frac * n) most salient tokens of each document (at least one)."""
    n_docs = len(lengths)
    doc = np.repeat(np.arange(n_docs), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    order = np.lexsort((np.arange(len(doc)), -salience, doc))  # per doc, most salient first
    rank = np.arange(len(doc)) - starts[doc[order]]
    quota = np.where(lengths > 0, np.maximum(1, np.ceil(frac * lengths - 1e-9)), 0).astype(np.int64)
    keep = np.zeros(len(doc), bool)
    keep[order[rank < quota[doc[order]]]] = True
    return keep


SHARED_MIN_TOKENS = 2048  # ``trains_from``: tokens a first batch needs to fix the codebook


class MultivectorKind(IndexKind):
    kind = "multivector"
    needs_tokens = True

    def __init__(self, body: str):
        cfg = _parse(body)
        self.k, self.m, self.prune, self.bits = cfg["k"], cfg["m"], cfg["prune"], cfg["bits"]
        self.opq, self.opq_dim = cfg["opq"], cfg["opq_dim"]
        self.special, self.seed, self.niter = cfg["special"], cfg["seed"], cfg["niter"]
        self.nprobe, self.ndocs = cfg["nprobe"], cfg["ndocs"]
        self.ncandidates, self.tcs = cfg["ncandidates"], cfg["tcs"]
        self.source, self.declared_dim = cfg["source"], cfg["dim"]
        # the user's tokens: the writer encodes nothing for this kind
        self.needs_tokens = self.source == "model"
        self.codebook: codec.Codebook | None = None
        self._kernels = None
        self._saved = False
        text = f"KMeans{self.k},residual=" + (
            f"{'OPQ' if self.opq else 'PQ'}{self.m}" if self.m else "none")
        if self.opq_dim and self.m:
            text += f"_{self.opq_dim}"
        if self.prune < 1:
            text += f",prune={self.prune:g}"
        if self.bits:
            text += ",binary" if self.bits == 64 else f",binary={self.bits}"
        for key in ("special", "seed", "niter", "nprobe", "ncandidates", "tcs", "ndocs"):
            if cfg[key] != DEFAULTS[key]:
                text += f",{key}={cfg[key]:g}" if key == "tcs" else f",{key}={cfg[key]}"
        if self.source == "user":
            text += ",source=user" + (f",dim={self.declared_dim}" if self.declared_dim else "")
        super().__init__(text)

    @property
    def dim(self) -> int | None:
        """The token dimension: declared, else the codebook's (None before the first build)."""
        return self.declared_dim or (self.codebook.d if self.codebook is not None else None)

    def describe(self) -> str:
        """The factory string; once a codebook is trained (or loaded) with fewer centroids
        than asked (a small collection: K is at most a quarter of the training tokens), the
        K it has, so ``info`` says what is used (the same string recreates it)."""
        text = super().describe()
        if self.codebook is not None and self.codebook.k != self.k:
            text = text.replace(f"KMeans{self.k}", f"KMeans{self.codebook.k}", 1)
        return text

    def __getstate__(self):  # for the build process: kernels are chosen again there
        return {**self.__dict__, "_kernels": None}

    @property
    def kernels(self):
        key = (self.device, torch_kernels(self.device))  # the env switch may change in tests
        if self._kernels is None or self._kernels[0] != key:
            self._kernels = (key, backend(self.device))
        return self._kernels[1]

    @property
    def wants_salience(self) -> bool:
        return self.prune < 1

    # -- tokens ------------------------------------------------------------------------------
    def token_encoder(self) -> TokenEncoder:
        if self._token_encoder is None:
            raise InvalidArgument("multivector: no token encoder attached (the collection "
                                  "attaches its model's; pass query tokens or build tokens)")
        return self._token_encoder()

    def _batch_tokens(self, batch: BuildBatch) -> Sequence[DocTokens]:
        if batch.tokens is not None:
            if len(batch.tokens) != len(batch.ids):
                raise InvalidArgument(f"multivector: {len(batch.tokens)} token sets for "
                                      f"{len(batch.ids)} documents")
            return batch.tokens
        if self.source == "user":
            raise InvalidArgument("multivector (source=user): the documents carry no token "
                                  "matrices (\"tokens\": [[...], ...])")
        # No tokens from the writer (an online buffer segment): encode the texts here.
        texts = [document_text(t, x) for t, x in zip(batch.titles, batch.texts)]
        return self.token_encoder().encode_documents(texts, salience=self.wants_salience)[1]

    def _flatten(self, toks: Sequence[DocTokens]):
        """Concatenated kept vectors (float16/32), lengths, and per-token salience / ids. The
        kept rows are copied once, into one array (a copy per document and then a
        concatenation took 0.9 s of CPU for medline's 194k tokens, twice per segment)."""
        mats, sels, lengths, sal, ids = [], [], [], [], []
        for i, t in enumerate(toks):
            v = np.asarray(t.vectors)
            if v.ndim != 2:
                raise InvalidArgument(f"multivector: document {i}: token vectors must be "
                                      f"(n_tokens, d), got shape {v.shape}")
            sel = None if self.special == "keep" or t.special is None \
                else ~np.asarray(t.special, bool)
            mats.append(v)
            sels.append(sel)
            lengths.append(len(v) if sel is None else int(sel.sum()))
            sal.append(None if t.salience is None else
                       np.asarray(t.salience, np.float32)[sel if sel is not None else slice(None)])
            ids.append(None if t.token_ids is None else
                       np.asarray(t.token_ids)[sel if sel is not None else slice(None)])
        d = mats[0].shape[1] if mats else 0
        if any(v.shape[1] != d for v in mats):
            raise InvalidArgument("multivector: token vectors of one batch differ in dimension")
        dtype = np.result_type(*mats) if mats else np.float32
        x = np.empty((sum(lengths), d), dtype)
        at = 0
        for v, sel, n in zip(mats, sels, lengths):
            if sel is None:
                x[at:at + n] = v
            else:
                np.compress(sel, v, axis=0, out=x[at:at + n])
            at += n
        return x, np.asarray(lengths, np.int64), sal, ids

    # -- collection-level training -----------------------------------------------------------
    def needs_training(self) -> bool:
        return self.codebook is None or not self._saved

    def trains_from(self, batch: BuildBatch) -> bool:
        """May a collection's first write batch train the codebook (``storage.shared_training``)?
        Only one of at least ``SHARED_MIN_TOKENS`` tokens (the user's rows, or about a token
        a word of text, counted before any encoding): the codebook is sized to what it
        trains on, so a first upsert of one document would fix a tiny one for good; a
        smaller batch leaves it to the first seal (or the next batch)."""
        if batch.tokens is not None:
            n = sum(len(t.vectors) for t in batch.tokens)
        else:
            n = sum(len(x.split()) + len(t.split()) for t, x in zip(batch.titles, batch.texts))
        return n >= SHARED_MIN_TOKENS

    def train(self, sample: BuildBatch) -> None:
        if self.codebook is not None:  # a fallback codebook: segments already use it
            return
        x, _, _, _ = self._flatten(self._batch_tokens(sample))
        if len(x) == 0:
            raise InvalidArgument("multivector: training needs documents with tokens")
        if not np.isfinite(x).all():
            raise InvalidArgument("multivector: token vectors contain NaN or infinity")
        check_memory({"k": self.k, "m": self.m, "opq": self.opq, "opq_dim": self.opq_dim},
                     x.shape[1], "multivector")
        self.codebook = codec.train(x, self.k, self.m, seed=self.seed, niter=self.niter,
                                    bits=self.bits, opq=self.opq, opq_dim=self.opq_dim)

    def save_artifacts(self, folder: Path) -> list[str]:
        if self.codebook is None:
            return []
        self._saved = True
        return self.codebook.save(Path(folder))

    def load_artifacts(self, folder: Path) -> None:
        cb = codec.Codebook.load(Path(folder))
        if cb is None:
            return
        opq = cb.rotation is not None
        if cb.m != self.m or cb.meta.get("bits_asked", cb.bits) != self.bits \
                or (opq != self.opq and self.m) \
                or (opq and cb.d_res != (self.opq_dim or cb.d)):
            raise Corrupt(f"{folder}: the multivector codebook has residual "
                          f"{'OPQ' if opq else 'PQ'}{cb.m} ({cb.d_res}-d) and {cb.bits}-bit "
                          f"signatures, the factory string says {self.describe()!r}")
        self.codebook, self._saved = cb, True

    # -- segments ----------------------------------------------------------------------------
    def build(self, batch: BuildBatch, folder: Path) -> dict:
        folder = Path(folder)
        toks = self._batch_tokens(batch)
        if self.codebook is None:  # a per-segment fallback; collections train once first
            self.train(BuildBatch(batch.ids, batch.titles, batch.texts, None, toks))
        cb = self.codebook
        x, lengths, sal, ids = self._flatten(toks)
        n, n_in = len(lengths), int(lengths.sum())
        if self.declared_dim and n_in and x.shape[1] != self.declared_dim:
            raise InvalidArgument(f"multivector: token vectors have dimension {x.shape[1]}, "
                                  f"the index declares dim={self.declared_dim}")
        if n_in and x.shape[1] != cb.d:
            raise InvalidArgument(f"multivector: token vectors have dimension {x.shape[1]}, "
                                  f"the codebook expects {cb.d}")
        codes = cb.assign(x) if n_in else np.zeros(0, np.int64)
        if self.prune < 1 and n_in:
            doc = np.repeat(np.arange(n), lengths)
            if all(s is not None for s in sal):
                salience, source = np.concatenate(sal), "attention"
            elif all(i is not None for i in ids):
                salience, source = _idf_salience(np.concatenate(ids), doc, n), "idf-token"
            else:
                salience, source = _idf_salience(codes, doc, n), "idf-code"
            keep = _keep_top(salience, lengths, self.prune)
            x, codes = x[keep], codes[keep]
            lengths = np.bincount(doc[keep], minlength=n).astype(np.int64)
        else:
            source = None
        n_kept = int(lengths.sum())
        if self.m:
            res = cb.residual_codes(x, codes)
        else:  # pure codes: duplicates within a document cannot change MaxSim
            doc = np.repeat(np.arange(n), lengths)
            pairs = np.unique(doc * cb.k + codes)
            doc, codes = pairs // cb.k, pairs % cb.k
            lengths = np.bincount(doc, minlength=n).astype(np.int64)
            res = None
        scale = cb.scales(x, codes, res) if res is not None else None
        info = write_segment(folder, cb, codes, res, scale, lengths)
        return {**info, "tokens_in": n_in, "tokens_kept": n_kept,
                "kept_fraction": (n_kept / n_in) if n_in else 1.0, "salience": source}

    def merge(self, parts, batch: BuildBatch, folder: Path) -> dict:
        """Merged segments keep their stored tokens: codes, residuals and scales of the kept
        rows are copied (no re-encoding, no re-quantization); the inverted lists are rebuilt."""
        cb = self.codebook
        codes, res, scale, lengths = [], [], [], []
        has_scale = all(seg.scale is not _NO_SCALE for seg, _ in parts)
        for seg, rows in parts:
            starts, ends = seg.offsets[rows], seg.offsets[rows + 1]
            take = concat_ranges(starts, ends)
            lengths.append(ends - starts)
            codes.append(np.asarray(seg.codes[take], np.int64))
            if cb.m:
                res.append(seg.res[take])
                if has_scale:
                    scale.append(seg.scale[take])
        lengths = np.concatenate(lengths).astype(np.int64)
        info = write_segment(Path(folder), cb, np.concatenate(codes),
                              np.concatenate(res) if cb.m else None,
                              np.concatenate(scale).view(np.float16) if cb.m and has_scale
                              else None, lengths)
        stored = int(lengths.sum())
        return {**info, "tokens_in": stored, "tokens_kept": stored, "kept_fraction": 1.0,
                "salience": "merged"}

    def open(self, folder: Path, info: dict, docs=None) -> MultivectorSegment:
        folder = Path(folder)
        check_format(folder, info, "multivector", FORMAT)
        if self.codebook is None:
            raise Corrupt(f"{folder}: a multivector segment exists but the collection has no "
                          f"codebook artifact")
        n_rows, m = int(info.get("n_rows", -1)), int(info.get("m", self.m))
        if int(info.get("format", 1)) == 1:
            offsets, codes, res, scale, tt = open_v1(folder, info, m)
        else:
            offsets, codes, res, scale, tt = open_v2(folder, info, m)
        it = read_table(folder / IVF_FILE)
        ivf_col = list_column(it, "docs", folder)
        ivf_off, ivf_docs = ivf_col.offsets.to_numpy(), ivf_col.values.to_numpy(zero_copy_only=True)
        if len(offsets) - 1 != n_rows or len(ivf_off) - 1 != self.codebook.k \
                or (len(codes) and int(codes.max()) >= self.codebook.k) \
                or (len(ivf_docs) and (ivf_docs.min() < 0 or ivf_docs.max() >= n_rows)):
            raise Corrupt(f"{folder}: multivector index files are inconsistent (rows "
                          f"{len(offsets) - 1} vs {n_rows}, centroids {len(ivf_off) - 1} vs "
                          f"{self.codebook.k})")
        return MultivectorSegment(n_rows, offsets, codes, res, scale, ivf_off, ivf_docs, self,
                                  (tt, it))

    # -- queries -----------------------------------------------------------------------------
    def _query_tokens(self, queries: Sequence[Query]) -> list[np.ndarray]:
        out: list = [None] * len(queries)
        missing = []
        for i, q in enumerate(queries):
            t = q.extra.get("tokens") if q.extra else None
            if t is None:
                if self.source == "user":
                    raise InvalidArgument(f"query {i}: the multivector index takes the user's "
                                          f"tokens: give query tokens (query(tokens=...))")
                if not q.text:
                    raise InvalidArgument(f"query {i}: the multivector index needs query text "
                                          f"(or query tokens)")
                missing.append(i)
            else:
                out[i] = t
        if missing:
            enc = self.token_encoder().encode_queries([queries[i].text for i in missing])
            for i, t in zip(missing, enc):
                out[i] = t
        for i, t in enumerate(out):
            if isinstance(t, DocTokens):
                v = np.asarray(t.vectors, np.float32)
                if self.special == "drop" and t.special is not None:
                    v = v[~np.asarray(t.special, bool)]
            else:
                v = np.asarray(t, np.float32)
            if v.ndim != 2 or not np.isfinite(v).all():
                raise InvalidArgument(f"query {i}: query tokens must be a finite "
                                      f"(n_tokens, d) array, got shape {v.shape}")
            out[i] = np.ascontiguousarray(v)
        return out

    def search_snapshot(self, prepared: MVPrepared, segments: Sequence[MultivectorSegment],
                        bases: np.ndarray, k: int, params, allow):
        """Every segment at once, so ``ndocs`` is collection-wide: the candidates of all
        segments (their probed inverted lists) get the first pass, the snapshot's best
        max(k, ndocs) of them (ties: lower global key) the final pass. The same rows, scores
        and order as one segment holding the same documents. Queries go through the kernels
        together, ``QUERY_CHUNK`` at a time: one first-pass and one final-pass call per
        segment for the whole chunk (``kernels.*_batch``), scores identical to one query's."""
        nq = len(prepared.queries)
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        scores, keys = empty_result(nq, k)
        if k == 0:
            return scores, keys
        live = [(seg, seg._check_allow(m), int(b)) for seg, m, b in zip(segments, allow, bases)
                if seg.n_rows]
        active = [qi for qi, q in enumerate(prepared.queries) if len(q.tokens)]
        for c in range(0, len(active) if live else 0, QUERY_CHUNK):
            chunk = active[c:c + QUERY_CHUNK]
            qs = [prepared.queries[qi] for qi in chunk]
            keep = [max(k, prepared.final_docs(len(q.tokens))) for q in qs]
            wide = [max(x, prepared.ncandidates) for x in keep]
            tables = Tables(qs)
            # cands[j][a]: segment j's candidate rows for the chunk's a-th query
            cands = [[seg._candidates(q, prepared, m) for q in qs] for seg, m, _ in live]

            def count(a):
                return sum(len(cs[a]) for cs in cands)
            prepared.stats["candidates"] += sum(count(a) for a in range(len(qs)))
            # PLAID's stages, each keeping the collection's best: centroid interaction over
            # the kept centroids (to ``ncandidates``), then over every code (to ``ndocs``)
            pruned = [a for a in range(len(qs)) if prepared.ncandidates and count(a) > wide[a]
                      and qs[a].kept is not None]
            if pruned:
                self._narrow(tables, live, cands, pruned, wide, "pruned")
            first = [a for a in range(len(qs)) if count(a) > keep[a]
                     and any(seg.two_pass(qs[a]) for seg, _, _ in live)]
            if first:
                self._narrow(tables, live, cands, first, keep, "first")
            prepared.stats["final"] += sum(count(a) for a in range(len(qs)))
            every = list(range(len(qs)))
            fin = [seg._batch_pass(tables, every, cs, "final")
                   for (seg, _, _), cs in zip(live, cands)]
            for a, qi in enumerate(chunk):
                if not count(a):
                    continue
                s, r = _top(np.concatenate([f[a] for f in fin]),
                            np.concatenate([cs[a] + b for cs, (_, _, b) in zip(cands, live)]), k)
                scores[qi, :len(s)], keys[qi, :len(r)] = s, r
        return scores, keys

    @staticmethod
    def _narrow(tables: Tables, live, cands, which: list[int], keep: list[int],
                stage: str) -> None:
        """Cut the candidates of queries ``which`` to their best ``keep[a]`` (query ``a``'s)
        at ``stage``, over every segment at once (ties: the lower global key), in place."""
        fs = [seg._batch_pass(tables, which, [cs[a] for a in which], stage)
              for (seg, _, _), cs in zip(live, cands)]
        for i, a in enumerate(which):
            glob = np.concatenate([cs[a] + b for cs, (_, _, b) in zip(cands, live)])
            _, best = _top(np.concatenate([f[i] for f in fs]), glob, keep[a])
            for j, (seg, _, b) in enumerate(live):
                cands[j][a] = best[(best >= b) & (best < b + seg.n_rows)] - b

    def prepare(self, queries: Sequence[Query], segments, live, params, cache) -> MVPrepared:
        unknown = sorted(set(params) - set(_SEARCH_KNOBS))
        if unknown:
            raise InvalidArgument(f"multivector: unknown search parameter(s) {unknown}; known: "
                                  f"{list(_SEARCH_KNOBS)}")
        try:
            nprobe = int(params.get("nprobe", self.nprobe))
            ndocs = int(params.get("ndocs", self.ndocs))
            ncand = int(params.get("ncandidates", self.ncandidates))
            tcs = float(params.get("tcs", self.tcs))
            final_tokens = int(params.get("final_tokens", FINAL_TOKENS))
        except ValueError:
            raise InvalidArgument(f"multivector: nprobe, ncandidates, ndocs and final_tokens "
                                  f"must be integers and tcs a number, got {params}") from None
        exhaustive = {"0": False, "1": True, "false": False, "true": True}.get(
            str(params.get("exhaustive", "0")).lower())
        if exhaustive is None or nprobe < 1 or ndocs < 1 or ncand < 0 or final_tokens < 0 \
                or not np.isfinite(tcs):
            raise InvalidArgument(f"multivector: nprobe and ndocs must be >= 1, ncandidates "
                                  f"and final_tokens >= 0, tcs finite and exhaustive 0 or 1, "
                                  f"got {params}")
        cb = self.codebook
        if cb is None:
            if any(seg.n_rows for seg in segments):
                raise Corrupt("multivector: segments exist but the collection has no codebook")
            empty = np.zeros((0, 0), np.float32)
            return MVPrepared([MVQuery(empty, empty, None, None, np.zeros(0, np.int64))
                               for _ in queries], nprobe, ndocs, exhaustive, ncand)
        tokens = self._query_tokens(queries)  # may run the model: outside the BLAS limit
        with codec.one_blas_thread():
            return MVPrepared(self._tables(tokens, nprobe, tcs, ncand), nprobe, ndocs,
                              exhaustive, ncand, final_tokens)

    def _tables(self, tokens: list[np.ndarray], nprobe: int, tcs: float, ncand: int):
        """Each query's ``MVQuery``: its tables, probes and (``ncand``) kept centroids."""
        cb = self.codebook
        out = []
        for i, q in enumerate(tokens):
            if len(q) and q.shape[1] != cb.d:
                raise InvalidArgument(f"query {i}: query tokens have dimension {q.shape[1]}, the "
                                      f"multivector index has {cb.d}")
            if len(q) == 0:
                empty = np.zeros((cb.k, 0), np.float32)
                out.append(MVQuery(q.reshape(0, cb.d), empty, None, None, np.zeros(0, np.int64)))
                continue
            lut = cb.scores(q)  # (nqt, K)
            lut_t = np.empty((cb.k, len(q)), np.float32)
            best = np.empty(cb.k, np.float32)
            every = nprobe >= cb.k  # every centroid probed: no top lists to keep
            probes = probe_tables(lut, 0 if every else nprobe, lut_t, best)
            if every:
                probes = np.arange(cb.k, dtype=np.int64)
            out.append(MVQuery(q, lut_t, cb.pq_tables(q) if cb.m else None,
                               cb.signature(q) if self.bits and cb.bits else None,
                               probes, (best >= tcs).view(np.uint8) if ncand else None))
        return out
