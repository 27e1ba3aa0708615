"""Building the ``tree`` kind's concept hierarchy: Cobweb-style concept formation over vectors.

Every node is a concept: ``count``, per-dimension ``sum`` and ``sum of squares`` of its members
(so mean and variance per dimension). Internal nodes have 2..``branch`` children; leaves are
buckets of at most ``leaf`` documents (a linked list of rows). A document is inserted at the
root and walks down; at each internal node the category utility (CU) of four operators is
compared and the best applied (Fisher's COBWEB, CLASSIT for continuous attributes):

- **add** to the best host child (and continue in it),
- **new**: a new leaf child holding only this document (at a node with ``branch`` children
  the two closest children, by Ward's criterion, are merged first to make room),
- **merge** the two best hosts into one new child (and continue in it),
- **split** the best host: its children replace it (then decide again at the same node).

CU of a partition of node p into children k is the between-children variance per child,
``CU = sum_k P(k) * ||mean_k - mean_p||^2 / K``: the Gaussian CU with variance reduction in
place of CLASSIT's ``1/sigma`` (no acuity constant; the ``1/K`` is COBWEB's penalty on many
children). With ``q_k = ||sum_k||^2 / n_k`` it is ``(sum_k q_k - q_p) / (n_p K)``, so every
operator is scored from one dot product per child (``sum_k . x``) and cached ``||sum_k||^2``.

A bucket that overflows ``leaf`` is cut in two by 2-means: the halves become siblings when the
parent has room, else the bucket becomes an internal node over the two halves.

Bulk path (``TreeBuilder.bulk``): the top levels come from faiss k-means (k = branch,
recursively, until a group has at most ``group`` documents); each group is then grown by the
same incremental insertion, and the k-means nodes' statistics are summed bottom-up. The result
is the same kind of tree, and later documents are inserted into it the same way (``insert``).

The kernels work on preallocated arrays and return when spare node slots run low; the Python
class grows the arrays and calls again (numba cannot grow arrays in place).
"""
from __future__ import annotations

import numba as nb
import numpy as np

SPARE = 8  # node slots an insertion needs beyond one merge per level (bucket split, new child)
NONE = -1


# ---------------------------------------------------------------------------- kernels

@nb.njit(cache=True)
def _dot(a, x):
    acc = 0.0
    for i in range(x.shape[0]):
        acc += a[i] * x[i]
    return acc


@nb.njit(cache=True)
def _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, par):
    n = meta[0]
    meta[0] += 1
    parent[n] = par
    nch[n] = 0
    cnt[n] = 0
    s[n, :] = 0.0
    s2[n, :] = 0.0
    ss[n] = 0.0
    head[n] = NONE
    bsize[n] = 0
    alive[n] = True
    return n


@nb.njit(cache=True)
def _add_stats(n, x, cnt, s, s2, ss):
    """Add one vector to node n's statistics (``ss`` = ||sum||^2 kept exact incrementally)."""
    sx = 0.0
    xx = 0.0
    for i in range(x.shape[0]):
        v = np.float64(x[i])
        sx += s[n, i] * v
        xx += v * v
        s[n, i] += v
        s2[n, i] += v * v
    ss[n] += 2.0 * sx + xx
    cnt[n] += 1


@nb.njit(cache=True)
def _stats_from_members(n, X, members, cnt, s, s2, ss):
    cnt[n] = 0
    s[n, :] = 0.0
    s2[n, :] = 0.0
    ss[n] = 0.0
    for r in members:
        _add_stats(n, X[r], cnt, s, s2, ss)
    acc = 0.0  # recompute ||sum||^2 from scratch: no drift carried over
    for i in range(s.shape[1]):
        acc += s[n, i] * s[n, i]
    ss[n] = acc


@nb.njit(cache=True)
def _remove_child(p, c, child, nch):
    k = nch[p]
    for j in range(k):
        if child[p, j] == c:
            child[p, j] = child[p, k - 1]
            nch[p] = k - 1
            return


@nb.njit(cache=True)
def _members(n, head, nxt, bsize):
    out = np.empty(bsize[n], np.int64)
    r = head[n]
    for j in range(bsize[n]):
        out[j] = r
        r = nxt[r]
    return out


