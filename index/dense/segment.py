"""A dense field's index over one sealed segment (``DenseSegment``: faiss search, on CPU or
the GPU's tensors, exact scores of given rows, stored vectors), how it is read
(``read_index``: memory-mapped where asked), and a stage's search params checked and typed
(``faiss_kwargs``); the kind that builds it is ``index.dense.kind``."""
from __future__ import annotations

from pathlib import Path

import faiss
import numpy as np

from polyindex.config import settings
from polyindex.cuda.device import FAISS_GPU_MAX_K, kernel_device, torch_kernels
from polyindex.errors import InvalidArgument
from polyindex.index import prf
from polyindex.index.dense import filtered as dense_filtered
from polyindex.index.dense import presence as dense_presence
from polyindex.index.protocol import SegmentIndex, empty_result

# faiss spreads even a one-query search over OpenMP threads; measured here, a 11k x 384 flat
# search took 13-31 ms that way and 1.9 ms single-threaded on a busy 2-core machine. Queries
# get their parallelism from concurrent requests instead. POLYINDEX_FAISS_THREADS overrides.
# OpenMP's thread count is a per-thread setting, so searches set it in the searching thread
# (a server's workers, the threads of a caller); this sets it for the importing thread.
QUERY_THREADS = settings().faiss_threads
faiss.omp_set_num_threads(QUERY_THREADS)
SEARCH_PARAMS = {"nprobe": int, "efSearch": int, "exact_below": int}


def _faiss_params(params: dict[str, str]) -> dict[str, str]:
    """The search params faiss gets (the feedback ones act in ``prepare``)."""
    if not any(k in prf.DENSE_KEYS for k in params):
        return params
    return {k: v for k, v in params.items() if k not in prf.DENSE_KEYS}


def faiss_kwargs(params: dict[str, str]) -> dict:
    """The typed faiss search arguments of a stage's params (``nprobe``, ``efSearch``)."""
    return {key: SEARCH_PARAMS[key](v) for key, v in _faiss_params(params).items()
            if key != "exact_below"}


def _check_params(params: dict[str, str]) -> None:
    unknown = set(params) - set(SEARCH_PARAMS) - set(prf.DENSE_KEYS)
    if unknown:
        raise InvalidArgument(f"dense: unknown search parameter(s) {sorted(unknown)}; "
                              f"known: {sorted(SEARCH_PARAMS) + list(prf.DENSE_KEYS)}")
    params = _faiss_params(params)
    for key, value in params.items():
        try:
            SEARCH_PARAMS[key](value)
        except ValueError:
            raise InvalidArgument(f"dense: search parameter {key}={value!r} is not an integer") from None


def _flat_view(index) -> np.ndarray | None:
    """Zero-copy (n, d) view of a flat (or HNSW-over-flat) index's vectors, else None."""
    try:
        idx = faiss.downcast_index(index)
        if isinstance(idx, faiss.IndexHNSWFlat):
            idx = faiss.downcast_index(idx.storage)
        if isinstance(idx, faiss.IndexFlat) and idx.ntotal:
            return faiss.rev_swig_ptr(idx.get_xb(), idx.ntotal * idx.d).reshape(idx.ntotal, idx.d)
    except (AttributeError, RuntimeError, TypeError):  # a GPU index: no host pointer
        pass
    return None


# Opening a segment maps its index file instead of copying it into memory (issue 17 part 5).
# With faiss-cpu 1.15 (measured: bench/bench_query_cost.py, and a 200k x 128 probe),
# IO_FLAG_MMAP_IFC maps the codes of every IndexFlatCodes (Flat, PQ, SQ: also the storage of
# HNSW..,Flat and HNSW..,PQ) and the HNSW graph and IVF inverted lists (faiss's
# MaybeOwnedVector): resident anonymous memory after reading a 200k x 128 Flat index went from
# 98 MB to 0, HNSW32,Flat 148 MB to 2 MB, IVF256,Flat 78 MB to 0, with equal search results.
# IO_FLAG_READ_ONLY: nothing writes to an opened index (segments are immutable; the pages are
# the file's, shared between processes and dropped under memory pressure). The legacy
# IO_FLAG_MMAP (OnDiskInvertedLists for IVF) is not used: it cannot be combined with
# MMAP_IFC for IVF and maps only the lists. An index type that cannot be read this way (an
# older faiss without the flag, a type whose reader rejects it) is read into memory as before.
MMAP_FLAGS = getattr(faiss, "IO_FLAG_MMAP_IFC", 0) | getattr(faiss, "IO_FLAG_READ_ONLY", 0)
MMAP = settings().faiss_mmap


