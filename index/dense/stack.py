"""An online buffer's dense rows as one matrix: one exact scan, and past a size an HNSW graph.

Every write batch becomes a small buffer segment (``online.view``) with its own ``Flat``
index; a buffer holds up to a seal's worth of rows (5,000 by default) in up to ~9 of them.
Searched one faiss call each, they cost ~35 us of call overhead apiece, and scanning up to
5,000 rows exactly cost 0.4-0.7 ms a query on a busy machine against ~0.15 ms for an HNSW
over them (bench/README.md, stop 32). A ``Stack`` keeps the buffer's vectors - copied from
the segments' own flat storage as they are added, so the very same floats - in one growing
matrix, with each row's key among the buffer's rows (``rel``: -1 once the buffer's merge
dropped it). In a collection past ``dense.AUTO_HNSW_ROWS`` the buffer indexer
(``online.buffer_index``) grows an HNSW over the first ``indexed`` rows off the write path;
a search is that graph for the indexed rows and an exact scan (the kernel
``IndexFlat.search`` itself calls) for the rest.

Appends write only past the rows a published view covers, a full matrix is replaced, not
grown in place, and a published graph is never added to: a snapshot's view never changes
under a query. Both the vector lane and the general pipeline search a stack with ``search``,
so the two answer alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

FIELD = "dense"  # the unnamed dense field: the one a buffer stacks
GRAPH_M = 16  # a buffer's graph: 0.28 s to build over 5,000 x 384 rows, recall@10 0.999
GRAPH_EF_CONSTRUCTION = 40
# a graph over fewer allowed rows than this share is searched exactly (the filtered rule)
GRAPH_MIN_SHARE = 0.5


_SWIG: tuple | None = None


def _swig():
    """(faiss's C module, its ``swig_ptr``), imported at first use: every online buffer has a
    ``Stack``, and one without dense rows never loads faiss (a cold CLI query; issue 38)."""
    global _SWIG
    if _SWIG is None:
        import faiss
        c = getattr(getattr(faiss, "swigfaiss", None), "_swigfaiss", faiss)
        _SWIG = (c, getattr(c, "swig_ptr", faiss.swig_ptr))
    return _SWIG


def stackable(covered) -> bool:
    """Are these buffer segments' dense indexes searched through their buffer's stack? (A
    stack holds only plain CPU ``Flat`` rows with every vector present, ``flat_rows``; the
    torch kernels, when asked for, search each segment instead.)"""
    from polyindex.cuda.device import torch_kernels
    return bool(covered) and not torch_kernels(covered[0].device)


def flat_rows(index) -> np.ndarray | None:
    """The (n, d) float32 storage of a segment's plain CPU ``Flat`` dense index (the rows it
    scores), else None (HNSW, IVF, PQ, a GPU index, an optional field with missing rows)."""
    if index is None or getattr(index, "presence", None) is not None or index.on_gpu:
        return None
    import faiss
    flat = faiss.downcast_index(index.index)
    if type(flat) not in (faiss.IndexFlat, faiss.IndexFlatIP, faiss.IndexFlatL2):
        return None
    if flat.metric_type not in (faiss.METRIC_INNER_PRODUCT, faiss.METRIC_L2):
        return None
    if not flat.ntotal:
        return np.zeros((0, flat.d), np.float32)
    return faiss.rev_swig_ptr(flat.get_xb(), flat.ntotal * flat.d).reshape(flat.ntotal, flat.d)


@dataclass(frozen=True, eq=False)  # compared by identity: it holds arrays
class StackView:
    """What a snapshot holds of a stack: ``segments`` buffer segments from its ordinal on,
    whose ``keys`` rows (buffer-relative keys: the first segment's row 0 is key 0) the
    matrix rows stand for (``rel``), and a graph over the first ``indexed`` rows."""
    segments: int
    keys: int
    matrix: np.ndarray
    rel: np.ndarray
    metric: int
    graph: object | None
    indexed: int


class Stack:
    """The vectors of the unnamed dense field over a buffer's segments."""

    def __init__(self, field: str = FIELD):
        self.field = field
        self._m: np.ndarray | None = None
        self._rel: np.ndarray | None = None
        self.rows = 0       # matrix rows
        self.keys = 0       # rows of the buffer's segments (the key space)
        self.segments = 0
        self.metric: int | None = None
        self.broken = False  # a segment that is not plain Flat: each is searched on its own
        self.graph = None   # published HNSW over the first ``indexed`` rows (never added to)
        self.indexed = 0
        self.building = None  # the indexer's own graph (index, rows) it keeps adding to
        self.broken_graph = False  # building it failed: exactly scanned until the seal

    def add(self, seg) -> None:
        """Append a segment's rows (called as the buffer adds the segment)."""
        if self.broken:
            return
        index = seg.indexes.get(self.field)
        x = flat_rows(index)
        metric = None if x is None else index.index.metric_type
        if x is None or (self.metric is not None and metric != self.metric) or (
                self._m is not None and x.shape[1] != self._m.shape[1]):
            self.broken, self._m, self._rel, self.graph = True, None, None, None
            return
        self.metric = metric
        need = self.rows + len(x)
        if self._m is None or need > len(self._m):
            cap = max(need, 2 * (0 if self._m is None else len(self._m)), 256)
            m, rel = np.empty((cap, x.shape[1]), np.float32), np.empty(cap, np.int64)
            if self.rows:
                m[:self.rows], rel[:self.rows] = self._m[:self.rows], self._rel[:self.rows]
            self._m, self._rel = m, rel  # views published before keep the old arrays
        self._m[self.rows:need] = x
        self._rel[self.rows:need] = np.arange(self.keys, self.keys + len(x))
        self.rows, self.keys = need, self.keys + len(x)
        self.segments += 1

    def remap(self, new_key: np.ndarray, keys: int) -> None:
        """The buffer merged its segments into one of ``keys`` rows: old key k is now
        ``new_key[k]`` (-1: not kept). Rows and graph stay; only their keys change."""
        if self.broken or self._rel is None:
            return
        rel = self._rel.copy()  # published views keep the old keys
        at = rel[:self.rows] >= 0
        rel[:self.rows][at] = new_key[rel[:self.rows][at]]
        self._rel, self.keys, self.segments = rel, keys, 1

    def matrix(self) -> np.ndarray | None:
        return None if self._m is None else self._m[:self.rows]

    def view(self) -> StackView | None:
        if self.broken or not self.segments or self._m is None:
            return None
        return StackView(self.segments, self.keys, self._m[:self.rows], self._rel[:self.rows],
                         self.metric, self.graph, self.indexed)


def cached_prepare(snapshot, i: int, view: StackView, segments, masks) -> "Prepared":
    """``prepare`` for the snapshot's stack at ordinal ``i`` with its own live masks, kept in
    the snapshot's cache: the online writer makes it as it publishes the snapshot, so the
    first query after a write does not."""
    cache = snapshot.cache.setdefault(FIELD, {})
    got = cache.get(("stack", i))
    if got is None or got.view is not view:
        got = cache[("stack", i)] = prepare(view, key_mask(segments, masks))
    return got


def key_mask(segments, masks) -> np.ndarray | None:
    """The buffer segments' allow masks as one mask over their keys (None: all allowed)."""
    if all(m is None for m in masks):
        return None
    return np.concatenate([np.ones(s.n_rows, bool) if m is None else m
                           for s, m in zip(segments, masks)])


def build_graph(stack: Stack, matrix: np.ndarray, upto: int):
    """The indexer's step (off the write path, GIL released by faiss): add rows up to
    ``upto`` to its own graph and return a copy to publish (published graphs are never
    added to: a query may be searching one)."""
    import faiss
    graph, done = stack.building or (None, 0)
    if graph is None:
        graph = faiss.IndexHNSWFlat(matrix.shape[1], GRAPH_M, stack.metric)
        graph.hnsw.efConstruction = GRAPH_EF_CONSTRUCTION
    if upto > done:
        graph.add(np.ascontiguousarray(matrix[done:upto]))
    stack.building = (graph, upto)
    return faiss.clone_index(graph)


class Prepared:
    """A stack view with one allow mask, ready to search: which rows are live, the bitmaps
    and selectors of the graph's rows and of the rest, and the graph's search parameters
    by efSearch (made per snapshot in the vector lane; per query under a filter). A query
    then costs its two faiss calls and a merge, ~0.1 ms over 5,000 rows, not 0.2."""

    __slots__ = ("view", "n", "m", "n_head", "head", "tail", "empty", "l2", "ef", "_params",
                 "_ptr_m")

    def __init__(self, view: StackView, allow: np.ndarray | None):
        self.view = view
        live = view.rel >= 0
        if allow is not None:
            live &= allow[np.maximum(view.rel, 0)]
        self.n = len(view.matrix)
        self.m = view.indexed if view.graph is not None else 0
        all_live = bool(live.all())
        self.empty = not all_live and not live.any()
        head, tail = live[:self.m], live[self.m:]
        self.n_head = self.m if all_live else int(np.count_nonzero(head))
        # (bits, selector) of the rows each part may return; None: all of them
        self.head = None if all_live or not self.m else _bitmap(head)
        self.tail = (None if all_live or self.m == self.n else
                     _bitmap(tail) if tail.any() else False)
        import faiss
        self.l2 = view.metric == faiss.METRIC_L2
        self.ef = view.graph.hnsw.efSearch if self.m else 0
        self._params: dict[int, object] = {}
        self._ptr_m = _swig()[1](view.matrix)

    def graph_params(self, ef: int):
        sp = self._params.get(ef)
        if sp is None:
            import faiss
            if self.head is not None:  # hidden rows: the budget over the allowed share
                sp = faiss.SearchParametersHNSW(
                    efSearch=max(ef, math.ceil(ef * self.m / self.n_head)), sel=self.head[1])
            else:
                sp = faiss.SearchParametersHNSW(efSearch=ef)
            if len(self._params) < 16:
                self._params[ef] = sp
        return sp


def prepare(view: StackView, allow: np.ndarray | None) -> Prepared:
    return Prepared(view, allow)


def search(prep: Prepared, x: np.ndarray, k: int,
           kwargs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(nq, k) higher-is-better scores and buffer-relative keys (-1 padded, -inf scores) of
    the stack's rows the prepared allow mask admits: the graph for its rows (exactly, when
    it holds few allowed ones or comes back short), an exact scan for the rest."""
    nq, m = len(x), prep.m
    x = np.ascontiguousarray(x, dtype=np.float32)
    parts = []
    if m and prep.n_head and not prep.empty:
        got = None
        if prep.n_head >= GRAPH_MIN_SHARE * m:
            # every HNSW search here explores at least k (``DenseSegment.at_least_k``)
            got = _graph(prep, x, k, max(int(kwargs.get("efSearch", prep.ef)), k))
            if got[1][:, min(k, prep.n_head) - 1].min() < 0:
                got = None  # short of hits: the exact scan answers
        parts.append(got or _exact(prep, x, k, 0, m, prep.head))
    if prep.n > m and prep.tail is not False and not prep.empty:
        parts.append(_exact(prep, x, k, m, prep.n, prep.tail))
    if not parts:
        return np.full((nq, k), -np.inf, np.float32), np.full((nq, k), -1, np.int64)
    scores, rows = parts[0]
    if len(parts) > 1:
        scores = np.concatenate([scores, parts[1][0]], axis=1)
        rows = np.concatenate([rows, parts[1][1]], axis=1)
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        scores, rows = np.take_along_axis(scores, top, 1), np.take_along_axis(rows, top, 1)
    rel = prep.view.rel
    if rows[:, -1].min() < 0:  # padding comes last
        return scores, np.where(rows >= 0, rel[np.maximum(rows, 0)], -1)
    return scores, rel[rows]


def _bitmap(mask: np.ndarray):
    import faiss
    bits = np.packbits(mask, bitorder="little")  # faiss's: bit j of byte j >> 3, low first
    return bits, faiss.IDSelectorBitmap(len(mask), _swig()[1](bits))


def _finish(d: np.ndarray, i: np.ndarray, negate: bool):
    if negate:
        d = -d
    if i[:, -1].min() < 0:  # padding comes last: -inf scores
        d = np.where(i >= 0, d, -np.inf).astype(np.float32)
    return d, i


def _exact(prep: Prepared, x, k, lo: int, hi: int, allowed):
    """Rows lo..hi scanned exactly by faiss's own flat kernel: a row's score is the same
    bits as in its segment's ``IndexFlat.search``."""
    nq, dim = x.shape
    d = np.empty((nq, k), np.float32)
    i = np.empty((nq, k), np.int64)
    sel = None if allowed is None else allowed[1]
    _C, _ptr = _swig()
    base = _ptr(prep.view.matrix[lo:hi]) if lo else prep._ptr_m  # contiguous rows
    if prep.l2:
        _C.knn_L2sqr(_ptr(x), base, dim, nq, hi - lo, k, _ptr(d), _ptr(i), None, sel)
    else:
        _C.knn_inner_product(_ptr(x), base, dim, nq, hi - lo, k, _ptr(d), _ptr(i), sel)
    if lo:
        i = np.where(i >= 0, i + lo, -1)
    return _finish(d, i, prep.l2)


def _graph(prep: Prepared, x, k, ef: int):
    """The graph's search with the prepared parameters (one faiss call, no wrapper)."""
    nq = len(x)
    d = np.empty((nq, k), np.float32)
    i = np.empty((nq, k), np.int64)
    _ptr = _swig()[1]
    prep.view.graph.search_c(nq, _ptr(x), k, _ptr(d), _ptr(i), prep.graph_params(ef))
    return _finish(d, i, prep.l2)
