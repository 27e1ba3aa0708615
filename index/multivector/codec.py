"""The multivector codebook: k-means centroids, a residual product quantizer, binary signatures.

A token vector ``x`` is stored as its nearest centroid's index (HPC-ColPali's code) plus, unless
the kind runs in pure-code mode, a PQ code of the residual ``x - c`` (PLAID's compact residual):
``x ~ c[code] + PQ_decode(residual code)``. Both quantizers are trained once per collection on
a sample of corpus token vectors and saved as collection artifacts:

- centroids: ``faiss.Kmeans`` (seeded; the sample is drawn with the same seed, so training
  is deterministic for a seed);
- residual: ``faiss.ProductQuantizer(d, M, 8)``: M bytes per token (d must be divisible by M);
  with ``opq`` (``residual=OPQ<M>``, the default) the residual is first rotated by a learned
  orthogonal matrix ``R`` (``faiss.OPQMatrix``) that balances its variance over the M
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
from contextlib import contextmanager
from pathlib import Path

import faiss
import numpy as np

from polyindex.errors import Corrupt, InvalidArgument

WEIGHTS_FILE = "multivector.codebook.npz"
META_FILE = "multivector.codebook.json"
ASSIGN_CHUNK = 65_536  # token rows per assignment call: bounds the float32 copy
OPQ_NITER = 12  # rotation/PQ alternations; the error curve is flat after about ten
# how much of the parallel error ``scales`` undoes. nDCG@10 x exact MaxSim, each collection's
# exact top 100 and OPQ32's top 100 rescored, PARALLEL 0 / 0.5 / 1: arguana 0.973 / 0.987 /
# 0.998, nfcorpus 0.985 / 0.985 / 0.982, npl 0.979 / 0.991 / 0.994, cranfield 1.001 / 0.995 /
# 1.000, cisi 1.014 / 1.016 / 1.037, medline 1.011 / 1.012 / 1.008. In the engine 1 cost nfcorpus
# 0.006; 0.5 is within 2% of exact on all six (bench_multivector)
PARALLEL = 0.5


@contextmanager
def faiss_threads(n: int | None = None):
    """Training and assignment are build-time batch work: use every core for them, then give
    back the process setting (queries run faiss single-threaded, see ``dense``)."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n or os.cpu_count() or 1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


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
        bundled BLAS is slower than numpy's; assignment is most of a segment's build time)."""
        ct, half_norm = self._centroids_t()
        out = np.empty(len(x), np.int64)
        for s in range(0, len(x), ASSIGN_CHUNK // 8):
            part = np.ascontiguousarray(x[s:s + ASSIGN_CHUNK // 8], dtype=np.float32)
            scores = part @ ct
            scores -= half_norm
            out[s:s + len(part)] = scores.argmax(1)
        return out

    def _centroids_t(self):
        """(centroids^T contiguous, |c|^2 / 2), made once: a query's table multiplies by the
        contiguous transpose (q @ C.T over the strided view measured 2x slower here)."""
        if self._index is None:
            self._index = (np.ascontiguousarray(self.centroids.T),
                           0.5 * (self.centroids.astype(np.float64) ** 2).sum(1).astype(np.float32))
        return self._index

    def _product_quantizer(self):
        if self._pq is None:
            pq = faiss.ProductQuantizer(self.d_res, self.m, 8)
            faiss.copy_array_to_vector(self.pq_centroids.ravel(), pq.centroids)
            self._pq = pq
        return self._pq

    def residual_codes(self, x: np.ndarray, codes: np.ndarray) -> np.ndarray:
        """(n, M) uint8 PQ codes of ``x - centroid``."""
        out = np.empty((len(x), self.m), np.uint8)
        pq = self._product_quantizer()
        for s in range(0, len(x), ASSIGN_CHUNK):
            r = np.ascontiguousarray(x[s:s + ASSIGN_CHUNK], dtype=np.float32) \
                - self.centroids[codes[s:s + ASSIGN_CHUNK]]
            out[s:s + len(r)] = pq.compute_codes(self._rotate(r))
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
        for s in range(0, len(codes), ASSIGN_CHUNK):
            xh = self.decode(codes[s:s + ASSIGN_CHUNK], rcodes[s:s + ASSIGN_CHUNK])
            xs = np.asarray(x[s:s + ASSIGN_CHUNK], np.float32)
            nx = np.linalg.norm(xs, axis=1)
            nxh = np.maximum(np.linalg.norm(xh, axis=1), 1e-6)
            cos = np.clip((xs * xh).sum(1) / np.maximum(nx * nxh, 1e-12), 0.5, 1.0)
            out[s:s + len(xh)] = nx / (nxh * cos ** PARALLEL)
        return out

    def signature(self, x: np.ndarray) -> np.ndarray:
        """b-bit signatures (uint64, bit j = sign of the j-th projection) of rows of ``x``."""
        bits = ((np.asarray(x, np.float32) - self.sig_mean) @ self.sig_proj) > 0
        weights = (np.uint64(1) << np.arange(self.bits, dtype=np.uint64))
        return (bits.astype(np.uint64) * weights).sum(axis=1, dtype=np.uint64)

    # -- query tables --------------------------------------------------------------------------
    def lut(self, q: np.ndarray) -> np.ndarray:
        """(K, nq_tokens) float32: q_t . centroid, transposed so one code's row is contiguous."""
        return np.ascontiguousarray((np.asarray(q, np.float32) @ self._centroids_t()[0]).T)

    def pq_tables(self, q: np.ndarray) -> np.ndarray:
        """(M, 256, nq_tokens) float32: q_t's sub-vector . each PQ sub-centroid."""
        dsub = self.d_res // self.m
        qs = self._rotate(np.asarray(q, np.float32)).reshape(len(q), self.m, dsub)
        return np.ascontiguousarray(np.einsum("mjs,tms->mjt", self.pq_centroids, qs,
                                              optimize=True), dtype=np.float32)

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