@nb.njit(cache=True)
def _two_means(X, members):
    """Split members in two by 2-means (farthest-point seeds); returns a boolean side array."""
    m = members.shape[0]
    d = X.shape[1]
    mean = np.zeros(d)
    for r in members:
        for i in range(d):
            mean[i] += X[r, i]
    mean /= m
    a = members[0]
    best = -1.0
    for r in members:
        dist = 0.0
        for i in range(d):
            t = X[r, i] - mean[i]
            dist += t * t
        if dist > best:
            best, a = dist, r
    b = members[0]
    best = -1.0
    for r in members:
        dist = 0.0
        for i in range(d):
            t = X[r, i] - X[a, i]
            dist += t * t
        if dist > best:
            best, b = dist, r
    ca = X[a].astype(np.float64)
    cb = X[b].astype(np.float64)
    side = np.zeros(m, np.bool_)
    for _ in range(8):
        na = 0
        for j in range(m):
            r = members[j]
            da = 0.0
            db = 0.0
            for i in range(d):
                t = X[r, i] - ca[i]
                da += t * t
                t = X[r, i] - cb[i]
                db += t * t
            side[j] = db < da
            na += 0 if side[j] else 1
        if na == 0 or na == m:
            break
        ca[:] = 0.0
        cb[:] = 0.0
        for j in range(m):
            if side[j]:
                cb += X[members[j]]
            else:
                ca += X[members[j]]
        ca /= na
        cb /= m - na
    na = 0
    for j in range(m):
        na += 0 if side[j] else 1
    if na == 0 or na == m:  # identical vectors: any even cut will do
        for j in range(m):
            side[j] = j % 2 == 1
    return side


@nb.njit(cache=True)
def _split_bucket(p, X, branch, meta, parent, child, nch, cnt, s, s2, ss, head, bsize, nxt,
                  leaf_of, alive):
    members = _members(p, head, nxt, bsize)
    side = _two_means(X, members)
    par = parent[p]
    if par != NONE and nch[par] < branch:  # room beside it: two sibling buckets
        a = p
        b = _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, par)
        child[par, nch[par]] = b
        nch[par] += 1
    else:  # push down: p becomes the parent of the two halves (its statistics stay)
        a = _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, p)
        b = _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, p)
        child[p, 0] = a
        child[p, 1] = b
        nch[p] = 2
    head[p] = NONE
    bsize[p] = 0
    ma = members[~side]
    mb = members[side]
    for node, group in ((a, ma), (b, mb)):
        head[node] = NONE
        bsize[node] = 0
        for r in group[::-1]:
            nxt[r] = head[node]
            head[node] = r
            leaf_of[r] = node
        bsize[node] = group.shape[0]
        _stats_from_members(node, X, group, cnt, s, s2, ss)


@nb.njit(cache=True)
def _merge(p, c1, c2, meta, parent, child, nch, cnt, s, s2, ss, head, bsize, alive):
    """Children c1 and c2 of p become the two children of a new child m of p; returns m."""
    m = _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, p)
    cnt[m] = cnt[c1] + cnt[c2]
    for i in range(s.shape[1]):
        s[m, i] = s[c1, i] + s[c2, i]
        s2[m, i] = s2[c1, i] + s2[c2, i]
    ss[m] = ss[c1] + ss[c2] + 2.0 * _dot(s[c1], s[c2])
    child[m, 0] = c1
    child[m, 1] = c2
    nch[m] = 2
    parent[c1] = m
    parent[c2] = m
    _remove_child(p, c2, child, nch)
    for j in range(nch[p]):
        if child[p, j] == c1:
            child[p, j] = m
    return m


@nb.njit(cache=True)
def _closest_pair(p, child, nch, cnt, s, ss):
    """The two children of p whose merge loses the least between-children variance (Ward:
    ``n_a n_b / (n_a + n_b) * ||mean_a - mean_b||^2``)."""
    k = nch[p]
    best = np.inf
    ba = child[p, 0]
    bb = child[p, 1]
    for i in range(k):
        a = child[p, i]
        na = np.float64(cnt[a])
        for j in range(i + 1, k):
            b = child[p, j]
            nb_ = np.float64(cnt[b])
            dist = ss[a] / (na * na) + ss[b] / (nb_ * nb_) - 2.0 * _dot(s[a], s[b]) / (na * nb_)
            cost = na * nb_ / (na + nb_) * dist
            if cost < best:
                best, ba, bb = cost, a, b
    return ba, bb


