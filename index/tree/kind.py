"""The ``tree`` kind: a Cobweb-style hierarchy of prototypes over the document embeddings.

Factory: ``tree:branch=16,leaf=64[,sim=cos|dot|gauss][,rank=best|path][,budget=128][,temp=T]
[,group=G][,seed=S]``. Default: ``tree:branch=16,leaf=64``. ``branch``: most children per node
(2-256); ``leaf``: most documents per leaf (1-4096); ``group``: segments above this many
documents build their top levels by k-means (``build``), 0 = always incremental;
``sim``/``rank``/``budget``/``temp``: search defaults (``search``). Search params
``budget`` (expanded nodes, 0 = unlimited; over several segments each tree expands its share
of it by live rows: ``TreeKind.search_snapshot``), ``rank``, ``sim`` and ``temp`` override
them per query.

Where the tree lives: one tree per segment, built when the segment is built (segments are
immutable). Within a segment every document is inserted incrementally (Cobweb operators), after
k-means top levels for large segments; documents added later go to new segments (online buffer
segments included), which grow their own trees the same way, so no existing tree is rebuilt.

Per segment two Arrow IPC files: ``tree.nodes.arrow`` (nodes breadth-first: ``parent``,
``child_start``, ``n_child``, ``doc_start``, ``doc_end``, ``count``, ``label``, and ``mean`` and
``var`` as FixedSizeList<float32>[d]) and ``tree.docs.arrow`` (``doc``: rows depth-first, so a
subtree's rows are one range; ``leaf``: the leaf of each row, in row order). Documents are
scored from the segment's stored embeddings (``docs.arrow``).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

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
from polyindex.index.tree import search as tree_search
from polyindex.index.tree.build import TreeArrays, TreeBuilder

NODES_FILE = "tree.nodes.arrow"
DOCS_FILE = "tree.docs.arrow"
FORMAT = 1
SIMS = {"dot": tree_search.DOT, "cos": tree_search.COS, "gauss": tree_search.GAUSS}
RANKS = ("best", "path")
# measured on cranfield and nfcorpus (bench_tree.py): path-sum with dot is within 1% of flat
# from 0.2 up (it tends to flat as temp grows); best-first traversal by cos at 0.05
DEFAULT_TEMP = {"dot": 0.2, "cos": 0.05, "gauss": 0.1}
_NODE_SCHEMA = {"parent": pa.int32(), "child_start": pa.int32(), "n_child": pa.int32(),
                "doc_start": pa.int64(), "doc_end": pa.int64(), "count": pa.int64(),
                "label": pa.string()}
_DOCS_SCHEMA = {"doc": pa.int32(), "leaf": pa.int32()}
_SEARCH_KNOBS = ("budget", "rank", "sim", "temp")
VAR_PRIOR = 4.0  # pseudo-documents of the parent's variance in a node's variance (small nodes)
VAR_FLOOR = 1e-4  # relative to the root's mean variance


@dataclass
class TreeConfig:
    branch: int = 16
    leaf: int = 64
    group: int = 4096
    seed: int = 0
    sim: str = "cos"
    rank: str = "best"
    budget: int = 128  # >= 0.984 x dense flat on the six BEIR collections (bench_tree.py)
    temp: float | None = None  # None: DEFAULT_TEMP[sim]


def _check_search(cfg: dict, where: str) -> None:
    if cfg["sim"] not in SIMS:
        raise InvalidArgument(f"{where}: sim must be one of {sorted(SIMS)}, got {cfg['sim']!r}")
    if cfg["rank"] not in RANKS:
        raise InvalidArgument(f"{where}: rank must be one of {list(RANKS)}, got {cfg['rank']!r}")
    if not 0 <= cfg["budget"] <= 10_000_000:
        raise InvalidArgument(f"{where}: budget must be in 0..10000000 (0 = unlimited), "
                              f"got {cfg['budget']}")
    temp = cfg.get("temp")
    if temp is not None and not (math.isfinite(temp) and temp > 0):
        raise InvalidArgument(f"{where}: temp must be a finite number > 0, got {temp}")


def parse_factory(body: str) -> TreeConfig:
    where = f"index factory string {('tree:' + body) if body else 'tree'!r}"
    opts = parse_options(body, where=where)
    known = ("branch", "leaf", "group", "seed", "sim", "rank", "budget", "temp")
    unknown = sorted(set(opts) - set(known))
    if unknown:
        raise InvalidArgument(f"{where}: unknown option(s) {', '.join(unknown)}; the tree index "
                              f"knows {', '.join(known)}")
    d = TreeConfig()
    cfg = {key: option(opts, key, int, getattr(d, key), where=where)
           for key in ("branch", "leaf", "group", "seed", "budget")}
    cfg["sim"] = opts.get("sim", d.sim)
    cfg["rank"] = opts.get("rank", d.rank)
    cfg["temp"] = option(opts, "temp", float, None, where=where)
    for key, lo, hi in (("branch", 2, 256), ("leaf", 1, 4096), ("group", 0, 100_000_000),
                        ("seed", 0, 2**31 - 1)):
        if not lo <= cfg[key] <= hi:
            raise InvalidArgument(f"{where}: {key} must be in {lo}..{hi}, got {cfg[key]}")
    _check_search(cfg, where)
    return TreeConfig(**cfg)


@dataclass
class TreePrepared:
    vectors: np.ndarray  # (nq, d) float32
    budget: int
    path_rank: bool
    mode: int
    temp: float
    expanded: np.ndarray  # int64 (nq,): nodes opened, summed over the segments searched
    # path rank over several segments: temp * log(share of the snapshot's live rows) per
    # segment (by id), so per-segment path probabilities become comparable (see _segment_prior)
    prior: dict = field(default_factory=dict)
    # each segment's share of the snapshot's live rows (by id; absent: 1), which splits the
    # collection-wide ``budget`` between the segments' trees (see TreeKind.search_snapshot)
    share: dict = field(default_factory=dict)

    def offset(self, seg) -> float:
        return self.prior.get(id(seg), 0.0) if self.path_rank else 0.0

    def budget_of(self, seg) -> int:
        """The segment's part of the budget: ``budget * share``, at least 1 node (0 stays
        unlimited)."""
        if self.budget <= 0 or id(seg) not in self.share:
            return self.budget
        return max(1, int(round(self.budget * self.share[id(seg)])))


def _fixed_list(x: np.ndarray) -> pa.Array:
    d = x.shape[1]
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), d)


def _list_values(table: pa.Table, name: str, n: int, path: Path) -> np.ndarray:
    col = table.column(name)
    if not pa.types.is_fixed_size_list(col.type) or col.type.value_type != pa.float32():
        raise Corrupt(f"{path}: column {name!r} must be FixedSizeList<float32>, is {col.type}")
    arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    d = col.type.list_size
    return arr.values.to_numpy(zero_copy_only=True)[:n * d].reshape(n, d)


def effective_variance(var: np.ndarray, count: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Node variances shrunk toward the parent's (``VAR_PRIOR`` pseudo-documents), with a
    floor: a leaf of a few near-identical documents must not get near-zero variances."""
    out = np.empty(var.shape, np.float64)
    if len(var) == 0:
        return out
    floor = VAR_FLOOR * max(float(var[0].mean()), 1e-12)
    out[0] = var[0] + floor
    depth = np.zeros(len(var), np.int64)
    for i in range(1, len(var)):
        depth[i] = depth[parent[i]] + 1
    for lvl in range(1, int(depth.max()) + 1 if len(var) > 1 else 1):
        idx = np.flatnonzero(depth == lvl)  # parents (one level up) are final already
        n = count[idx].astype(np.float64)[:, None]
        out[idx] = (n * var[idx] + VAR_PRIOR * out[parent[idx]]) / (n + VAR_PRIOR) + floor
    return out


