"""The ``sparse`` kind: ultra-high-dimensional sparse vectors on an inverted index.

A collection-level projector (``projector``: a k-sparse autoencoder trained on the first
segment's embeddings) maps each dense embedding to its top-k of D latents; the latents are the
vocabulary of an inverted index that shares its machinery with ``lexical`` (``postings``).

Factory: ``sparse[:UHD<D>][,k=K][,k_query=Q][,rescore=R][,binary|,recon][,seed=0][,epochs=E]``.
Default: ``sparse:UHD4096,k=64,k_query=32,rescore=400``.
``UHD<D>``: D latents (4,096-65,536); ``k``: latents per document; ``k_query``: per query;
``binary``: documents keep only which latents fired and a match counts 1 (the score is the
overlap count), otherwise weights are float16; ``rescore=R``: re-rank the collection's sparse
top R (across segments: ``SparseKind.search_snapshot``) by the exact dense inner product with
the stored embeddings (the default: the sparse index is the candidate generator of an exact
dense score); ``rescore=0``: pure sparse scores.
``recon``: the sparse dot product is the query against each document's k-atom reconstruction.
A document keeps the encoder's top-k latents with least-squares weights over their decoder
atoms (``Projector.encode_recon``, signed); a query weighs latent j by ``w_dec_j . q``
(``Projector.recon_query``; ``k_query`` defaults to D, every latent, the exact
``q . x_hat``; a smaller one keeps the largest magnitudes). Signed weights rule out MaxScore:
recon queries are scored exhaustively. The best pure sparse configuration measured (issue 23,
``sparse:UHD4096,k=256,rescore=0,recon``); the artifact keeps the decoder (D x d float32).
``describe()`` always spells out ``k_query`` and ``rescore``: they decide what a query
returns, so the stored string says it (an omitted option takes the default above).
Search params: ``k=`` query latents (sparsity at query time), ``prune=auto|maxscore|exhaustive``
(term-at-a-time MaxScore or exhaustive, same top-k; auto takes MaxScore when the query's
posting lists are long), ``rescore=R``.

Per segment two Arrow IPC files: ``sparse.terms.arrow`` (``offset`` int64 and ``maxw`` float32
per latent: first posting and largest weight magnitude, the MaxScore bound) and ``sparse.postings.arrow``
(``doc`` int32 ascending within a latent, plus ``w`` float16 unless binary).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa

from polyindex.cuda.device import kernel_device, torch_kernels
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index import postings
from polyindex.index.protocol import (
    BuildBatch,
    IndexKind,
    Query,
    SegmentIndex,
    check_format,
    empty_result,
    merge_segments,
    option,
    parse_options,
)
from polyindex.index.sparse import kernels as sparse_kernels
from polyindex.index.sparse.projector import Projector, TrainConfig, train

TERMS_FILE = "sparse.terms.arrow"
POSTINGS_FILE = "sparse.postings.arrow"
FORMAT = 1
MIN_DIM, MAX_DIM = 4096, 65536
_TERMS_SCHEMA = {"offset": pa.int64(), "maxw": pa.float32()}
_LUT = postings.half_lut()
_NO_VALS = postings.readonly(np.zeros(0, np.uint16))  # as the mapped weights: one kernel type
_SEARCH_KNOBS = ("k", "prune", "rescore")
FLAGS = ("binary", "recon")
# The default configuration (README, docs/ARCHITECTURE.md and tests/test_defaults.py agree).
DEFAULTS = {"dim": 4096, "k": 64, "k_query": 32, "rescore": 400, "seed": 0, "epochs": 10}
AUTO_PRUNE_POSTINGS = 50_000  # per query: below it exhaustive scoring is faster than MaxScore


@dataclass
class SparsePrepared:
    """A query batch as latents: query q's are ``terms[ptr[q]:ptr[q+1]]`` (by weight desc)."""

    ptr: np.ndarray  # int64 (nq + 1,)
    terms: np.ndarray  # int64
    weights: np.ndarray  # float64 (1.0 each in binary mode)
    vectors: np.ndarray  # (nq, d) float32, for rescoring
    prune: bool | None  # None: auto
    rescore: int
    touched: np.ndarray  # int64 (nq,): postings read, summed over the segments searched


