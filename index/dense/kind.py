"""The ``dense`` kind: one vector field in a FAISS index per segment.

Factory: ``dense[@FIELD][:OPTIONS,][FAISS]``. ``dense`` is the unnamed field (the collection
model's embeddings, or the user's vectors in a collection without a model); ``dense@image``
is a named field whose vectors the user supplies. OPTIONS (any order, before the faiss
string): ``dim=N`` (else taken from the first vector), ``metric=ip|cosine|l2`` (default ip;
cosine vectors are stored L2-normalized; l2 scores are ``-squared distance``, so higher is
better everywhere), ``source=model|user`` (who fills the field), ``optional`` (a named field
that documents may leave out; needs ``dim``: see ``presence``). FAISS is ``auto`` (``Flat``
below ``AUTO_HNSW_ROWS`` rows per segment, ``HNSW32,Flat`` above, and from
``AUTO_HNSW_MIN_ROWS`` up in a collection past ``AUTO_HNSW_ROWS``) or any
``faiss.index_factory`` string (``HNSW32,Flat``, ``IVF1024,PQ48``). Example:
``dense@image:dim=512,metric=cosine,HNSW32,Flat``,
``dense@image:dim=512,metric=cosine,optional,HNSW32,Flat``.

Default: ``dense`` (auto).
Kinds that need training (IVF, PQ) learn once per collection on a sample; every segment then
starts from a clone of that trained template. Search params: ``nprobe``, ``efSearch`` (an HNSW
search explores at least k: efSearch is raised to k) and
``exact_below`` (see ``index/dense/filtered``: how a filtered or tombstoned search is planned);
``prf=rocchio`` (with ``fb_docs``, ``orig_weight``) moves the query vector towards its top
documents first (``polyindex.index.prf``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import faiss
import numpy as np

from polyindex.config import settings
from polyindex.cuda.device import FAISS_GPU_MAX_K, kernel_device, to_device, torch_kernels
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index import prf
from polyindex.index.dense import compact as dense_compact
from polyindex.index.dense import faiss_factory, lane
from polyindex.index.dense import merge as dense_merge
from polyindex.index.dense import filtered as dense_filtered
from polyindex.index.dense import presence as dense_presence
from polyindex.index.protocol import (
    BuildBatch,
    IndexKind,
    Query,
    SegmentIndex,
    empty_result,
)
from polyindex.types import MAX_VECTOR_DIMS

# faiss spreads even a one-query search over OpenMP threads; measured here, a 11k x 384 flat
# search took 13-31 ms that way and 1.9 ms single-threaded on a busy 2-core machine. Queries
# get their parallelism from concurrent requests instead. POLYINDEX_FAISS_THREADS overrides.
# OpenMP's thread count is a per-thread setting, so searches set it in the searching thread
# (a server's workers, the threads of a caller); this sets it for the importing thread.
QUERY_THREADS = settings().faiss_threads
faiss.omp_set_num_threads(QUERY_THREADS)

# A flat scan of 384-d rows costs ~45 ns a row while they fit the last-level cache and
# ~105 past it (32 MB here: 5,000 rows 0.22 ms, 10,000 0.62, 20,000 2.1, one thread): at
# 20,000 a living collection's exact seals and buffer set the dense p99 during writes (a
# probe over 10,000-40,000 stored rows 5-6x the fresh collection's at the same moments).
AUTO_HNSW_ROWS = 10_000
# In a collection past AUTO_HNSW_ROWS, segments from this size up get HNSW too: a living
# collection's seals and small merges were scanned exactly, 0.9 of a 1.9 ms hybrid query
# (13 segments) against 0.4 ms for the same rows in two HNSW segments. Smaller collections
# stay exact.
AUTO_HNSW_MIN_ROWS = 2_000
INDEX_FILE = "dense.faiss"  # the unnamed field's; a named field's is "dense.FIELD.faiss"
TEMPLATE_FILE = "dense.template.faiss"
SEARCH_PARAMS = {"nprobe": int, "efSearch": int, "exact_below": int}
METRICS = ("ip", "cosine", "l2")
SOURCES = ("model", "user")
OPTIONS = ("dim", "metric", "source")
FLAGS = ("optional",)  # options without a value
MAX_DIM = MAX_VECTOR_DIMS
# faiss's factory turns on polysemous training for IVF..,PQ: a search of the codes by Hamming
# distance, which nothing here asks for (polysemous_ht stays 0). It only relabels each PQ
# sub-quantizer's centroids (the same centroids, the same ADC scores) and was most of the
# training: 172 s of a 10k-vector IVF256,PQ48 train against 76 without (docs/SCALE.md).
# True restores it (bench_bulk's reference path).
POLYSEMOUS = False
# Merged IVF segments copy their sources' codes (``index/dense/merge``) instead of encoding
# every vector again; False re-encodes (bench_bulk's reference path).
MERGE_CODES = True
UNNAMED = "dense"  # the field name of the unnamed field (a top-level "vector")
_FIELD_RE = __import__("re").compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")


def faiss_metric(metric: str) -> int:
    return faiss.METRIC_L2 if metric == "l2" else faiss.METRIC_INNER_PRODUCT


def parse_body(body: str, where: str) -> tuple[dict[str, str], str]:
    """Split a factory body into the leading ``key=value`` options and the faiss string."""
    opts, rest = {}, []
    for part in filter(None, (p.strip() for p in (body or "").split(","))):
        key, sep, value = part.partition("=")
        if not sep and not rest and part in FLAGS:
            opts[part] = "1"
        elif sep and not rest and key.strip() in OPTIONS:
            opts[key.strip()] = value.strip()
        elif sep and not rest:
            raise InvalidArgument(f"{where}: unknown option {key.strip()!r} "
                                  f"(known: {', '.join(OPTIONS + FLAGS)})")
        else:
            rest.append(part)
    return opts, ",".join(rest)


def _faiss_params(params: dict[str, str]) -> dict[str, str]:
    """The search params faiss gets (the feedback ones act in ``prepare``)."""
    if not any(k in prf.DENSE_KEYS for k in params):
        return params
    return {k: v for k, v in params.items() if k not in prf.DENSE_KEYS}


def _trains(index, x: np.ndarray) -> bool:
    """Train ``index`` on ``x``; False when faiss refuses for too few vectors (an IVF with more
    lists, a PQ with more centroids than ``x`` has rows: a first batch of one document, an
    optional field few documents have), which would otherwise fail the write as INTERNAL."""
    try:
        index.train(x)
    except RuntimeError as e:
        if "should be at least as large as number of clusters" in str(e):
            return False
        raise
    return True


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


class DenseKind(IndexKind):
    kind = "dense"
    named_fields = True
    needs_embeddings = True  # the unnamed field reads BuildBatch.embeddings; named fields don't

    def __init__(self, body: str, field: str | None = None):
        super().__init__(body)
        where = f"dense{'@' + field if field else ''}:{body}"
        if field is not None and (not _FIELD_RE.match(field) or field == UNNAMED):
            raise InvalidArgument(f"{where}: vector field name {field!r} must be 1-64 letters, "
                                  f"digits, '_' or '-' (and not {UNNAMED!r}, the unnamed field)")
        self.field = field or UNNAMED
        self.needs_embeddings = field is None
        opts, self.factory = parse_body(body, where)
        self.metric = opts.get("metric", "ip")
        if self.metric not in METRICS:
            raise InvalidArgument(f"{where}: metric must be one of {', '.join(METRICS)}, "
                                  f"got {self.metric!r}")
        self.source = opts.get("source")  # None: decided by the collection (model or not)
        if self.source is not None and self.source not in SOURCES:
            raise InvalidArgument(f"{where}: source must be model or user, got {self.source!r}")
        if field is not None and self.source == "model":
            raise InvalidArgument(f"{where}: a named field holds the user's vectors "
                                  "(source=model is for the unnamed field 'dense')")
        self.optional = "optional" in opts
        if self.optional and field is None:
            raise InvalidArgument(f"{where}: only a named field can be optional "
                                  "(dense@FIELD:dim=N,optional,...)")
        if self.optional and "dim" not in opts:
            raise InvalidArgument(f"{where}: an optional field needs its dimension declared "
                                  "(dim=N): a segment may hold no vector to take it from")
        self.declared_dim = None
        if "dim" in opts:
            try:
                self.declared_dim = int(opts["dim"])
            except ValueError:
                self.declared_dim = 0
            if not 1 <= self.declared_dim <= MAX_DIM:
                raise InvalidArgument(f"{where}: dim must be an integer in 1..{MAX_DIM}, "
                                      f"got {opts['dim']!r}")
        self.dim = self.declared_dim  # learned from the first segment when not declared
        # parsed and bounded, never built: a client's string must not allocate (issue 37)
        self.plan = None if self._auto() else faiss_factory.check(
            self.factory, self.declared_dim, where=where.partition(":")[0])
        self.template = None  # trained empty index (IVF/PQ), collection-level
        self.body = body

    @property
    def name(self) -> str:
        return UNNAMED if self.field == UNNAMED else f"dense@{self.field}"

    @property
    def column(self) -> str:
        """The segment's stored column for this field (``embedding`` for the unnamed one)."""
        return "embedding" if self.field == UNNAMED else f"vector.{self.field}"

    @property
    def index_file(self) -> str:
        # file names stay plain (letters, digits, '_', '-', '.'): "dense.image.faiss"
        return INDEX_FILE if self.field == UNNAMED else f"dense.{self.field}.faiss"

    def describe(self) -> str:
        opts = [f"dim={self.declared_dim}"] if self.declared_dim else []
        opts += [f"metric={self.metric}"] if self.metric != "ip" else []
        opts += [f"source={self.source}"] if self.source else []
        opts += ["optional"] if self.optional else []
        body = ",".join(opts + ([self.factory] if self.factory and self.factory != "auto" else []))
        return f"{self.name}:{body}" if body else self.name

    def _auto(self) -> bool:
        return not self.factory or self.factory == "auto"

    def _factory_for(self, n_rows: int, collection_rows: int = 0) -> str:
        if not self._auto():
            return self.factory
        big = n_rows >= AUTO_HNSW_ROWS or (n_rows >= AUTO_HNSW_MIN_ROWS and
                                            n_rows + collection_rows >= AUTO_HNSW_ROWS)
        return "HNSW32,Flat" if big else "Flat"

    def keeps_vectors(self) -> bool:
        """Whether every segment's faiss index holds the vectors exactly (Flat, HNSW..,Flat,
        IVF..,Flat): then a user-supplied field is stored only there, not also in docs.arrow."""
        return self._auto() or self.plan.keeps_vectors

    def needs_training(self) -> bool:
        if self._auto():
            return False
        if self.template is not None:
            return False
        # from the parse, not an empty index: the dimension may not be known yet
        return self._plan_for(self.dim, 0).trains

    def _plan_for(self, dim: int | None, rows: int) -> faiss_factory.Plan:
        """The factory string checked again at the field's real dimension and ``rows``
        vectors, before faiss allocates anything for it."""
        plan = faiss_factory.check(self.factory, dim, where=self.name)
        if rows:
            faiss_factory.check_rows(plan, rows, self.name)
        return plan

    def _vectors_of(self, batch: BuildBatch) -> np.ndarray | None:
        if self.field == UNNAMED:
            return batch.embeddings if batch.embeddings is not None else batch.vectors.get(UNNAMED)
        return batch.vectors.get(self.field)

    def train(self, sample: BuildBatch) -> None:
        x = self._vectors_of(sample)
        real = ~dense_presence.missing_rows(x)
        if sample.pruned is not None:
            real &= ~sample.pruned
        x = np.ascontiguousarray(x[real], dtype=np.float32)
        if not len(x):  # an optional field no sampled document has: trained later
            return
        self._plan_for(x.shape[1], len(x))
        index = faiss.index_factory(x.shape[1], self.factory, faiss_metric(self.metric))
        ivf = faiss.try_extract_index_ivf(index)
        if ivf is not None and hasattr(faiss.downcast_index(ivf), "do_polysemous_training"):
            faiss.downcast_index(ivf).do_polysemous_training = POLYSEMOUS
        if _trains(index, x):  # else too few vectors yet: trained by a later commit's sample
            self.template = index

    def _template_file(self) -> str:
        return TEMPLATE_FILE if self.field == UNNAMED else f"dense.{self.field}.template.faiss"

    def save_artifacts(self, folder: Path) -> list[str]:
        if self.template is None:
            return []
        faiss.write_index(self.template, str(folder / self._template_file()))
        return [self._template_file()]

    def load_artifacts(self, folder: Path) -> None:
        path = folder / self._template_file()
        if path.exists():
            self.template = faiss.read_index(str(path))

    def build(self, batch: BuildBatch, folder: Path) -> dict:
        x = self._vectors_of(batch)
        if x is None:
            raise InvalidArgument(f"{self.name}: the segment has no vectors to index")
        if self.dim is not None and x.shape[1] != self.dim:
            raise InvalidArgument(f"{self.name}: vectors have dimension {x.shape[1]}, "
                                  f"the field has {self.dim}")
        missing = dense_presence.missing_rows(x)
        if missing.any() and not self.optional and (
                batch.pruned is None or (missing & ~batch.pruned).any()):
            raise InvalidArgument(f"{self.name}: a document has no vector for this field")
        if batch.pruned is not None:  # pruned by quality: absent, as a missing vector is
            missing = missing | batch.pruned
        n_rows = len(x)
        if missing.any():  # the index holds the present rows only (``compact``)
            x = x[~missing]
        factory = self._factory_for(len(x), batch.collection_rows)
        if not self._auto():
            self._plan_for(x.shape[1], len(x))
        if self.template is not None:
            index = faiss.clone_index(self.template)
        else:
            index = faiss.index_factory(x.shape[1], factory, faiss_metric(self.metric))
            # a per-segment fallback (collections train a template first); a segment with
            # no vector of the field, or too few to train on, is searched exactly instead
            if not index.is_trained and not (
                    len(x) and _trains(index, np.ascontiguousarray(x, dtype=np.float32))):
                factory = "Flat"
                index = faiss.index_factory(x.shape[1], factory, faiss_metric(self.metric))
        if len(x):
            index.add(np.ascontiguousarray(x, dtype=np.float32))
        faiss.write_index(index, str(folder / self.index_file))
        self.dim = int(x.shape[1])
        info = {"factory": factory, "dim": int(x.shape[1]), "n_rows": n_rows,
                "files": [self.index_file]}
        if self.field != UNNAMED or self.metric != "ip":
            info.update(field=self.field, metric=self.metric)
        if missing.any():
            info["files"].append(dense_presence.write(folder, self.index_file, ~missing))
            info["missing"] = int(missing.sum())
            info["compact"] = True
        return info

    def merge(self, parts, batch: BuildBatch, folder: Path) -> dict:
        """An IVF field's merged segment from its sources' codes (``index/dense/merge``: no
        vector encoded again); anything else (Flat, HNSW, optional or pruned rows, a GPU
        index, no template) is built from the merged vectors as before."""
        if not (MERGE_CODES and self.template is not None and batch.pruned is None
                and dense_merge.mergeable(self.template, parts)):
            return self.build(batch, folder)
        index = dense_merge.merge_codes(self.template, parts)
        faiss.write_index(index, str(Path(folder) / self.index_file))
        info = {"factory": self.factory, "dim": int(index.d), "n_rows": int(index.ntotal),
                "files": [self.index_file]}
        if self.field != UNNAMED or self.metric != "ip":
            info.update(field=self.field, metric=self.metric)
        return info

    def open(self, folder: Path, info: dict, docs=None) -> DenseSegment:
        cpu_index = read_index(folder / self.index_file)
        index = to_device(cpu_index, self.device)
        if self.dim is None:
            self.dim = info.get("dim")
        present = None
        on_gpu = index is not cpu_index
        if info.get("compact"):
            n_rows, n_missing = int(info["n_rows"]), int(info["missing"])
            present = dense_presence.read(folder, self.index_file, n_rows, n_missing)
            if index.ntotal != n_rows - n_missing:
                raise Corrupt(f"{folder / self.index_file}: {index.ntotal} vectors, the segment "
                              f"has {n_rows - n_missing} rows with one")
            # slot space: no stored column (its rows are the segment's), no presence mask
            inner = DenseSegment(index, folder, None, self.column, self.metric, None,
                                 self.device, on_gpu=on_gpu)
            return dense_compact.CompactSegment(inner, present, docs, self.column)
        if info.get("missing"):  # segments written before the compact layout: zero rows
            present = dense_presence.read(folder, self.index_file, index.ntotal,
                                          int(info["missing"]))
        return DenseSegment(index, folder, docs, self.column, self.metric, present, self.device,
                            on_gpu=on_gpu)

    def prepare(self, queries: Sequence[Query], segments, live, params, cache):
        rocchio = None
        if params:
            _check_params(params)
            rocchio = prf.parse_rocchio(params, "dense search params")
        dim = segments[0].index.d if segments else self.dim
        vecs = []
        for i, q in enumerate(queries):
            v = q.vector if self.field == UNNAMED else q.vectors.get(self.field)
            if v is None:
                raise InvalidArgument(
                    "the dense index needs a query vector or query text" if self.field == UNNAMED
                    else f"query {i}: no vector for field {self.field!r} "
                         f"(query(vector=..., using={self.field!r}))")
            if v.ndim != 1 or (dim is not None and v.shape[0] != dim):
                raise InvalidArgument(f"query {i}: vector has shape {v.shape}, "
                                      f"the {self.name} index has dimension {dim}")
            vecs.append(v)
        x = (vecs[0].reshape(1, -1) if len(vecs) == 1 else np.stack(vecs)).astype(np.float32,
                                                                                  copy=False)
        if not np.isfinite(x.sum()) and not np.isfinite(x).all():  # one cheap pass when fine
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InvalidArgument(f"query {bad}: vector contains NaN or infinity")
        if self.metric == "cosine":
            norms = np.linalg.norm(x, axis=1, keepdims=True)
            if (norms == 0).any():
                raise InvalidArgument(f"query {int(np.flatnonzero(norms == 0)[0])}: a zero "
                                      f"vector has no cosine similarity ({self.name})")
            x = x / norms
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

    def direct_plan(self, snapshot, segments, params: dict[str, str]) -> lane.Plan | None:
        """The vector lane's plan (``PlansDirectly``) of a stage over ``snapshot``'s
        ``segments``, or None where the general path must answer: a named field, feedback
        (``prepare``'s work), params it would refuse (it reports them), no segment."""
        if self.field != UNNAMED:
            return None
        if _faiss_params(params) != params:  # Rocchio feedback: prepare's work
            return None
        try:
            _check_params(params)
        except Exception:
            return None  # the general path reports it
        if not segments:
            return None
        return lane.Plan(snapshot, self, segments, params, _faiss_params(params),
                         faiss_kwargs(params), QUERY_THREADS)