class TreeSegment(SegmentIndex):
    def __init__(self, folder: Path, n_rows: int, nodes: dict, docs: dict, mean: np.ndarray,
                 var: np.ndarray, labels, keep=(), stored=None):
        self.folder, self.n_rows = folder, n_rows
        self._stored = stored  # the segment's SegmentDocs (document embeddings)
        self.parent, self.child_start = nodes["parent"], nodes["child_start"]
        self.n_child, self.count = nodes["n_child"], nodes["count"]
        self.doc_start, self.doc_end = nodes["doc_start"], nodes["doc_end"]
        self.docs, self.leaf_of = docs["doc"], docs["leaf"]
        self.mean, self.var, self.labels = mean, var, labels
        self._keep = keep
        self.n_nodes = len(self.parent)
        self.logn = np.log(np.maximum(self.count, 1).astype(np.float64))  # log prior counts
        sizes = self.doc_end - self.doc_start
        leaf_sizes = sizes[self.n_child == 0]
        self.max_fan = int(max(self.n_child.max(initial=1), leaf_sizes.max(initial=1), 1))
        depth = np.zeros(self.n_nodes, np.int64)
        for i in range(1, self.n_nodes):
            depth[i] = depth[self.parent[i]] + 1
        self.depth = depth
        self.max_depth = int(depth.max(initial=0))
        self._gauss = None
        self._cos = None
        self._emb = None

    # -- lazily built parts ----------------------------------------------------------------
    def embeddings(self) -> np.ndarray:
        """The segment's stored document embeddings (docs.arrow, memory-mapped)."""
        if self._emb is None:
            emb = self._stored.embeddings() if self._stored is not None else None
            if emb is None:
                raise Corrupt(f"{self.folder}: the tree index needs the segment's embeddings")
            self._emb = np.ascontiguousarray(emb, np.float32)
        return self._emb

    def gauss_arrays(self):
        """(1/v, mean/v, sum(mean^2/v) + sum(log v), sum(log v)) per node for ``sim=gauss``."""
        if self._gauss is None:
            v = effective_variance(self.var, self.count, self.parent)
            w = 1.0 / v
            mean = self.mean.astype(np.float64)
            logdet = np.log(v).sum(1)
            self._gauss = (w.astype(np.float32), (mean * w).astype(np.float32),
                           (mean * mean * w).sum(1) + logdet, logdet)
        return self._gauss

    def cos_arrays(self):
        """(1 / ||mean|| per node, 1 / ||x|| per row) for ``sim=cos``."""
        if self._cos is None:
            def inv(norms):
                return np.where(norms > 0, 1.0 / np.maximum(norms, 1e-30), 0.0)
            x = self.embeddings()
            xn = np.concatenate([np.linalg.norm(x[i:i + 65536], axis=1)
                                 for i in range(0, len(x), 65536)] or [np.zeros(0)])
            self._cos = (inv(np.linalg.norm(self.mean.astype(np.float64), axis=1)), inv(xn))
        return self._cos

    def _sim_arrays(self, mode: int):
        if mode == tree_search.GAUSS:
            return self.gauss_arrays()
        if mode == tree_search.COS:
            d = self.mean.shape[1]
            empty = np.zeros((0, d), np.float32)
            return (empty, empty, *self.cos_arrays())
        d = self.mean.shape[1]
        empty = np.zeros((0, d), np.float32)
        return empty, empty, np.zeros(0), np.zeros(0)

    # -- protocol --------------------------------------------------------------------------
    def search(self, prepared: TreePrepared, k, params, allow, budget: int | None = None):
        """This tree's best-first search; ``budget`` (nodes to expand) defaults to
        ``prepared.budget``, a snapshot passes each segment its share of it."""
        nq = len(prepared.vectors)
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        if k == 0 or self.n_rows == 0 or (allow is not None and not allow.any()):
            return empty_result(nq, k)
        allow = postings.check_allow(allow, self.n_rows, "tree search")
        allow = postings._NO_ALLOW if allow is None else allow  # read-only: one kernel type
        w, mw, cst, logdet = self._sim_arrays(prepared.mode)
        out_s = np.full((nq, k), -np.inf)
        out_r = np.full((nq, k), -1, np.int64)
        expanded = np.zeros(nq, np.int64)
        budget = prepared.budget if budget is None else budget
        tree_search.search(prepared.vectors, k, budget, prepared.path_rank,
                           prepared.temp, prepared.mode, allow, self.child_start, self.n_child,
                           self.logn, self.doc_start, self.doc_end, self.docs, self.mean, w, mw,
                           cst, logdet, self.embeddings(), self.max_fan, out_s, out_r, expanded)
        prepared.expanded += expanded
        off = prepared.offset(self)
        if off:
            out_s += off
        return out_s.astype(np.float32), out_r

    def score(self, prepared: TreePrepared, row_ids):
        """The path score of the rows (the tree's own signal, e.g. a rerank feature), whatever
        the ranking rule of ``prepared``; the same floats ``rank=path`` search returns."""
        return self._score(prepared, row_ids, True)

    def similarity(self, prepared: TreePrepared, row_ids):
        """``sim(q, doc)`` of the rows: the scores ``rank=best`` search returns."""
        return self._score(prepared, row_ids, False)

    def _score(self, prepared: TreePrepared, row_ids, path_rank: bool) -> np.ndarray:
        rows = np.asarray(row_ids, dtype=np.int64).reshape(-1)
        out = np.full((len(prepared.vectors), len(rows)), np.nan)
        if self.n_rows and len(rows):
            w, mw, cst, logdet = self._sim_arrays(prepared.mode)
            tree_search.score_rows(prepared.vectors, rows, path_rank, prepared.temp,
                                   prepared.mode, self.parent, self.leaf_of, self.child_start,
                                   self.n_child, self.logn, self.doc_start, self.doc_end,
                                   self.docs, self.mean, w, mw, cst, logdet, self.embeddings(),
                                   self.max_fan, self.max_depth, out)
            if path_rank:
                out += prepared.prior.get(id(self), 0.0)
        return out.astype(np.float32)

    # -- explanations ----------------------------------------------------------------------
    def path(self, row: int) -> list[int]:
        """Node ids from the root down to the leaf holding ``row``."""
        out = [int(self.leaf_of[row])]
        while out[-1] != 0:
            out.append(int(self.parent[out[-1]]))
        return out[::-1]

    def explain(self, prepared: TreePrepared, row_ids) -> list[dict | None]:
        """Per row: its root-to-leaf path (node id, label, documents, the first query's
        similarity to the node) and its score under both ranking rules."""
        out: list[dict | None] = []
        q = prepared.vectors[:1]
        mode = prepared.mode
        for row in np.asarray(row_ids, np.int64).reshape(-1).tolist():
            if not 0 <= row < self.n_rows:
                out.append(None)
                continue
            nodes = self.path(row)
            sims = self._node_sims(q[0], nodes, mode)
            scores = {"path": float(self.score(prepared, [row])[0, 0]),
                      "best": float(self.similarity(prepared, [row])[0, 0])}
            out.append({"path": [{"node": n, "label": self.labels[n].as_py(),
                                  "docs": int(self.count[n]), "sim": round(s, 6)}
                                 for n, s in zip(nodes, sims)],
                "path_score": scores["path"], "doc_score": scores["best"]})
        return out

    def _node_sims(self, q: np.ndarray, nodes: list[int], mode: int) -> list[float]:
        if mode != tree_search.GAUSS:
            dots = self.mean[nodes].astype(np.float64) @ q
            if mode == tree_search.COS:
                dots = dots * self.cos_arrays()[0][nodes]
            return dots.tolist()
        w, mw, cst, _ = self.gauss_arrays()
        q64 = q.astype(np.float64)
        vals = -0.5 * (w[nodes] @ (q64 * q64) - 2.0 * (mw[nodes] @ q64) + cst[nodes]) / len(q)
        return vals.tolist()