class SparseSegment(SegmentIndex):
    def __init__(self, folder: Path, n_rows: int, offsets, maxw, docs, vals, binary: bool,
                 keep=(), stored=None, device: str = "cpu"):
        self.folder, self.n_rows = folder, n_rows
        self.device = device
        self._torch = None  # the posting lists on the torch kernels' device, made on first use
        self._stored = stored  # the segment's SegmentDocs (embeddings for rescoring)
        self.offsets, self.maxw, self.docs, self.vals = offsets, maxw, docs, vals
        self.binary = binary
        self._keep = keep  # Arrow tables owning the memory maps
        self._pool = postings.BufferPool(n_rows)
        self._emb = None
        self._lock = threading.Lock()

    def _embeddings(self) -> np.ndarray:
        """The segment's stored dense embeddings (docs.arrow, memory-mapped) for rescoring."""
        with self._lock:
            if self._emb is None:
                emb = self._stored.embeddings() if self._stored is not None else None
                if emb is None:
                    raise InvalidArgument("sparse rescore: the segment stores no embeddings")
                self._emb = emb
            return self._emb

    def search(self, prepared: SparsePrepared, k: int, params, allow):
        """This segment alone: its sparse top ``max(k, rescore)``, re-scored when ``rescore``.
        A snapshot searches through ``SparseKind.search_snapshot`` (a collection-wide R)."""
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        rescore = prepared.rescore  # params were read by prepare
        scores, rows = self.candidates(prepared, max(k, rescore) if k else 0, allow)
        if rescore and k:
            return self._rescore(prepared.vectors, rows, k)
        return scores, rows

    def candidates(self, prepared: SparsePrepared, depth: int, allow):
        """The segment's sparse top ``depth`` (pure sparse scores, ties: row id)."""
        nq = len(prepared.ptr) - 1
        if depth == 0 or self.n_rows == 0 or len(prepared.terms) == 0:
            return empty_result(nq, depth)
        prune = prepared.prune
        if prune is None:  # auto: MaxScore only pays off on long posting lists
            lengths = self.offsets[prepared.terms + 1] - self.offsets[prepared.terms]
            prune = int(lengths.sum()) >= AUTO_PRUNE_POSTINGS * nq
        allow = postings.check_allow(allow, self.n_rows, "sparse search")
        if torch_kernels(self.device):  # cuda placement: polyindex.cuda.sparse (exhaustive)
            return self._torch_candidates(prepared, depth, allow)
        counts = np.zeros(nq, np.int64)
        head = (self.offsets, self.docs, self.vals, _LUT)
        if prune:
            kernel, args = sparse_kernels.maxscore_search, (*head, self.maxw, self.binary)
        else:
            kernel, args = sparse_kernels.sparse_search, (*head, self.binary)
        args = (*args, prepared.ptr, prepared.terms, prepared.weights, counts)
        scores, rows = postings.run_search(kernel, args, self._pool, nq, depth, allow)
        prepared.touched += counts
        return scores, rows

    def _torch_candidates(self, prepared: SparsePrepared, depth: int, allow):
        from polyindex.cuda import sparse as torch_sparse
        with self._lock:
            if self._torch is None:
                self._torch = torch_sparse.SparseTensors(
                    self.offsets, self.docs, self.vals, self.binary, self.n_rows,
                    kernel_device(self.device), _LUT)
        s, r, counts = torch_sparse.search(self._torch, prepared.ptr, prepared.terms,
                                           prepared.weights, depth, allow)
        prepared.touched += counts
        return s.cpu().numpy(), r.cpu().numpy()

    def _rescore(self, vectors, rows, k):
        """Exact dense inner products of the sparse candidates, best first (ties: row id)."""
        emb = self._embeddings()
        out_s = np.empty((len(rows), k), np.float32)
        out_i = np.empty((len(rows), k), np.int64)
        bufs = self._pool.get()
        sparse_kernels.rescore_rows(emb, vectors, rows, *bufs, out_s, out_i)
        self._pool.put(bufs)
        return out_s, out_i

    def score(self, prepared: SparsePrepared, row_ids):
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        out = np.empty((len(prepared.ptr) - 1, len(rows)), np.float32)
        sparse_kernels.sparse_score_rows(self.offsets, self.docs, self.vals, _LUT, self.binary,
                                   self.n_rows, prepared.ptr, prepared.terms, prepared.weights,
                                   rows, out)
        return out


