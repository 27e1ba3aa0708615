"""The ``dense`` kind: sentence-transformers embeddings in a FAISS index per segment.

Factory: ``dense`` (auto: ``Flat`` below ``AUTO_HNSW_ROWS`` rows per segment, ``HNSW32,Flat``
above) or any ``faiss.index_factory`` string (``dense:HNSW32,Flat``, ``dense:IVF1024,PQ48``).
Default: ``dense`` (auto).
Kinds that need training (IVF, PQ) learn once per collection on a sample; every segment then
starts from a clone of that trained template. Inner product on L2-normalized vectors = cosine.
Search params are faiss parameter strings (``nprobe=32``, ``efSearch=128``); ``prf=rocchio``
(with ``fb_docs``, ``orig_weight``) moves the query vector towards its top documents first
(``polyindex.index.prf``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import faiss
import numpy as np

from polyindex.cuda.device import to_device
from polyindex.errors import InvalidArgument
from polyindex.index import prf
from polyindex.index.protocol import (
    BuildBatch,
    IndexKind,
    Query,
    SegmentIndex,
    empty_result,
    register,
)

# faiss spreads even a one-query search over OpenMP threads; measured here, a 11k x 384 flat
# search took 13-31 ms that way and 1.9 ms single-threaded on a busy 2-core machine. Queries
# get their parallelism from concurrent requests instead. POLYINDEX_FAISS_THREADS overrides.
# OpenMP's thread count is a per-thread setting, so searches set it in the searching thread
# (a server's workers, the threads of a caller); this sets it for the importing thread.
QUERY_THREADS = int(os.environ.get("POLYINDEX_FAISS_THREADS", "1"))
faiss.omp_set_num_threads(QUERY_THREADS)

AUTO_HNSW_ROWS = 20_000
INDEX_FILE = "dense.faiss"
TEMPLATE_FILE = "dense.template.faiss"
SEARCH_PARAMS = {"nprobe": int, "efSearch": int}


def _check_factory(body: str, dim: int = 8) -> None:
    try:
        faiss.index_factory(dim, body, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        # faiss prefixes the reason with a C++ source location; keep only the reason
        reason = str(e).strip().splitlines()[-1].rpartition(": ")[2] if str(e).strip() else ""
        raise InvalidArgument(f"dense: {body!r} is not a valid faiss index factory string "
                              f"({reason})") from None


def _faiss_params(params: dict[str, str]) -> dict[str, str]:
    """The search params faiss gets (the feedback ones act in ``prepare``)."""
    if not any(k in prf.DENSE_KEYS for k in params):
        return params
    return {k: v for k, v in params.items() if k not in prf.DENSE_KEYS}


def _check_params(params: dict[str, str]) -> None:
    unknown = set(params) - set(SEARCH_PARAMS) - set(prf.DENSE_KEYS)
    if unknown:
        raise InvalidArgument(f"dense: unknown search parameter(s) {sorted(unknown)}; "
                              f"known: {sorted(SEARCH_PARAMS) + list(prf.DENSE_KEYS)}")
    for key, value in _faiss_params(params).items():
        try:
            SEARCH_PARAMS[key](value)
        except ValueError:
            raise InvalidArgument(f"dense: search parameter {key}={value!r} is not an integer") from None


class DenseSegment(SegmentIndex):  # and StoredVectors
    def __init__(self, index, folder: Path, docs=None):
        self.index = index
        self.folder = folder
        self.n_rows = index.ntotal
        self._docs = docs
        self._embeddings: np.ndarray | None = None

    def vectors(self, rows: np.ndarray) -> np.ndarray:
        """Stored float32 embeddings of rows (the segment's Arrow column, memory-mapped);
        without one, the index's own reconstruction."""
        if self._embeddings is None and self._docs is not None:
            self._embeddings = self._docs.embeddings()
        if self._embeddings is not None:
            return self._embeddings[rows]
        return self.index.reconstruct_batch(np.asarray(rows, dtype=np.int64))

    def _search_params(self, params: dict[str, str], allow: np.ndarray | None):
        kwargs = {k: SEARCH_PARAMS[k](v) for k, v in params.items()}
        if allow is not None:
            kwargs["sel"] = faiss.IDSelectorBitmap(np.packbits(allow, bitorder="little"))
        if not kwargs:
            return None
        base = faiss.extract_index_ivf(self.index) if "nprobe" in kwargs else None
        if base is not None or "nprobe" in kwargs:
            return faiss.SearchParametersIVF(**kwargs)
        if "efSearch" in kwargs:
            return faiss.SearchParametersHNSW(**kwargs)
        return faiss.SearchParameters(**kwargs)

    def search(self, prepared, k, params, allow):
        vectors = prepared
        if self.n_rows == 0 or (allow is not None and not allow.any()):
            return empty_result(len(vectors), k)
        sp = self._search_params(_faiss_params(params), allow)
        before = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(QUERY_THREADS)  # 2 threads on one pinned CPU: 16 ms a query
        try:
            scores, rows = (self.index.search(vectors, k) if sp is None
                            else self.index.search(vectors, k, params=sp))
        finally:
            faiss.omp_set_num_threads(before)
        return scores, rows

    def score(self, prepared, row_ids):
        rows = np.asarray(row_ids, dtype=np.int64)
        out = np.full((len(prepared), len(rows)), np.nan, dtype=np.float32)
        ok = (rows >= 0) & (rows < self.n_rows)
        if ok.any():
            out[:, ok] = prepared @ self.vectors(rows[ok]).T
        return out


@register
class DenseKind(IndexKind):
    kind = "dense"
    needs_embeddings = True

    def __init__(self, body: str):
        super().__init__(body)
        if body and body != "auto":
            _check_factory(body)
        self.template = None  # trained empty index (IVF/PQ), collection-level

    def describe(self) -> str:
        return f"dense:{self.body}" if self.body and self.body != "auto" else "dense"

    def _factory_for(self, n_rows: int) -> str:
        if self.body and self.body != "auto":
            return self.body
        return "HNSW32,Flat" if n_rows >= AUTO_HNSW_ROWS else "Flat"

    def needs_training(self) -> bool:
        if not self.body or self.body == "auto":
            return False
        return self.template is None and not faiss.index_factory(
            8, self.body, faiss.METRIC_INNER_PRODUCT).is_trained

    def train(self, sample: BuildBatch) -> None:
        x = np.ascontiguousarray(sample.embeddings, dtype=np.float32)
        index = faiss.index_factory(x.shape[1], self.body, faiss.METRIC_INNER_PRODUCT)
        index.train(x)
        self.template = index

    def save_artifacts(self, folder: Path) -> list[str]:
        if self.template is None:
            return []
        faiss.write_index(self.template, str(folder / TEMPLATE_FILE))
        return [TEMPLATE_FILE]

    def load_artifacts(self, folder: Path) -> None:
        path = folder / TEMPLATE_FILE
        if path.exists():
            self.template = faiss.read_index(str(path))

    def build(self, batch: BuildBatch, folder: Path) -> dict:
        x = batch.embeddings
        if x is None:
            raise InvalidArgument("dense: the segment has no embeddings to index")
        factory = self._factory_for(len(x))
        if self.template is not None:
            index = faiss.clone_index(self.template)
        else:
            index = faiss.index_factory(x.shape[1], factory, faiss.METRIC_INNER_PRODUCT)
            if not index.is_trained:  # a per-segment fallback; collections train a template first
                index.train(x)
        index.add(np.ascontiguousarray(x, dtype=np.float32))
        faiss.write_index(index, str(folder / INDEX_FILE))
        return {"factory": factory, "dim": int(x.shape[1]), "n_rows": int(len(x)),
                "files": [INDEX_FILE]}

    def open(self, folder: Path, info: dict, docs=None) -> DenseSegment:
        index = to_device(faiss.read_index(str(folder / INDEX_FILE)), self.device)
        return DenseSegment(index, folder, docs)

    def prepare(self, queries: Sequence[Query], segments, live, params, cache):
        rocchio = None
        if params:
            _check_params(params)
            rocchio = prf.parse_rocchio(params, "dense search params")
        dim = segments[0].index.d if segments else None
        for i, q in enumerate(queries):
            v = q.vector
            if v is None:
                raise InvalidArgument("the dense index needs a query vector or query text")
            if v.ndim != 1 or (dim is not None and v.shape[0] != dim):
                raise InvalidArgument(f"query {i}: vector has shape {v.shape}, "
                                      f"the dense index has dimension {dim}")
        x = (queries[0].vector.reshape(1, -1) if len(queries) == 1
             else np.stack([q.vector for q in queries])).astype(np.float32, copy=False)
        if not np.isfinite(x.sum()) and not np.isfinite(x).all():  # one cheap pass when fine
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InvalidArgument(f"query {bad}: vector contains NaN or infinity")
        x = np.ascontiguousarray(x)
        if rocchio is None:
            return x
        # first pass with the same faiss params; feedback = the global top fb_docs
        first = _faiss_params(params)
        top = prf.global_top(segments, live,
                             lambda seg, mask: seg.search(x, rocchio.fb_docs, first, mask),
                             rocchio.fb_docs, len(x))
        feedback = [np.stack([segments[s].vectors(np.array([r]))[0] for s, r, _ in fb])
                    if fb else np.zeros((0, x.shape[1]), np.float32) for fb in top]
        return prf.rocchio(x, feedback, rocchio)