@nb.njit(cache=True)
def _insert_one(r, root, X, branch, leaf, meta, parent, child, nch, cnt, s, s2, ss, head, bsize,
                nxt, leaf_of, alive, dots, ops):
    x = X[r]
    xx = 0.0
    for i in range(x.shape[0]):
        xx += np.float64(x[i]) * x[i]
    p = root
    _add_stats(p, x, cnt, s, s2, ss)
    split_done = False
    levels = 0
    while True:
        levels += 1
        meta[1] = max(meta[1], levels)  # deepest walk so far (bounds the slots needed)
        k = nch[p]
        if k == 0:  # a leaf bucket: the document lands here
            nxt[r] = head[p]
            head[p] = r
            bsize[p] += 1
            leaf_of[r] = p
            if bsize[p] > leaf:
                _split_bucket(p, X, branch, meta, parent, child, nch, cnt, s, s2, ss, head,
                              bsize, nxt, leaf_of, alive)
            return
        n1 = np.float64(cnt[p])
        qp = ss[p] / n1
        q_all = 0.0
        g1 = -np.inf
        g2 = -np.inf
        j1 = -1
        j2 = -1
        for j in range(k):
            c = child[p, j]
            dj = _dot(s[c], x)
            dots[j] = dj
            qc = ss[c] / cnt[c]
            q_all += qc
            gain = (ss[c] + 2.0 * dj + xx) / (cnt[c] + 1) - qc
            if gain > g1:
                g2, j2 = g1, j1
                g1, j1 = gain, j
            elif gain > g2:
                g2, j2 = gain, j
        c1 = child[p, j1]
        best = (q_all + g1 - qp) / (n1 * k)
        op = 0  # add
        # new child; at a full node scored as if there were room, which is then made by
        # merging the two closest children (_closest_pair)
        cu = (q_all + xx - qp) / (n1 * (k + 1))
        if cu > best:
            best, op = cu, 1
        if k >= 3:
            c2 = child[p, j2]
            ss_m = ss[c1] + ss[c2] + 2.0 * _dot(s[c1], s[c2]) + xx + 2.0 * dots[j1] + 2.0 * dots[j2]
            q_m = ss_m / (cnt[c1] + cnt[c2] + 1)
            cu = (q_all - ss[c1] / cnt[c1] - ss[c2] / cnt[c2] + q_m - qp) / (n1 * (k - 1))
            if cu > best:
                best, op = cu, 2
        kc = nch[c1]
        if kc > 0 and not split_done and k - 1 + kc <= branch:
            q_s = q_all - ss[c1] / cnt[c1]
            g = g2 if j2 >= 0 else -np.inf
            for j in range(kc):
                gc = child[c1, j]
                qc = ss[gc] / cnt[gc]
                q_s += qc
                gain = (ss[gc] + 2.0 * _dot(s[gc], x) + xx) / (cnt[gc] + 1) - qc
                g = max(g, gain)
            cu = (q_s + g - qp) / (n1 * (k - 1 + kc))
            if cu > best:
                best, op = cu, 3
        ops[op] += 1
        if op == 0:
            p = c1
            _add_stats(p, x, cnt, s, s2, ss)
            split_done = False
        elif op == 1:
            if k == branch:  # full: make room by merging the two closest children
                a, b = _closest_pair(p, child, nch, cnt, s, ss)
                _merge(p, a, b, meta, parent, child, nch, cnt, s, s2, ss, head, bsize, alive)
            n = _new_node(meta, parent, nch, cnt, s, s2, ss, head, bsize, alive, p)
            child[p, nch[p]] = n
            nch[p] += 1
            _add_stats(n, x, cnt, s, s2, ss)
            nxt[r] = NONE
            head[n] = r
            bsize[n] = 1
            leaf_of[r] = n
            return
        elif op == 2:
            p = _merge(p, c1, child[p, j2], meta, parent, child, nch, cnt, s, s2, ss, head,
                       bsize, alive)
            _add_stats(p, x, cnt, s, s2, ss)
            split_done = False
        else:  # split: c1's children take its place; decide again here
            _remove_child(p, c1, child, nch)
            for j in range(kc):
                gc = child[c1, j]
                child[p, nch[p]] = gc
                nch[p] += 1
                parent[gc] = p
            alive[c1] = False
            nch[c1] = 0
            split_done = True


@nb.njit(cache=True)
def spare_slots(meta):
    """Free node slots required before an insertion: a merge may create one node per level
    walked (the walk is at most two levels deeper than the deepest so far), plus a bucket
    split or a new child."""
    return 2 * (meta[1] + 2) + SPARE


@nb.njit(cache=True)
def insert_rows(rows, start, roots, X, branch, leaf, meta, parent, child, nch, cnt, s, s2, ss,
                head, bsize, nxt, leaf_of, alive, ops):
    """Insert ``rows[start:]`` (row r under ``roots[r]``) until done or spare slots run low;
    returns the position reached."""
    dots = np.empty(branch + 1)
    cap = parent.shape[0]
    i = start
    while i < rows.shape[0]:
        if meta[0] + spare_slots(meta) > cap:
            return i
        r = rows[i]
        _insert_one(r, roots[i], X, branch, leaf, meta, parent, child, nch, cnt, s, s2, ss,
                    head, bsize, nxt, leaf_of, alive, dots, ops)
        i += 1
    return i