def _parse(body: str) -> dict:
    where = f"index factory string {('sparse:' + body) if body else 'sparse'!r}"
    parts = [p.strip() for p in (body or "").split(",") if p.strip()]
    dim = DEFAULTS["dim"]
    if parts and "=" not in parts[0] and parts[0] not in FLAGS:
        head = parts.pop(0)
        if not head.upper().startswith("UHD") or not head[3:].isdigit():
            raise InvalidArgument(f"{where}: expected UHD<D> (e.g. UHD16384), got {head!r}")
        dim = int(head[3:])
    binary, recon = "binary" in parts, "recon" in parts
    if binary and recon:
        raise InvalidArgument(f"{where}: binary and recon exclude each other (recon weights "
                              f"are signed least-squares fits)")
    opts = parse_options(",".join(p for p in parts if p not in FLAGS), where=where)
    unknown = sorted(set(opts) - {"k", "k_query", "seed", "epochs", "rescore"})
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; the sparse "
                              f"index knows k, k_query, seed, epochs, rescore, binary and recon")
    out = {"dim": dim, "binary": binary, "recon": recon}
    for key in ("k", "k_query", "seed", "epochs", "rescore"):
        # recon queries weigh every latent by default: their score is then q . x_hat exactly
        default = dim if key == "k_query" and recon else DEFAULTS[key]
        out[key] = option(opts, key, int, default, where=where)
    if not MIN_DIM <= dim <= MAX_DIM:
        raise InvalidArgument(f"{where}: D must be in {MIN_DIM}..{MAX_DIM}, got {dim}")
    for key, lo, hi in (("k", 1, min(1024, dim)), ("k_query", 1, dim), ("epochs", 1, 1000),
                        ("seed", 0, 2**31 - 1), ("rescore", 0, 100_000)):
        if not lo <= out[key] <= hi:
            raise InvalidArgument(f"{where}: {key} must be in {lo}..{hi}, got {out[key]}")
    return out