class TreeKind(IndexKind):
    kind = "tree"
    needs_embeddings = True

    def __init__(self, body: str):
        self.cfg = parse_factory(body)
        c, d = self.cfg, TreeConfig()
        text = f"branch={c.branch},leaf={c.leaf}"
        for key in ("group", "seed", "sim", "rank", "budget", "temp"):
            if getattr(c, key) != getattr(d, key):
                text += f",{key}={getattr(c, key)}"
        super().__init__(text)

    # -- segments ------------------------------------------------------------------------
    def build_tree(self, x: np.ndarray) -> tuple[TreeArrays, TreeBuilder]:
        """The tree over rows of ``x``: k-means top levels above ``group`` rows, then
        incremental insertion of every row (in row order)."""
        c = self.cfg
        builder = TreeBuilder(x, c.branch, c.leaf, capacity=max(64, 4 * len(x) // c.leaf))
        rows = np.arange(len(x), dtype=np.int64)
        if c.group and len(x) > c.group:
            builder.bulk(rows, c.group, c.seed)
        else:
            builder.insert(rows)
        return builder.finish(), builder

    def build(self, batch: BuildBatch, folder: Path) -> dict:
        folder = Path(folder)
        x = batch.embeddings
        if x is None:
            raise InvalidArgument("tree: the segment has no embeddings to index")
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or not np.isfinite(x).all():
            raise InvalidArgument("tree: embeddings must be a finite (n, d) array")
        tree, builder = self.build_tree(x)
        from polyindex.index.tree.labels import node_labels
        texts = [f"{t or ''} {b or ''}".strip() for t, b in zip(batch.titles, batch.texts)]
        labels = node_labels(texts, tree.docs, tree.doc_start, tree.doc_end, tree.parent,
                             tree.count) if any(texts) else [""] * tree.n_nodes
        write_tree(folder, tree, labels)
        leaves = tree.n_child == 0
        return {"format": FORMAT, "n_rows": len(x), "dim": int(x.shape[1]),
                "n_nodes": tree.n_nodes, "n_leaves": int(leaves.sum()),
                "depth": int(tree.depth().max(initial=0)),
                "ops": dict(zip(("add", "new", "merge", "split"), builder.ops.tolist())),
                "files": [NODES_FILE, DOCS_FILE]}

    def open(self, folder: Path, info: dict, docs=None) -> TreeSegment:
        folder = Path(folder)
        check_format(folder, info, "tree", FORMAT)
        return read_tree(folder, int(info.get("n_rows", -1)), docs)

    # -- queries -------------------------------------------------------------------------
    def search_config(self, params: dict[str, str]) -> dict:
        unknown = sorted(set(params) - set(_SEARCH_KNOBS))
        if unknown:
            raise InvalidArgument(f"tree: unknown search parameter(s) {unknown}; known: "
                                  f"{list(_SEARCH_KNOBS)}")
        where = "tree search params"
        cfg = {"budget": option(params, "budget", int, self.cfg.budget, where=where),
               "rank": params.get("rank", self.cfg.rank), "sim": params.get("sim", self.cfg.sim),
               "temp": option(params, "temp", float, None, where=where)}
        _check_search(cfg, where)
        if cfg["temp"] is None:  # the factory's temp belongs to the factory's sim
            own = self.cfg.temp is not None and cfg["sim"] == self.cfg.sim
            cfg["temp"] = self.cfg.temp if own else DEFAULT_TEMP[cfg["sim"]]
        return cfg

    def search_snapshot(self, prepared: TreePrepared, segments: Sequence[TreeSegment],
                        bases: np.ndarray, k: int, params, allow):
        """Every segment at once, so ``budget`` is collection-wide: each segment's tree expands
        its share of the budget (by live rows, at least one node; each still goes on until it
        holds k documents), the results merge by (score, global key). ``budget=0`` with
        ``rank=best`` is flat search: the same as one segment holding the same documents.
        Otherwise what a budget reaches, and path scores, depend on each tree's shape, which
        depends on the documents the segment holds (docs/notes/segmentation-independence.md)."""
        if k < 0:
            raise InvalidArgument(f"k must be >= 0, got {k}")
        parts = [seg.search(prepared, k, params, m, budget=prepared.budget_of(seg))
                 for seg, m in zip(segments, allow)]
        return merge_segments(parts, bases, k)

    def prepare(self, queries: Sequence[Query], segments, live, params, cache) -> TreePrepared:
        cfg = self.search_config(params)
        if any(q.vector is None for q in queries):
            raise InvalidArgument("the tree index needs a query vector or query text")
        dim = next((s.mean.shape[1] for s in segments if s.n_nodes), None)
        for i, q in enumerate(queries):
            if q.vector.ndim != 1 or (dim is not None and q.vector.shape[0] != dim):
                raise InvalidArgument(f"query {i}: vector has shape {q.vector.shape}, the tree "
                                      f"index has dimension {dim}")
        x = np.stack([q.vector for q in queries]).astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InvalidArgument(f"query {bad}: vector contains NaN or infinity")
        share = _segment_share(segments, live, cache)
        return TreePrepared(np.ascontiguousarray(x), cfg["budget"], cfg["rank"] == "path",
                            SIMS[cfg["sim"]], float(cfg["temp"]), np.zeros(len(x), np.int64),
                            _segment_prior(segments, live, float(cfg["temp"]), cache), share)


def _segment_share(segments, live, cache: dict) -> dict:
    """Each segment's share of the snapshot's live rows, by id (empty for one segment);
    cached per snapshot."""
    if len(segments) < 2:
        return {}
    if "share" not in cache:
        n = np.array([s.n_rows if m is None else int(m.sum()) for s, m in zip(segments, live)],
                     np.float64)
        total = max(n.sum(), 1.0)
        cache["share"] = {id(s): float(c / total) for s, c in zip(segments, n)}
    return cache["share"]


def _segment_prior(segments, live, temp: float, cache: dict) -> dict:
    """A path score is a log-probability within one segment's tree, so the best document of a
    small segment scores near 0 whatever the query. Treating segments as exchangeable samples
    of the collection, P(doc | q) ~ P(segment) * P(doc | q, segment) with P(segment) = its share
    of the live rows: each segment's path scores are offset by ``temp * log(share)`` (0 for a
    single segment). Cached per snapshot (the cache dict is the snapshot's)."""
    if len(segments) < 2:
        return {}
    key = ("prior", temp)
    if key not in cache:
        n = np.array([s.n_rows if m is None else int(m.sum()) for s, m in zip(segments, live)],
                     np.float64)
        total = n.sum()
        cache[key] = {id(s): (temp * float(np.log(c / total)) if c > 0 else 0.0)
                      for s, c in zip(segments, n)}
    return cache[key]


def write_tree(folder: Path, tree: TreeArrays, labels: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    postings.write_arrow(folder / NODES_FILE, {
        "parent": tree.parent, "child_start": tree.child_start, "n_child": tree.n_child,
        "doc_start": tree.doc_start, "doc_end": tree.doc_end, "count": tree.count,
        "label": pa.array(labels, pa.string()), "mean": _fixed_list(tree.mean),
        "var": _fixed_list(tree.var)})
    postings.write_arrow(folder / DOCS_FILE, {"doc": tree.docs, "leaf": tree.leaf_of})


def read_tree(folder: Path, n_rows: int, docs_store=None) -> TreeSegment:
    nt, nodes = postings.read_arrow(folder / NODES_FILE, _NODE_SCHEMA)
    dt, docs = postings.read_arrow(folder / DOCS_FILE, _DOCS_SCHEMA)
    n = len(nodes["parent"])
    mean = _list_values(nt, "mean", n, folder / NODES_FILE)
    var = _list_values(nt, "var", n, folder / NODES_FILE)
    ok = n >= 1 and n_rows == len(docs["doc"]) and nodes["parent"][0] == -1 and (
        n == 1 or ((nodes["parent"][1:] >= 0).all() and (nodes["parent"][1:] < n).all()
                   and (nodes["child_start"][nodes["n_child"] > 0] < n).all()
                   and int(nodes["n_child"].sum()) == n - 1)) and (
        n_rows == 0 or (docs["doc"].min() >= 0 and docs["doc"].max() < n_rows
                        and docs["leaf"].min() >= 0 and docs["leaf"].max() < n))
    if not ok:
        raise Corrupt(f"{folder}: tree index files are inconsistent (nodes {n}, rows "
                      f"{len(docs['doc'])}, expected rows {n_rows})")
    return TreeSegment(folder, n_rows, nodes, docs, mean, var, nodes["label"], (nt, dt),
                       docs_store)