@nb.njit(cache=True)
def _layout(root, n_rows, child, nch, head, nxt, alive):
    """Breadth-first node numbering (children contiguous) and depth-first document order (a
    subtree's documents contiguous). Returns (bfs order of old ids, doc order, doc start/end
    per old id)."""
    cap = nch.shape[0]
    order = np.empty(cap, np.int64)
    order[0] = root
    n = 1
    i = 0
    while i < n:
        u = order[i]
        for j in range(nch[u]):
            order[n] = child[u, j]
            n += 1
        i += 1
    order = order[:n]
    docs = np.empty(n_rows, np.int64)
    start = np.zeros(cap, np.int64)
    end = np.zeros(cap, np.int64)
    stack = np.empty(cap, np.int64)
    state = np.zeros(cap, np.int64)
    top = 0
    stack[0] = root
    pos = 0
    while top >= 0:
        u = stack[top]
        if state[u] == 0:
            start[u] = pos
            state[u] = 1
            if nch[u] == 0:
                r = head[u]
                while r != NONE:
                    docs[pos] = r
                    pos += 1
                    r = nxt[r]
            else:
                for j in range(nch[u] - 1, -1, -1):
                    top += 1
                    stack[top] = child[u, j]
                continue
        end[u] = pos
        top -= 1
    return order, docs[:pos], start, end


# ----------------------------------------------------------------------------- builder