def read_index(path: Path):
    """A segment's faiss index, memory-mapped where faiss supports it (``MMAP_FLAGS``)."""
    if MMAP and MMAP_FLAGS & getattr(faiss, "IO_FLAG_MMAP_IFC", 0):
        try:
            return faiss.read_index(str(path), MMAP_FLAGS)
        except RuntimeError:
            pass  # this index type's reader does not map: read it into memory
    return faiss.read_index(str(path))


class DenseSegment(SegmentIndex):  # and StoredVectors
    def __init__(self, index, folder: Path, docs=None, column: str = "embedding",
                 metric: str = "ip", present: np.ndarray | None = None, device: str = "cpu",
                 on_gpu: bool = False):
        self.index = index
        self.device = device
        self.on_gpu = on_gpu  # a faiss-gpu index (float16 storage)
        self._torch = None  # polyindex.cuda.dense tensors, made on first torch search
        # an optional field's rows that have a vector (None: every row has one)
        self.presence = None if present is None else dense_presence.Presence(present)
        self.folder = folder
        self.n_rows = index.ntotal
        self.metric = metric
        self._docs = docs
        self._column = column
        self._matrix: np.ndarray | None = None
        self._direct_map = False
        self._ivf = faiss.try_extract_index_ivf(index) is not None
        base = faiss.downcast_index(index) if not on_gpu else None
        # an HNSW index's own efSearch (None: not HNSW); searches explore at least k
        self.hnsw_ef = base.hnsw.efSearch if isinstance(base, faiss.IndexHNSW) else None
        self._params: dict[tuple, object] = {}  # faiss SearchParameters by search params
        # the vector lane's part of a plan by search params: (live mask it was made for, part)
        self.lane_parts: dict[tuple, tuple] = {}

    def matrix(self) -> np.ndarray | None:
        """Every row's vector as one (n, d) float32 view: the segment's stored column
        (memory-mapped) or the faiss index's own flat storage; None when the index keeps
        only codes and no column was stored."""
        if self._matrix is None and self.n_rows:
            if self._docs is not None:
                self._matrix = (self._docs.embeddings() if self._column == "embedding"
                                else self._docs.vector_column(self._column))
            if self._matrix is None:
                self._matrix = _flat_view(self.index)
        return self._matrix

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """Stored float32 vectors of rows (NaN rows for an optional field's missing vectors);
        without a stored matrix, the index's reconstruction."""
        out = self._vectors(rows)
        if self.presence is not None:
            gone = ~self.presence.mask[rows]
            if gone.any():
                out = np.array(out, dtype=np.float32)
                out[gone] = np.nan
        return out

    def _vectors(self, rows: np.ndarray) -> np.ndarray:
        m = self.matrix()
        if m is not None:
            return m[rows]
        if not self._direct_map:
            try:
                faiss.extract_index_ivf(self.index).make_direct_map()
            except RuntimeError:
                pass  # not an IVF index: reconstruct works as is
            self._direct_map = True
        return self.index.reconstruct_batch(np.asarray(rows, dtype=np.int64))

    def at_least_k(self, kwargs: dict, k: int) -> dict:
        """HNSW search parameters that explore at least k candidates (efSearch raised to k, as
        hnswlib and Qdrant do). faiss keeps the k best of what efSearch explores (its
        stopping rule uses efSearch, not max(efSearch, k)): efSearch 16 answered k=100 with
        80 hits on 4,000 rows, and a segment with tombstones (whose budget was raised to k)
        was searched 2x harder than one without."""
        if self.hnsw_ef is not None and k > kwargs.get("efSearch", self.hnsw_ef):
            return {**kwargs, "efSearch": k}
        return kwargs

    def faiss_search(self, vectors: np.ndarray, k: int, kwargs: dict):
        """One faiss search with parameters (``sel``, ``nprobe``, ``efSearch``; an HNSW index
        explores at least k: ``at_least_k``); scores higher-is-better, -1 padded rows with
        -inf."""
        sp = self.params_for(self.at_least_k(kwargs, k))
        before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(QUERY_THREADS)  # 2 threads on one pinned CPU: 16 ms a query
        try:
            scores, rows = (self.index.search(vectors, k) if sp is None
                            else self.index.search(vectors, k, params=sp))
        finally:
            faiss.omp_set_num_threads(before)
        return self._higher_better(scores, rows)

    def params_for(self, kwargs: dict):
        """faiss SearchParameters of ``kwargs`` (None for none), built once per distinct
        params without a selector: this is on every query's path."""
        if not kwargs:
            return None
        key = None if "sel" in kwargs else tuple(sorted(kwargs.items()))
        sp = self._params.get(key) if key is not None else None
        if sp is None:
            sp = self._search_parameters(kwargs)
            if key is not None and len(self._params) < 64:
                self._params[key] = sp
        return sp

    def _search_parameters(self, kwargs: dict):
        if "nprobe" in kwargs or self._ivf:
            return faiss.SearchParametersIVF(**{k: v for k, v in kwargs.items() if k != "efSearch"})
        if "efSearch" in kwargs:
            return faiss.SearchParametersHNSW(**kwargs)
        return faiss.SearchParameters(**kwargs)

    def _higher_better(self, scores, rows):
        if self.metric == "l2":
            scores = -scores
        if rows.size and rows[:, -1].min() < 0:  # faiss pads at the end only
            scores = np.where(rows < 0, -np.inf, scores).astype(np.float32)
        return scores, rows

    def prepare_live(self, live, before=None, hidden=None):
        """The allow bitmap and the direct search parameters (default budget) of a new live
        mask, so the first query after a write does not build them."""
        if self.presence is None and not self.on_gpu:
            dense_filtered.direct(self, live, {}, dense_filtered.EXACT_BELOW)

    def search(self, prepared, k, params, allow):
        vectors = prepared
        if self.n_rows == 0:
            return empty_result(len(vectors), k)
        params = _faiss_params(params)
        if self.presence is not None:  # rows without a vector are never candidates
            allow = self.presence.fold(allow)
        # torch kernels: a cuda placement without faiss-gpu (or POLYINDEX_KERNELS=torch), and
        # what faiss-gpu cannot do (k or nprobe over its limit of 2048)
        if (torch_kernels(self.device) and not self.on_gpu) or (self.on_gpu and (
                k > FAISS_GPU_MAX_K or int(params.get("nprobe", 0)) > FAISS_GPU_MAX_K)):
            return self.torch_search(vectors, k, params, allow)
        if allow is None:
            return self.faiss_search(vectors, k, faiss_kwargs(params))
        return dense_filtered.search(self, vectors, k, params, allow)

    def torch_search(self, vectors, k, params, allow):
        """``polyindex.cuda.dense``: IVF indexes as IVF (their centroids and lists, ``nprobe``
        from the params or the index), every other index exactly (flat)."""
        from polyindex.cuda import dense as torch_dense
        if self._torch is None:
            t = torch_dense.DenseTensors(self._vectors(np.arange(self.n_rows)), self.metric,
                                         kernel_device(self.device))
            if self._ivf:
                t.with_ivf(*torch_dense.ivf_parts(self.index))
            self._torch = t
        if self._ivf:
            nprobe = int(params.get("nprobe", faiss.extract_index_ivf(self.index).nprobe))
            s, r = torch_dense.ivf_search(self._torch, vectors, k, nprobe, allow)
        else:
            s, r = torch_dense.flat_search(self._torch, vectors, k, allow)
        return s.cpu().numpy(), r.cpu().numpy()

    def score(self, prepared, row_ids):
        rows = np.asarray(row_ids, dtype=np.int64)
        out = np.full((len(prepared), len(rows)), np.nan, dtype=np.float32)
        ok = (rows >= 0) & (rows < self.n_rows)
        if ok.any():
            out[:, ok] = exact_scores(prepared, self.vectors(rows[ok]), self.metric)
        return out


def exact_scores(q: np.ndarray, x: np.ndarray, metric: str) -> np.ndarray:
    """(nq, n) higher-is-better scores of query vectors against vectors, as the index scores."""
    s = q @ x.T
    if metric == "l2":
        s = 2 * s - (q * q).sum(1)[:, None] - (x * x).sum(1)[None, :]
    return s
