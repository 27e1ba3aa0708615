"""The multivector codebook: k-means centroids, a residual product quantizer, binary signatures.

A token vector ``x`` is stored as its nearest centroid's index (HPC-ColPali's code) plus, unless
the kind runs in pure-code mode, a PQ code of the residual ``x - c`` (PLAID's compact residual):
``x ~ c[code] + PQ_decode(residual code)``. Both quantizers are trained once per collection on
a sample of corpus token vectors and saved as collection artifacts:

- centroids: ``faiss.Kmeans`` (seeded; the sample is drawn with the same seed, so training
  is deterministic for a seed);
- residual: a product quantizer of 256 sub-centroids per byte (``_pq_kmeans``, encoded by
  ``_pq_encode``): M bytes per token (d must be divisible by M);
  with ``opq`` (``residual=OPQ<M>``, the default) the residual is first rotated by a learned
  orthogonal matrix ``R`` (``_train_opq``) that balances its variance over the M
  sub-spaces. Token embeddings put most of their residual energy in a few directions, so plain
  PQ wastes bytes on quiet sub-spaces; on arguana OPQ32 cut the mean squared reconstruction
  error of unit tokens from 0.236 to 0.182 and raised recall@100 against exact MaxSim from
  0.888 to 0.916 at the same 32 bytes. Scoring never rotates a document token: ``q . R^T y``
  is ``(R q) . y``, so the query's PQ tables are built from the rotated query instead;
- binary mode: a b-bit signature per centroid (b <= 64), the signs of the centroid's projection
  on the top-b principal directions of the centroids; a query token gets the signature of its
  own (full-precision) projection, and Hamming similarity approximates the inner product.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import faiss
import numba
import numpy as np

from polyindex.errors import Corrupt, InvalidArgument

WEIGHTS_FILE = "multivector.codebook.npz"
META_FILE = "multivector.codebook.json"
ASSIGN_ROWS = 8192  # token rows per build chunk (assignment: 8,192 x 4,096 float32 scores, 128 MB)
# Training cost (issue 39: medline's codebook took 23 min of a 35 min index run, now about a
# minute): k-means on KMEANS_POINTS tokens per centroid, `niter` (default 4, PLAID's) Lloyd
# steps; the residual PQ and OPQ on PQ_TRAIN residuals (32 per sub-centroid), numpy Lloyd steps.
KMEANS_POINTS = 8
KMEANS_MIN_SAMPLE = 16_384  # a small K is cheap to train on more points per centroid
# residuals for the PQ: 8,192 of 384-d (32 per sub-centroid), more of fewer dimensions at the
# same cost (a 32-d PQ16 on 2-d sub-vectors needs them: recall@10 0.845 at 8,192, >= 0.85 at 16k)
PQ_TRAIN = 8192
PQ_TRAIN_VALUES = PQ_TRAIN * 384
PQ_NITER = 8  # Lloyd steps of the final residual PQ (half of it per OPQ round)
OPQ_NITER = 4  # rotation/PQ alternations
# how much of the parallel error ``scales`` undoes. nDCG@10 x exact MaxSim, each collection's
# exact top 100 and OPQ32's top 100 rescored, PARALLEL 0 / 0.5 / 1: arguana 0.973 / 0.987 /
# 0.998, nfcorpus 0.985 / 0.985 / 0.982, npl 0.979 / 0.991 / 0.994, cranfield 1.001 / 0.995 /
# 1.000, cisi 1.014 / 1.016 / 1.037, medline 1.011 / 1.012 / 1.008. In the engine 1 cost nfcorpus
# 0.006; 0.5 is within 2% of exact on all six (bench_multivector)
PARALLEL = 0.5


_BLAS = []  # the process's threadpoolctl controller, made on first use (1 ms)


@contextmanager
def one_blas_thread():
    """A query's tables are small GEMMs (35 tokens x 384 x 4,096 centroids): BLAS's threads
    cost more than they save there (16 vs 2.7 ms of CPU for the table on 2 busy cores)."""
    if not _BLAS:
        from threadpoolctl import ThreadpoolController
        _BLAS.append(ThreadpoolController())
    with _BLAS[0].limit(limits=1, user_api="blas"):
        yield


@contextmanager
def faiss_threads(n: int | None = None):
    """faiss's OpenMP threads set to ``n`` (default every core) for a block, then given back
    (queries run faiss single-threaded, see ``dense``)."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n or os.cpu_count() or 1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def build_map(fn, n: int, rows: int) -> None:
    """``fn(start, stop)`` over ``n`` rows in chunks of ``rows``, the chunks spread over one
    Python thread per core, each running BLAS on one thread (numpy's GEMM and the numba
    kernels release the GIL). Build-time work as one multi-threaded BLAS call per chunk
    spent its idle time spinning on a busy machine: the assignment of medline's 194k tokens
    took 12.3 s of CPU that way, 9.1 s this way, with the same floats (a row's GEMM result
    does not depend on how many rows share the call); docs/notes/multivector.md."""
    chunks = [(s, min(n, s + rows)) for s in range(0, n, rows)]
    workers = min(len(chunks), os.cpu_count() or 1)
    with one_blas_thread():
        if workers <= 1:
            for a, b in chunks:
                fn(a, b)
            return
        with ThreadPoolExecutor(workers, thread_name_prefix="polyindex-mv-build") as pool:
            for f in [pool.submit(fn, a, b) for a, b in chunks]:
                f.result()