class TreeBuilder:
    """A growable tree over the rows of ``X`` (float32, (n, d)); ``insert`` and ``bulk`` add
    rows, ``finish`` lays the tree out as flat arrays (``TreeArrays``) for storage."""

    def __init__(self, X: np.ndarray, branch: int, leaf: int, capacity: int = 64):
        if branch < 2 or leaf < 1:
            raise ValueError(f"branch must be >= 2 and leaf >= 1, got {branch}, {leaf}")
        self.X = np.ascontiguousarray(X, dtype=np.float32)
        self.branch, self.leaf = branch, leaf
        n, d = self.X.shape
        cap = max(capacity, SPARE * 2)
        self.meta = np.zeros(2, np.int64)  # nodes used, deepest insertion walk
        self.parent = np.full(cap, NONE, np.int64)
        self.child = np.full((cap, branch), NONE, np.int64)
        self.nch = np.zeros(cap, np.int64)
        self.cnt = np.zeros(cap, np.int64)
        self.s = np.zeros((cap, d))
        self.s2 = np.zeros((cap, d))
        self.ss = np.zeros(cap)
        self.head = np.full(cap, NONE, np.int64)
        self.bsize = np.zeros(cap, np.int64)
        self.alive = np.zeros(cap, np.bool_)
        self.nxt = np.full(n, NONE, np.int64)
        self.leaf_of = np.full(n, NONE, np.int64)
        self.ops = np.zeros(4, np.int64)  # add, new, merge, split: how often each was chosen
        self.root = self._node(NONE)

    # -- arrays ----------------------------------------------------------------------------
    def _grow(self, need: int) -> None:
        cap = len(self.parent)
        if self.meta[0] + need <= cap:
            return
        new = max(cap * 2, int(self.meta[0]) + need)
        for name, fill in (("parent", NONE), ("child", NONE), ("nch", 0), ("cnt", 0),
                           ("s", 0.0), ("s2", 0.0), ("ss", 0.0), ("head", NONE),
                           ("bsize", 0), ("alive", False)):
            old = getattr(self, name)
            arr = np.full((new,) + old.shape[1:], fill, old.dtype)
            arr[:cap] = old
            setattr(self, name, arr)

    def _node(self, par: int) -> int:
        self._grow(1)
        return int(_new_node(self.meta, self.parent, self.nch, self.cnt, self.s, self.s2,
                             self.ss, self.head, self.bsize, self.alive, par))

    def _args(self):
        return (self.meta, self.parent, self.child, self.nch, self.cnt, self.s, self.s2,
                self.ss, self.head, self.bsize, self.nxt, self.leaf_of, self.alive)

    # -- insertion -------------------------------------------------------------------------
    def insert(self, rows, roots=None) -> None:
        """Insert rows one at a time (Cobweb), each at the root or at ``roots[i]``."""
        rows = np.asarray(rows, np.int64)
        roots = np.full(len(rows), self.root, np.int64) if roots is None else \
            np.asarray(roots, np.int64)
        pos = 0
        while pos < len(rows):
            self._grow(int(spare_slots(self.meta)) * 2 + (len(rows) - pos) // 8)
            pos = insert_rows(rows, pos, roots, self.X, self.branch, self.leaf,
                              *self._args(), self.ops)

    def bulk(self, rows, group: int, seed: int = 0) -> None:
        """Top levels by recursive k-means (k = branch), then Cobweb insertion per group."""
        import faiss
        rows = np.asarray(rows, np.int64)
        groups: list[tuple[int, np.ndarray]] = []
        todo = [(self.root, rows)]
        while todo:
            node, members = todo.pop()
            if len(members) <= group:
                groups.append((node, members))
                continue
            k = self.branch
            km = faiss.Kmeans(self.X.shape[1], k, niter=10, seed=seed + node,
                              max_points_per_centroid=256)
            rng = np.random.default_rng(seed + node)  # train on a sample (faiss would too)
            sample = members if len(members) <= 256 * k else \
                np.sort(rng.choice(members, 256 * k, replace=False))
            km.train(self.X[sample])
            assign = np.concatenate([km.index.search(self.X[members[i:i + 65536]], 1)[1][:, 0]
                                     for i in range(0, len(members), 65536)])
            parts = [members[assign == c] for c in range(k)]
            parts = [p for p in parts if len(p)]
            if len(parts) < 2:  # k-means found no structure: grow this group incrementally
                groups.append((node, members))
                continue
            for part in parts:
                c = self._node(node)
                self.child[node, self.nch[node]] = c
                self.nch[node] += 1
                todo.append((c, part))
        order = np.concatenate([m for _, m in groups]) if groups else np.zeros(0, np.int64)
        roots = np.concatenate([np.full(len(m), g, np.int64) for g, m in groups]) \
            if groups else np.zeros(0, np.int64)
        self.insert(order, roots)
        self._sum_up(self.root)

    def _sum_up(self, node: int) -> None:
        """Statistics of internal nodes as the sum of their children (bulk levels)."""
        post, stack = [], [node]
        while stack:
            u = stack.pop()
            post.append(u)
            stack.extend(self.child[u, :self.nch[u]].tolist())
        for u in reversed(post):
            k = self.nch[u]
            if k:
                kids = self.child[u, :k]
                self.cnt[u] = self.cnt[kids].sum()
                self.s[u] = self.s[kids].sum(0)
                self.s2[u] = self.s2[kids].sum(0)
                self.ss[u] = float(self.s[u] @ self.s[u])

    # -- output ----------------------------------------------------------------------------
    def finish(self) -> TreeArrays:
        order, docs, start, end = _layout(self.root, len(self.X), self.child, self.nch,
                                          self.head, self.nxt, self.alive)
        new_id = np.full(len(self.parent), NONE, np.int64)
        new_id[order] = np.arange(len(order))
        nch = self.nch[order]
        child_start = np.zeros(len(order), np.int64)
        if len(order) > 1:  # BFS: the children of node i follow those of node i - 1
            child_start[:] = 1 + np.concatenate([[0], np.cumsum(nch)[:-1]])
        parent = np.where(self.parent[order] >= 0, new_id[np.maximum(self.parent[order], 0)], -1)
        cnt = self.cnt[order]
        safe = np.maximum(cnt, 1)[:, None]
        mean = self.s[order] / safe
        var = np.maximum(self.s2[order] / safe - mean * mean, 0.0)
        leaf_of = new_id[self.leaf_of]
        return TreeArrays(parent.astype(np.int32), child_start.astype(np.int32),
                          nch.astype(np.int32), start[order], end[order], cnt,
                          mean.astype(np.float32), var.astype(np.float32),
                          docs.astype(np.int32), leaf_of.astype(np.int32))


class TreeArrays:
    """A finished tree, flat: nodes in breadth-first order (node 0 is the root, the children of
    node i are ``child_start[i] .. child_start[i] + n_child[i] - 1``), documents in depth-first
    order (``docs[doc_start[i]:doc_end[i]]`` are the rows under node i)."""

    def __init__(self, parent, child_start, n_child, doc_start, doc_end, count, mean, var,
                 docs, leaf_of):
        self.parent, self.child_start, self.n_child = parent, child_start, n_child
        self.doc_start, self.doc_end, self.count = doc_start, doc_end, count
        self.mean, self.var, self.docs, self.leaf_of = mean, var, docs, leaf_of

    @property
    def n_nodes(self) -> int:
        return len(self.parent)

    def depth(self) -> np.ndarray:
        out = np.zeros(self.n_nodes, np.int32)
        for i in range(1, self.n_nodes):  # parents come before children (BFS)
            out[i] = out[self.parent[i]] + 1
        return out