def train(x: np.ndarray, k: int, m: int, *, seed: int = 0, niter: int = 10,
          points_per_centroid: int = 32, bits: int = 0, opq: bool = False,
          opq_dim: int = 0) -> Codebook:
    """Train centroids (and the residual PQ with ``m`` bytes, rotated first with ``opq`` and
    reduced to ``opq_dim`` dimensions if set, and ``bits``-bit signatures) on token vectors
    ``x`` (n, d). At most ``points_per_centroid * K`` tokens are used (drawn with
    ``seed``; 8 per centroid left arguana's OPQ32 residual error at 0.182, 64 gave 0.155, 32 is
    the middle in training time); K shrinks to n // 4 on tiny samples (recorded in the meta)."""
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
    k_eff = int(min(k, max(2, n // 4)))
    rng = np.random.default_rng(seed)
    take = min(n, points_per_centroid * k_eff)
    sample = x[np.sort(rng.choice(n, take, replace=False))] if take < n else x
    sample = np.ascontiguousarray(sample, dtype=np.float32)
    with faiss_threads():
        km = faiss.Kmeans(d, k_eff, niter=niter, seed=seed, verbose=False,
                          max_points_per_centroid=max(points_per_centroid, 1) + 1,
                          min_points_per_centroid=1)
        km.train(sample)
        centroids = km.centroids.copy()
        pq_centroids = None
        if m:
            # the residual PQ learns 256 sub-centroids per byte: give it >= 64k tokens
            pq_take = min(n, max(take, 65_536))
            pq_sample = sample if pq_take == take else np.ascontiguousarray(
                x[np.sort(rng.choice(n, pq_take, replace=False))], dtype=np.float32)
            codes = Codebook(centroids, None, None, None, {}).assign(pq_sample)
            resid = np.ascontiguousarray(pq_sample - centroids[codes])
            if opq:
                rotation = _train_rotation(resid, m, d_res)
                resid = np.ascontiguousarray(resid @ rotation.T)
            pq = faiss.ProductQuantizer(d_res, m, 8)
            pq.cp.seed = seed
            pq.cp.min_points_per_centroid = 1  # tiny collections: no warning, fewer points
            pq.verbose = False
            pq.train(resid)
            pq_centroids = faiss.vector_to_array(pq.centroids).reshape(m, 256, d_res // m).copy()
    sig_proj = sig_mean = None
    sig_proj, sig_mean = signature_basis(centroids, bits)
    meta = {"k": k_eff, "k_asked": k, "m": m, "opq": rotation is not None,
            "residual_dim": d_res if m else 0, "bits": 0 if sig_proj is None else sig_proj.shape[1],
            "bits_asked": bits_asked, "seed": seed, "niter": niter, "dim": d,
            "train_tokens": int(take), "tokens_seen": int(n),
            "seconds": round(time.perf_counter() - t0, 2)}
    return Codebook(centroids, pq_centroids, sig_proj, sig_mean, meta, rotation)


def _train_rotation(resid: np.ndarray, m: int, d_out: int) -> np.ndarray:
    """OPQ's rotation (d_out x d, orthonormal rows) for an M-byte PQ of ``resid`` ((n, d))."""
    opq = faiss.OPQMatrix(resid.shape[1], m, d_out)
    opq.niter = OPQ_NITER
    opq.verbose = False  # starts from the identity, its inner PQ has a fixed seed: deterministic
    # OPQ's own inner PQ (same shape and default seed) would print a "please provide at least
    # 9984 training points" warning per sub-quantizer and iteration (384 lines) on a small
    # collection; this one accepts fewer points per centroid and trains identically otherwise
    inner = faiss.ProductQuantizer(d_out, m, 8)
    inner.cp.min_points_per_centroid = 1
    opq.pq = inner
    opq.train(resid)
    opq.pq = None  # `inner` is Python's to free
    rot = faiss.vector_to_array(opq.A).reshape(opq.d_out, opq.d_in)
    return np.ascontiguousarray(rot, dtype=np.float32)


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
