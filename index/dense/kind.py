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

from polyindex.cuda.device import to_device
from polyindex.errors import Corrupt, InvalidArgument
from polyindex.index import prf
from polyindex.index.dense import compact as dense_compact
from polyindex.index.dense import faiss_factory, lane
from polyindex.index.dense import merge as dense_merge
from polyindex.index.dense import presence as dense_presence
from polyindex.index.protocol import BuildBatch, IndexKind, Query
# QUERY_THREADS and faiss_kwargs are read here by callers of the kind's module
from polyindex.index.dense.segment import (  # noqa: F401
    QUERY_THREADS, DenseSegment, _check_params, _faiss_params, faiss_kwargs, read_index)
from polyindex.types import MAX_VECTOR_DIMS


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
METRICS = ("ip", "cosine", "l2")
SOURCES = ("model", "user")
OPTIONS = ("dim", "metric", "source")
FLAGS = ("optional",)  # options without a value
MAX_DIM = MAX_VECTOR_DIMS
# faiss's factory turns on polysemous training for IVF..,PQ and a plain PQ: a search of the
# codes by Hamming distance, which nothing here asks for (polysemous_ht stays 0). It only
# relabels each PQ sub-quantizer's centroids (the same centroids, the same ADC scores) and was
# most of the training: 172 s of a 10k-vector IVF256,PQ48 train against 76 without
# (docs/SCALE.md); a 3,000-vector PQ8 12.6 s against 0.4. True restores it (bench_bulk's
# reference path).
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


def _set_polysemous(index) -> None:
    """POLYSEMOUS on whichever part of ``index`` has the switch: an IVF's PQ, a plain PQ, either
    behind a transform (OPQ)."""
    top = faiss.downcast_index(index)
    inner = faiss.downcast_index(top.index) if isinstance(top, faiss.IndexPreTransform) else top
    ivf = faiss.try_extract_index_ivf(index)
    for part in (inner, faiss.downcast_index(ivf) if ivf is not None else None):
        if part is not None and hasattr(part, "do_polysemous_training"):
            part.do_polysemous_training = POLYSEMOUS


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
        _set_polysemous(index)
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