@numba.njit(cache=True, nogil=True)
def _pq_encode(y, sub_t, out):
    """PQ codes of rows ``y`` (n, D): per sub-space the nearest of 256 sub-centroids by
    squared L2, summed per dimension in order, first minimum on ties: the codes
    ``faiss.ProductQuantizer.compute_codes`` gives (identical on medline's 6.2M sub-codes)
    at 2.3x less CPU here. ``sub_t``: (M, D/M, 256) (a sub-centroid per column)."""
    n = y.shape[0]
    m, ds, ksub = sub_t.shape
    acc = np.empty(ksub, np.float32)
    for i in range(n):
        for j in range(m):
            acc[:] = 0
            for k in range(ds):
                v = y[i, j * ds + k]
                for c in range(ksub):
                    t = v - sub_t[j, k, c]
                    acc[c] += t * t
            best = 0
            low = acc[0]
            for c in range(1, ksub):
                if acc[c] < low:
                    low = acc[c]
                    best = c
            out[i, j] = best


class Codebook:
    def __init__(self, centroids: np.ndarray, pq_centroids: np.ndarray | None,
                 sig_proj: np.ndarray | None, sig_mean: np.ndarray | None, meta: dict,
                 rotation: np.ndarray | None = None):
        self.rotation = None if rotation is None else \
            np.ascontiguousarray(rotation, dtype=np.float32)  # (d_res, d): y = R r
        self.centroids = np.ascontiguousarray(centroids, dtype=np.float32)  # (K, d)
        self.k, self.d = self.centroids.shape
        # the residual quantizer's space: R's output (OPQ may reduce the dimension) or x's own
        self.d_res = self.d if self.rotation is None else self.rotation.shape[0]
        self.pq_centroids = None if pq_centroids is None else \
            np.ascontiguousarray(pq_centroids, dtype=np.float32)  # (M, 256, d_res/M)
        self.m = 0 if self.pq_centroids is None else self.pq_centroids.shape[0]
        self.sig_proj = sig_proj  # (d, b) float32
        self.sig_mean = sig_mean  # (d,) float32
        self.bits = 0 if sig_proj is None else sig_proj.shape[1]
        self.signatures = None if sig_proj is None else self.signature(self.centroids)
        self.meta = meta
        self._index = None
        self._pq = None

    def __getstate__(self):  # for the build process: caches (a faiss PQ) are rebuilt there
        return {**self.__dict__, "_index": None, "_pq": None}

    # -- encoding ----------------------------------------------------------------------------
    def assign(self, x: np.ndarray) -> np.ndarray:
        """Nearest centroid (L2) of each row, int64: argmax of x.c - |c|^2 / 2, one numpy
        matmul per chunk (measured here 3.5x faster than faiss.IndexFlatL2's search, whose
        bundled BLAS is slower than numpy's; assignment is most of a segment's build time),
        the chunks over ``build_map``'s threads."""
        ct, half_norm = self._centroids_t()
        out = np.empty(len(x), np.int64)

        def chunk(a, b):
            scores = np.ascontiguousarray(x[a:b], dtype=np.float32) @ ct
            scores -= half_norm
            out[a:b] = scores.argmax(1)
        build_map(chunk, len(x), ASSIGN_ROWS)
        return out

    def _centroids_t(self):
        """(centroids^T contiguous, |c|^2 / 2), made once: a query's table multiplies by the
        contiguous transpose (q @ C.T over the strided view measured 2x slower here)."""
        if self._index is None:
            self._index = (np.ascontiguousarray(self.centroids.T),
                           0.5 * (self.centroids.astype(np.float64) ** 2).sum(1).astype(np.float32))
        return self._index

    def _sub_t(self):
        """The PQ sub-centroids as (M, D/M, 256), made once: ``_pq_encode``'s inner loop runs
        over 256 contiguous sub-centroids (vectorized)."""
        if self._pq is None:
            self._pq = np.ascontiguousarray(self.pq_centroids.transpose(0, 2, 1))
        return self._pq

    def residual_codes(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """(n, M) uint8 PQ codes of ``x - centroid`` (rotated first with OPQ)."""
        out = np.empty((len(x), self.m), np.uint8)
        sub_t = self._sub_t()

        def chunk(a, b):
            r = np.ascontiguousarray(x[a:b], dtype=np.float32) - self.centroids[codes[a:b]]
            _pq_encode(self._rotate(r), sub_t, out[a:b])
        build_map(chunk, len(x), ASSIGN_ROWS)
        return out

    def decode(self, codes: np.ndarray, rcodes: np.ndarray | None) -> np.ndarray:
        """Reconstructed token vectors (the reference the scoring kernels must agree with)."""
        x = self.centroids[codes].copy()
        if self.m and rcodes is not None:
            y = np.empty((len(x), self.d_res), np.float32)
            dsub = self.d_res // self.m
            for m in range(self.m):
                y[:, m * dsub:(m + 1) * dsub] = self.pq_centroids[m][rcodes[:, m]]
            x += y if self.rotation is None else y @ self.rotation
        return x

    def _rotate(self, r: np.ndarray) -> np.ndarray:
        """Rows ``r`` in the residual quantizer's (rotated) space: ``R r`` per row."""
        return r if self.rotation is None else np.ascontiguousarray(r @ self.rotation.T)

    def scales(self, x: np.ndarray, codes: np.ndarray, rcodes: np.ndarray) -> np.ndarray:
        """float16 per-token scale ``s = |x| / (|x_hat| * cos(x, x_hat) ** PARALLEL)``.

        A query token's MaxSim partner is nearly parallel to it, so ``q . x_hat / |x_hat|``
        loses about ``1 - cos(x, x_hat)``, which varies by token (rare tokens sit far from
        their centroid); that uneven loss, more than the error's size, reorders documents
        (Gaussian noise of the same MSE cost arguana nothing). ``PARALLEL = 1`` would restore
        the component along ``x`` exactly (ScaNN's parallel error), ``0`` only rescales to
        ``|x|``; the first overshoots for partners that are less parallel. A cosine below 1/2
        (a failed reconstruction) counts as 1/2, so noise is not blown up."""
        out = np.empty(len(codes), np.float16)

        def chunk(a, b):
            xh = self.decode(codes[a:b], rcodes[a:b])
            xs = np.asarray(x[a:b], np.float32)
            nx = np.linalg.norm(xs, axis=1)
            nxh = np.maximum(np.linalg.norm(xh, axis=1), 1e-6)
            cos = np.clip((xs * xh).sum(1) / np.maximum(nx * nxh, 1e-12), 0.5, 1.0)
            out[a:b] = nx / (nxh * cos ** PARALLEL)
        build_map(chunk, len(codes), ASSIGN_ROWS)
        return out

    def signature(self, x: np.ndarray) -> np.ndarray:
        """b-bit signatures (uint64, bit j = sign of the j-th projection) of rows of ``x``."""
        bits = ((np.asarray(x, np.float32) - self.sig_mean) @ self.sig_proj) > 0
        weights = (np.uint64(1) << np.arange(self.bits, dtype=np.uint64))
        return (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)

    # -- query tables --------------------------------------------------------------------------
    def lut(self, q: np.ndarray) -> np.ndarray:
        """(K, nq_tokens) float32: q_t . centroid, transposed so one code's row is contiguous."""
        return np.ascontiguousarray(self.scores(q).T)

    def scores(self, q: np.ndarray) -> np.ndarray:
        """(nq_tokens, K) float32: q_t . centroid (the table before its transpose)."""
        return np.asarray(q, np.float32) @ self._centroids_t()[0]

    def pq_tables(self, q: np.ndarray) -> np.ndarray:
        """(M, 256, nq_tokens) float32: q_t's sub-vector . each PQ sub-centroid."""
        dsub = self.d_res // self.m
        qs = self._rotate(np.asarray(q, np.float32)).reshape(len(q), self.m, dsub)
        # M small GEMMs (256 x dsub @ dsub x nqt): einsum's path took 6 ms a query here
        return np.matmul(self.pq_centroids, np.ascontiguousarray(qs.transpose(1, 2, 0)))

    # -- persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> list[str]:
        arrays = {"centroids": self.centroids}
        if self.pq_centroids is not None:
            arrays["pq_centroids"] = self.pq_centroids
        if self.rotation is not None:
            arrays["rotation"] = self.rotation
        if self.sig_proj is not None:
            arrays["sig_proj"], arrays["sig_mean"] = self.sig_proj, self.sig_mean
        np.savez(folder / WEIGHTS_FILE, **arrays)
        (folder / META_FILE).write_text(json.dumps(self.meta, indent=1, sort_keys=True))
        return [WEIGHTS_FILE, META_FILE]

    @classmethod
    def load(cls, folder: Path) -> "Codebook | None":
        if not (folder / WEIGHTS_FILE).exists():
            return None
        try:
            with np.load(folder / WEIGHTS_FILE) as z:
                arrays = {k: z[k] for k in z.files}
            meta = json.loads((folder / META_FILE).read_text()) \
                if (folder / META_FILE).exists() else {}
        except (OSError, ValueError) as e:
            raise Corrupt(f"{folder}: cannot read the multivector codebook: {e}") from None
        return cls(arrays["centroids"], arrays.get("pq_centroids"), arrays.get("sig_proj"),
                   arrays.get("sig_mean"), meta, arrays.get("rotation"))


def codebook_size(k: int, n_tokens: int) -> int:
    """K for a collection of ``n_tokens`` tokens: PLAID's ``2^floor(log2(16 sqrt(n)))``, at most
    the K asked and a quarter of the tokens (medline's 194k tokens: 4,096; adi's 6k: 1,024)."""
    plaid = 1 << int(np.floor(np.log2(16 * np.sqrt(max(n_tokens, 1)))))
    return int(max(2, min(k, plaid, n_tokens // 4)))


def train(x: np.ndarray, k: int, m: int, *, seed: int = 0, niter: int = 4,
          points_per_centroid: int = KMEANS_POINTS, bits: int = 0, opq: bool = False,
          opq_dim: int = 0) -> Codebook:
    """Train centroids (and the residual PQ with ``m`` bytes, rotated first with ``opq`` and
    reduced to ``opq_dim`` dimensions if set, and ``bits``-bit signatures) on token vectors
    ``x`` (n, d). K is ``codebook_size``; k-means sees ``points_per_centroid * K`` tokens
    (at least ``KMEANS_MIN_SAMPLE``) drawn
    with ``seed`` for ``niter`` iterations, the residual quantizer ``PQ_TRAIN`` residuals
    (see ``PQ_TRAIN``: issue 39 cut medline's training from 23 min to about a minute)."""
    t0 = time.perf_counter()
    n, d = x.shape
    rotation = None
    bits_asked = bits
    if n < 8:
        raise InvalidArgument(f"multivector: training needs at least 8 token vectors, got {n}")
    d_res = (opq_dim or d) if opq else d
    if d_res > d:
        raise InvalidArgument(f"multivector: residual=OPQ{m}_{d_res} cannot raise the dimension "
                              f"of {d}-d token vectors")
    if m and d_res % m:
        raise InvalidArgument(f"multivector: a {m}-byte residual PQ needs a dimension divisible "
                              f"by {m}, the residual has dimension {d_res}")
    k_eff = codebook_size(k, n)
    rng = np.random.default_rng(seed)
    take = min(n, max(points_per_centroid * k_eff, KMEANS_MIN_SAMPLE))
    sample = x[np.sort(rng.choice(n, take, replace=False))] if take < n else x
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    # one thread: faiss's OpenMP and OpenBLAS threads spun on a busy machine (training 20.2 s
    # of CPU for medline, 8.6 s on one thread; the same centroids, rotation and PQ). The
    # k-means is bounded (KMEANS_POINTS x K tokens), so its wall time is too.
    with faiss_threads(1), one_blas_thread():
        km = faiss.Kmeans(d, k_eff, niter=niter, seed=seed, verbose=False,
                          max_points_per_centroid=take // k_eff + 1,
                          min_points_per_centroid=1)
        km.train(sample)
        centroids = km.centroids.copy()
        pq_centroids = None
        if m:
            pq_take = min(n, max(PQ_TRAIN, PQ_TRAIN_VALUES // d))
            pq_sample = np.ascontiguousarray(
                x[np.sort(rng.choice(n, pq_take, replace=False))], dtype=np.float32)
            codes = Codebook(centroids, None, None, None, {}).assign(pq_sample)
            resid = np.ascontiguousarray(pq_sample - centroids[codes])
            if opq:
                rotation, pq_centroids = _train_opq(resid, m, d_res, seed)
            else:
                pq_centroids, _ = _pq_kmeans(resid, m, PQ_NITER, seed)
    sig_proj = sig_mean = None
    sig_proj, sig_mean = signature_basis(centroids, bits)
    meta = {"k": k_eff, "k_asked": k, "m": m, "opq": rotation is not None,
            "residual_dim": d_res if m else 0, "bits": 0 if sig_proj is None else sig_proj.shape[1],
            "bits_asked": bits_asked, "seed": seed, "niter": niter, "dim": d,
            "train_tokens": int(take), "tokens_seen": int(n),
            "seconds": round(time.perf_counter() - t0, 2)}
    return Codebook(centroids, pq_centroids, sig_proj, sig_mean, meta, rotation)


def _pq_kmeans(r: np.ndarray, m: int, niter: int, seed: int,
               cent: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means of the M sub-vectors of ``r`` (n, D), 256 centroids each: ((M, 256,
    D/M) centroids, (M, n) codes of ``r`` under them). Seeded from ``cent`` or from 256 rows
    drawn with ``seed``; an empty cluster keeps its centroid. One numpy matmul and D/M
    bincounts per sub-quantizer and iteration: faiss's ProductQuantizer.train took 3x longer
    here (32 s vs 11 s, 32k vs 16k residuals, same error)."""
    n, dd = r.shape
    ds = dd // m
    sub = np.ascontiguousarray(r.reshape(n, m, ds).transpose(1, 0, 2))  # (M, n, D/M)
    if cent is None:
        idx = np.sort(np.random.default_rng(seed).choice(n, 256, replace=n < 256))
        cent = sub[:, idx, :].copy()
    codes = np.empty((m, n), np.int64)
    for it in range(niter + 1):
        for j in range(m):
            s = sub[j] @ cent[j].T
            s -= 0.5 * (cent[j] ** 2).sum(1)
            codes[j] = s.argmax(1)
            if it == niter:
                continue
            cnt = np.bincount(codes[j], minlength=256)
            ok = cnt > 0
            for c in range(ds):
                tot = np.bincount(codes[j], weights=sub[j][:, c], minlength=256)
                cent[j][ok, c] = tot[ok] / cnt[ok]
    return cent, codes


def _train_opq(resid: np.ndarray, m: int, d_out: int, seed: int):
    """Non-parametric OPQ (Ge et al.): alternate a PQ of ``R r`` (warm-started, ``PQ_NITER``
    // 2 Lloyd steps) with ``R``'s orthogonal Procrustes update towards the reconstruction
    (``R = U V^T`` of ``Y_hat^T r``), ``OPQ_NITER`` times from the identity (its first
    ``d_out`` rows: a reduction). Returns (R (d_out x d, orthonormal rows), PQ centroids).
    Deterministic for a seed. On medline (K=4,096): held-out token MSE 0.158 against 0.183
    for plain PQ and 0.178 for faiss.OPQMatrix (which took minutes, this takes seconds)."""
    d = resid.shape[1]
    rot = np.eye(d, dtype=np.float32)[:d_out]
    cent = None
    r64 = resid.astype(np.float64)
    for _ in range(OPQ_NITER):
        cent, codes = _pq_kmeans(np.ascontiguousarray(resid @ rot.T), m, PQ_NITER // 2, seed, cent)
        y_hat = np.concatenate([cent[j][codes[j]] for j in range(m)], axis=1)
        u, _, vt = np.linalg.svd(y_hat.T.astype(np.float64) @ r64, full_matrices=False)
        rot = np.ascontiguousarray(u @ vt, dtype=np.float32)
    cent, _ = _pq_kmeans(np.ascontiguousarray(resid @ rot.T), m, PQ_NITER, seed, cent)
    return rot, np.ascontiguousarray(cent, dtype=np.float32)


def signature_basis(centroids: np.ndarray, bits: int):
    """The top-``bits`` principal directions of the centroids (and their mean), or Nones."""
    bits = min(bits, centroids.shape[1])
    if not bits:
        return None, None
    sig_mean = centroids.mean(0).astype(np.float32)
    cov = (centroids - sig_mean).T @ (centroids - sig_mean)
    _, vecs = np.linalg.eigh(cov.astype(np.float64))
    sig_proj = np.ascontiguousarray(vecs[:, ::-1][:, :bits], dtype=np.float32)
    # eigenvector signs are arbitrary: fix them (largest-magnitude entry positive)
    flip = np.sign(sig_proj[np.abs(sig_proj).argmax(0), np.arange(bits)])
    return np.ascontiguousarray(sig_proj * flip.astype(np.float32)), sig_mean