class SparseKind(IndexKind):
    kind = "sparse"
    needs_embeddings = True

    def __init__(self, body: str):
        cfg = _parse(body)
        self.dim, self.k, self.binary = cfg["dim"], cfg["k"], cfg["binary"]
        self.recon = cfg["recon"]
        self.k_query = cfg["k_query"]
        self.seed, self.epochs, self.rescore = cfg["seed"], cfg["epochs"], cfg["rescore"]
        self.projector: Projector | None = None
        self._saved = False
        text = f"UHD{self.dim},k={self.k},k_query={self.k_query},rescore={self.rescore}" + (
            ",binary" if self.binary else "") + (",recon" if self.recon else "")
        for key, value in (("seed", self.seed), ("epochs", self.epochs)):
            if value != DEFAULTS[key]:
                text += f",{key}={value}"
        super().__init__(text)

    # -- collection-level training -------------------------------------------------------
    def needs_training(self) -> bool:
        # A projector trained by ``build``'s fallback (an online buffer segment before the
        # first seal) is not saved yet: the writer's training step then saves that one.
        return self.projector is None or not self._saved

    def train_config(self) -> TrainConfig:
        k = self.k
        ks = {max(1, k // 4), max(1, k // 2), k, min(2 * k, self.dim)}
        if not self.recon:  # recon queries never go through the encoder
            ks.add(self.k_query)
        return TrainConfig(dim=self.dim, ks=tuple(sorted(ks)), seed=self.seed, epochs=self.epochs)

    def train(self, sample: BuildBatch) -> None:
        if sample.embeddings is None or len(sample.embeddings) == 0:
            raise InvalidArgument("sparse: training needs document embeddings")
        if self.projector is None:  # keep a fallback projector: segments already use it
            self.projector = train(sample.embeddings, self.train_config())

    def save_artifacts(self, folder: Path) -> list[str]:
        if self.projector is None:
            return []
        self._saved = True
        return self.projector.save(Path(folder), decoder=self.recon)

    def load_artifacts(self, folder: Path) -> None:
        proj = Projector.load(Path(folder))
        if proj is not None and proj.dim != self.dim:
            raise Corrupt(f"{folder}: the sparse projector has D={proj.dim}, the index "
                          f"factory string says UHD{self.dim}")
        if proj is not None and self.recon and (proj.w_dec is None or proj.centre is None):
            raise Corrupt(f"{folder}: the sparse projector has no decoder, and the index "
                          f"factory string says recon")
        if proj is not None:
            self.projector, self._saved = proj, True

    # -- segments ------------------------------------------------------------------------
    def build(self, batch: BuildBatch, folder: Path) -> dict:
        folder = Path(folder)
        x = batch.embeddings
        if x is None:
            raise InvalidArgument("sparse: the segment has no embeddings to index")
        if self.projector is None:  # a per-segment fallback; collections train once first
            self.train(batch)
        if x.shape[1] != self.projector.in_dim:
            raise InvalidArgument(f"sparse: embeddings have dimension {x.shape[1]}, the "
                                  f"projector expects {self.projector.in_dim}")
        n = len(x)
        vals, dims = (self.projector.encode_recon if self.recon else self.projector.encode)(
            x, self.k)
        vals = vals.astype(np.float16)  # stored precision; bounds are computed on it
        keep = vals.reshape(-1) != 0  # encode: ReLU-cut latents; recon: exact zeros
        rows = np.repeat(np.arange(n, dtype=np.int64), vals.shape[1])[keep]
        offsets, docs, w = postings.build_csr(dims.reshape(-1)[keep], rows,
                                              vals.reshape(-1)[keep], self.dim)
        maxw = np.zeros(self.dim, np.float32)
        if len(w):
            starts = offsets[:-1][np.diff(offsets) > 0]
            # largest magnitude (recon weights are signed; only MaxScore reads it)
            maxw[np.diff(offsets) > 0] = np.maximum.reduceat(np.abs(w.astype(np.float32)),
                                                             starts)
        folder.mkdir(parents=True, exist_ok=True)
        postings.write_arrow(folder / TERMS_FILE, {"offset": offsets[:-1], "maxw": maxw})
        cols = {"doc": docs} if self.binary else {
            "doc": docs, "w": pa.array(w.astype(np.float16), pa.float16())}
        postings.write_arrow(folder / POSTINGS_FILE, cols)
        return {"format": FORMAT, "n_rows": n, "dim": self.dim, "k": self.k,
                "binary": self.binary, "recon": self.recon, "n_postings": int(len(docs)),
                "files": [TERMS_FILE, POSTINGS_FILE]}

    def open(self, folder: Path, info: dict, docs=None) -> SparseSegment:
        folder = Path(folder)
        check_format(folder, info, "sparse", FORMAT)
        binary = bool(info.get("binary", self.binary))
        tt, terms = postings.read_arrow(folder / TERMS_FILE, _TERMS_SCHEMA)
        schema = {"doc": pa.int32()} if binary else {"doc": pa.int32(), "w": pa.float16()}
        pt, post = postings.read_arrow(folder / POSTINGS_FILE, schema)
        n_post, n_rows = len(post["doc"]), int(info.get("n_rows", -1))
        offsets = np.append(terms["offset"], np.int64(n_post))
        if len(offsets) - 1 != info.get("dim", self.dim) or (np.diff(offsets) < 0).any() \
                or (len(offsets) > 1 and offsets[0] != 0) or n_rows < 0 \
                or (n_post and (post["doc"].min() < 0 or post["doc"].max() >= n_rows)):
            raise Corrupt(f"{folder}: sparse index files are inconsistent "
                          f"(latents {len(offsets) - 1}, postings {n_post}, rows {n_rows})")
        vals = _NO_VALS if binary else post["w"].view(np.uint16)
        return SparseSegment(folder, n_rows, offsets, terms["maxw"], post["doc"], vals, binary,
                             (tt, pt), docs, self.device)

    # -- queries -------------------------------------------------------------------------
    def search_snapshot(self, prepared: SparsePrepared, segments: Sequence[SparseSegment],
                        bases: np.ndarray, k: int, params, allow):
        """Every segment at once, so ``rescore=R`` is collection-wide: each segment's sparse
        top max(k, R), then the snapshot's top max(k, R) of those (ties: lower global key),
        and only those rows get the exact dense score. The same rows, scores and order as one
        segment holding the same documents; R dense dot products per query, not R per
        segment."""
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        nq = len(prepared.ptr) - 1
        if not prepared.rescore or k == 0:  # pure sparse scores: per-segment top k, merged
            return merge_segments([seg.candidates(prepared, k, m)
                                   for seg, m in zip(segments, allow)], bases, k)
        depth = max(k, prepared.rescore)
        _, keys = merge_segments([seg.candidates(prepared, depth, m)
                                  for seg, m in zip(segments, allow)], bases, depth)
        parts = []
        for i, seg in enumerate(segments):
            lo, hi = int(bases[i]), int(bases[i + 1])
            inside = (keys >= lo) & (keys < hi)
            parts.append(seg._rescore(prepared.vectors, np.where(inside, keys - lo, -1), k)
                         if inside.any() else empty_result(nq, k))
        return merge_segments(parts, bases, k)

    def prepare(self, queries: Sequence[Query], segments, live, params, cache) -> SparsePrepared:
        unknown = sorted(set(params) - set(_SEARCH_KNOBS))
        if unknown:
            raise InvalidArgument(f"sparse: unknown search parameter(s) {unknown}; known: "
                                  f"{list(_SEARCH_KNOBS)}")
        try:
            k_query = int(params.get("k", self.k_query))
            rescore = int(params.get("rescore", self.rescore))
        except ValueError:
            raise InvalidArgument(f"sparse: search parameters k and rescore must be integers, "
                                  f"got {params}") from None
        if not 1 <= k_query <= self.dim or not 0 <= rescore <= 100_000:
            raise InvalidArgument(f"sparse: k must be in 1..{self.dim} and rescore in "
                                  f"0..100000, got k={k_query}, rescore={rescore}")
        prune = {"auto": None, "1": True, "maxscore": True, "0": False,
                 "exhaustive": False}.get(params.get("prune", "auto"), "?")
        if prune == "?":
            raise InvalidArgument(f"sparse: prune must be auto, maxscore (1) or exhaustive (0), "
                                  f"got {params['prune']!r}")
        if any(q.vector is None for q in queries):
            raise InvalidArgument("the sparse index needs a query vector or query text")
        if self.projector is None:  # nothing indexed yet: every query matches nothing
            if any(seg.n_rows for seg in segments):
                raise Corrupt("sparse: segments exist but the collection has no projector")
            return SparsePrepared(np.zeros(len(queries) + 1, np.int64), np.zeros(0, np.int64),
                                  np.zeros(0), np.zeros((len(queries), 0), np.float32),
                                  prune, rescore, np.zeros(len(queries), np.int64))
        d = self.projector.in_dim
        for i, q in enumerate(queries):
            if q.vector.ndim != 1 or q.vector.shape[0] != d:
                raise InvalidArgument(f"query {i}: vector has shape {q.vector.shape}, the "
                                      f"sparse index expects dimension {d}")
        x = np.stack([q.vector for q in queries]).astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InvalidArgument(f"query {bad}: vector contains NaN or infinity")
        if self.recon:  # signed weights: a partial score is no lower bound, so no MaxScore
            if prune:
                raise InvalidArgument("sparse: prune=maxscore needs non-negative weights; a "
                                      "recon index scores its queries exhaustively")
            prune = False
            vals, dims = self.projector.recon_query(x, k_query)  # magnitude descending
        else:
            vals, dims = self.projector.encode(x, k_query, queries=True)  # weight descending
        keep = vals != 0
        ptr = np.concatenate([[0], np.cumsum(keep.sum(1))]).astype(np.int64)
        weights = np.ones(int(ptr[-1])) if self.binary else vals[keep].astype(np.float64)
        return SparsePrepared(ptr, dims[keep].astype(np.int64), weights, x, prune, rescore,
                              np.zeros(len(queries), np.int64))
