"""The tree kind: Cobweb insertion keeps the tree's invariants (incremental and bulk), an
unlimited budget gives the exact ranking of each scoring rule, a saved tree reloads identically,
labels, factory strings, and the kind end to end in a collection (profiles, explain, deletes)."""
import numpy as np
import pytest
from topic_docs import TOPIC_DOCS as DOCS

import polyindex
from polyindex import InvalidArgument
from polyindex.index.protocol import BuildBatch, Query
from polyindex.index.registry import from_factory
from polyindex.index.tree.kind import TreeKind, effective_variance
from polyindex.index.tree.build import TreeBuilder
from polyindex.storage.segment import Segment, write_docs
from polyindex.types import Document


def clustered(n, d=16, centres=12, spread=0.25, seed=0):
    rng = np.random.default_rng(seed)
    c = rng.standard_normal((centres, d))
    x = c[rng.integers(centres, size=n)] + spread * rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x.astype(np.float32)


def check_invariants(b: TreeBuilder, n_inserted: int):
    """Every reachable node's count, sum and sum of squares equal its members'; branching and
    leaf sizes are bounded; every inserted row is in exactly one leaf."""
    X = b.X.astype(np.float64)
    seen = np.zeros(len(X), int)
    stack = [(b.root, -1)]
    while stack:
        u, par = stack.pop()
        assert b.alive[u] and b.parent[u] == par
        k = b.nch[u]
        if k:
            assert 2 <= k <= b.branch or (u == b.root and k >= 1)
            stack.extend((int(c), u) for c in b.child[u, :k])
        else:
            assert 1 <= b.bsize[u] <= b.leaf or (u == b.root and b.cnt[u] == 0)
    for u in np.flatnonzero(b.alive[:b.meta[0]]):
        if not _reachable(b, u):
            continue
        rows = _members_under(b, u)
        assert b.cnt[u] == len(rows)
        if b.nch[u] == 0:
            for r in rows:
                assert b.leaf_of[r] == u
            seen[rows] += 1
        np.testing.assert_allclose(b.s[u], X[rows].sum(0), atol=1e-8)
        np.testing.assert_allclose(b.s2[u], (X[rows] ** 2).sum(0), atol=1e-8)
        assert np.isclose(b.ss[u], b.s[u] @ b.s[u], rtol=1e-9, atol=1e-9)
    assert seen.sum() == n_inserted and seen.max() == 1


def _reachable(b, u):
    while u != b.root:
        u = b.parent[u]
        if u < 0:
            return False
    return True


def _members_under(b, u):
    if b.nch[u] == 0:
        out, r = [], b.head[u]
        while r >= 0:
            out.append(r)
            r = b.nxt[r]
        return np.array(out, int)
    return np.concatenate([_members_under(b, c) for c in b.child[u, :b.nch[u]]])


@pytest.mark.parametrize("branch,leaf", [(4, 8), (3, 1), (16, 32)])
def test_incremental_insertion_keeps_invariants(branch, leaf):
    x = clustered(700, seed=branch)
    b = TreeBuilder(x, branch, leaf, capacity=16)  # small: the arrays grow during insertion
    for lo, hi in ((0, 1), (1, 300), (300, 700)):
        b.insert(np.arange(lo, hi))
        check_invariants(b, hi)
    assert b.ops[0] > 0 and b.ops[1] > 0  # add and new were chosen
    if branch >= 4:
        assert b.ops[2] + b.ops[3] > 0  # merge or split happened too
    t = b.finish()
    # laid out: every node's documents are one range, count = range length, mean/var of it
    assert t.n_nodes == int(_count_reachable(b))
    assert np.array_equal(np.sort(t.docs), np.arange(700))
    for i in range(t.n_nodes):
        rows = t.docs[t.doc_start[i]:t.doc_end[i]]
        assert len(rows) == t.count[i]
        np.testing.assert_allclose(t.mean[i], x[rows].astype(np.float64).mean(0), atol=1e-5)
        np.testing.assert_allclose(t.var[i], x[rows].astype(np.float64).var(0), atol=1e-5)
        kids = np.arange(t.child_start[i], t.child_start[i] + t.n_child[i])
        assert (t.parent[kids] == i).all()
        if t.n_child[i] == 0:
            assert (t.leaf_of[rows] == i).all()


def _count_reachable(b):
    n, stack = 0, [b.root]
    while stack:
        u = stack.pop()
        n += 1
        stack.extend(b.child[u, :b.nch[u]].tolist())
    return n


def test_bulk_build_then_later_insertions():
    x = clustered(2000, seed=3)
    b = TreeBuilder(x, 8, 16)
    b.bulk(np.arange(1500), group=200, seed=1)  # k-means top levels, Cobweb below
    check_invariants(b, 1500)
    assert b.nch[b.root] > 1
    b.insert(np.arange(1500, 2000))  # documents added later: incremental, no rebuild
    check_invariants(b, 2000)


def segment(tmp_path, x, factory, texts=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    n = len(x)
    texts = texts or [""] * n
    docs = [Document(str(i), "", texts[i], {}) for i in range(n)]
    write_docs(tmp_path, docs, {}, x)
    kind = from_factory(factory)
    info = kind.build(BuildBatch([d.id for d in docs], [""] * n, texts, x), tmp_path)
    return kind, kind.open(tmp_path, info, Segment(tmp_path, "s", n)), info


def reference_path_scores(seg, q, temp):
    """Path scores by the definition, in numpy (dot similarity)."""
    x = seg.embeddings().astype(np.float64)
    sims = seg.mean.astype(np.float64) @ q + temp * np.log(seg.count)  # with the count prior
    lse = lambda v: v.max() + temp * np.log(np.exp((v - v.max()) / temp).sum())
    out = np.empty(seg.n_rows)
    for r in range(seg.n_rows):
        path, total = seg.path(r), 0.0
        for c in path[1:]:
            p = seg.parent[c]
            kids = np.arange(seg.child_start[p], seg.child_start[p] + seg.n_child[p])
            total += sims[c] - lse(sims[kids])
        leaf = path[-1]
        mates = seg.docs[seg.doc_start[leaf]:seg.doc_end[leaf]]
        out[r] = total + x[r] @ q - lse(x[mates] @ q)
    return out


@pytest.mark.parametrize("sim", ["dot", "cos", "gauss"])
def test_unlimited_budget_is_exact(tmp_path, sim):
    x, q = clustered(900, seed=5), clustered(6, seed=6)
    kind, seg, info = segment(tmp_path, x, f"tree:branch=5,leaf=12,sim={sim}")
    assert info["n_nodes"] > 20 and info["depth"] >= 2
    allow = np.random.default_rng(1).random(900) < 0.6
    for rank in ("best", "path"):
        prep = kind.prepare([Query(vector=v) for v in q], [seg], [None],
                            {"budget": "0", "rank": rank}, {})
        # the scoring rule, row by row: score() is always the path score (the kind's signal)
        every = (seg.score if rank == "path" else seg.similarity)(prep, np.arange(900))
        assert np.isfinite(every).all()
        for a in (None, allow):
            s, r = seg.search(prep, 50, {}, a)
            for qi in range(len(q)):
                ok = np.arange(900) if a is None else np.flatnonzero(a)
                want = ok[np.argsort(-every[qi, ok], kind="stable")][:50]
                assert np.array_equal(r[qi], want)
                np.testing.assert_array_equal(s[qi], every[qi, want])
        if rank == "best" and sim == "dot":  # best-first with no budget is flat search
            np.testing.assert_allclose(every, q @ x.T, atol=1e-5)
        if rank == "path" and sim == "dot":
            for qi in range(len(q)):
                np.testing.assert_allclose(every[qi], reference_path_scores(seg, q[qi], prep.temp),
                                           atol=1e-4)
    # path rank is exact with early termination: the top 10 without opening every node
    prep = kind.prepare([Query(vector=v) for v in q], [seg], [None], {"budget": "0",
                                                                      "rank": "path"}, {})
    s, r = seg.search(prep, 10, {}, None)
    every = seg.score(prep, np.arange(900))
    assert np.array_equal(r, np.argsort(-every, axis=1, kind="stable")[:, :10])
    assert (prep.expanded < info["n_nodes"]).all()


def test_budget_bounds_work_and_recall_grows(tmp_path):
    x, q = clustered(3000, seed=7), clustered(20, seed=8)
    kind, seg, _ = segment(tmp_path, x, "tree:branch=8,leaf=16")
    truth = np.argsort(-(q @ x.T), axis=1)[:, :10]
    recalls = []
    for budget in (1, 4, 16, 64, 0):
        prep = kind.prepare([Query(vector=v) for v in q], [seg], [None], {"budget": str(budget)}, {})
        _, r = seg.search(prep, 10, {}, None)
        assert (r >= 0).all()  # past the budget only as far as needed to hold k documents
        if budget:  # a budget is overrun only when it opened fewer than k documents' leaves
            assert (prep.expanded <= max(budget, 30)).all()
            assert budget < 64 or (prep.expanded <= budget).all()
        recalls.append(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(r, truth)]))
    assert recalls == sorted(recalls) and recalls[-1] == 1.0 and recalls[0] < 1.0


def test_saved_tree_reloads_identically(tmp_path):
    x, q = clustered(1200, seed=9), clustered(5, seed=10)
    kind, seg, info = segment(tmp_path, x, "tree:branch=6,leaf=10,group=300")
    again = TreeKind(kind.body).open(tmp_path, info, Segment(tmp_path, "s", len(x)))
    for name in ("parent", "child_start", "n_child", "doc_start", "doc_end", "count", "docs",
                 "leaf_of", "mean", "var"):
        assert np.array_equal(getattr(seg, name), getattr(again, name)), name
    assert seg.labels.equals(again.labels)
    for params in ({}, {"rank": "path"}, {"sim": "gauss", "budget": "8"}):
        p1 = kind.prepare([Query(vector=v) for v in q], [seg], [None], params, {})
        p2 = kind.prepare([Query(vector=v) for v in q], [again], [None], params, {})
        s1, r1 = seg.search(p1, 20, {}, None)
        s2, r2 = again.search(p2, 20, {}, None)
        assert np.array_equal(r1, r2) and np.array_equal(s1, s2)
    # the same tree again from the same vectors (the build is deterministic)
    _, seg2, _ = segment(tmp_path / "b", x, "tree:branch=6,leaf=10,group=300")
    assert np.array_equal(seg.mean, seg2.mean) and np.array_equal(seg.docs, seg2.docs)


def test_labels_name_the_concepts(tmp_path):
    rng = np.random.default_rng(11)
    d = 16
    x = np.zeros((80, d), np.float32)
    x[:40, 0], x[40:, 1] = 1.0, 1.0
    x += 0.05 * rng.standard_normal(x.shape).astype(np.float32)
    filler = ["the", "report", "describes", "results", "of", "the", "study"]
    texts = [" ".join(["chocolate", "cakes", rng.choice(filler)]) for _ in range(40)] + \
            [" ".join(["wing", "flutter", rng.choice(filler)]) for _ in range(40)]
    _, seg, _ = segment(tmp_path, x, "tree:branch=2,leaf=8", texts)
    kids = [seg.labels[i].as_py() for i in range(1, 1 + seg.n_child[0])]
    joined = " | ".join(kids)
    assert "chocolate" in joined and "flutter" in joined, joined
    assert all(("chocolate" in k) != ("flutter" in k) for k in kids)
    assert "cake" in joined  # surface words for stems ("cake" is the shortest word for it)


def test_effective_variance_shrinks_toward_parent():
    var = np.array([[1.0, 1.0], [0.0, 0.0], [0.5, 0.5]], np.float32)
    v = effective_variance(var, np.array([10, 1, 100]), np.array([-1, 0, 0]))
    assert (v[1] > 0.7).all() and (v[2] < 0.55).all() and (v > 0).all()


def test_factory_and_params():
    kind = from_factory("tree:branch=16,leaf=64")
    assert isinstance(kind, TreeKind) and kind.describe() == "tree:branch=16,leaf=64"
    text = "tree:branch=4,leaf=2,group=0,sim=gauss,rank=path,budget=0,temp=0.2"
    assert from_factory(text).describe() == text
    assert from_factory("tree").describe() == "tree:branch=16,leaf=64"
    for bad in ("tree:branch=1", "tree:branch=300", "tree:leaf=0", "tree:sim=l2",
                "tree:rank=x", "tree:budget=-1", "tree:temp=0", "tree:foo=1", "tree:leaf=x"):
        with pytest.raises(InvalidArgument):
            from_factory(bad)
    for bad in ({"budget": "x"}, {"rank": "flat"}, {"nprobe": "3"}, {"temp": "-2"}):
        with pytest.raises(InvalidArgument):
            kind.search_config(bad)
    with pytest.raises(InvalidArgument):
        kind.build(BuildBatch(["a"], [""], [""], None), ".")


def test_end_to_end_collection(tmp_path, corpus):
    eng = polyindex.open(tmp_path)
    coll = eng.create_collection("t", ["lexical", "dense", "tree:branch=4,leaf=4"])
    filler = corpus.make(tmp_path / "filler.jsonl", 60, seed=1, dup_frac=0.0, words=12)
    coll.add(filler + DOCS[:3])
    coll.add(DOCS[3:])  # documents added later: a new segment with its own tree
    assert {"tree", "hybrid-tree"} <= set(coll.profiles())
    exact = coll.query("chocolate cake with butter", profile={"retrieve": [
        {"index": "tree", "k": 5, "params": "budget=0"}]}, k=5)
    flat = coll.query("chocolate cake with butter", profile="dense", k=5)
    assert [h.id for h in exact] == [h.id for h in flat]
    hits = coll.query("chocolate cake with butter", profile="tree", k=3, explain=True)
    assert hits[0].id == "cake"
    tree = hits[0].explain["index"]["tree"]
    assert tree["path"][0]["node"] == 0 and len(tree["path"]) >= 2
    assert all(isinstance(n["label"], str) for n in tree["path"])
    assert tree["path"][-1]["label"] and tree["path"][-1]["docs"] <= 4  # the leaf, labelled
    mixed = coll.query("chocolate cake with butter", profile="hybrid-tree", k=3, explain=True)
    assert mixed[0].id == "cake" and "tree" in mixed[0].explain["index"]
    # path-sum: a hit's score is its path score, as explain recomputes it from the path
    path_hits = coll.query("chess opening", k=3, explain=True, profile={"retrieve": [
        {"index": "tree", "k": 3, "params": "rank=path"}]})
    for h in path_hits:
        assert np.isclose(h.score, h.explain["index"]["tree"]["path_score"], atol=1e-5)
        assert h.score <= 0  # a log-probability
    coll.delete(["cake"])
    assert "cake" not in [h.id for h in coll.query("chocolate cake", profile="tree", k=5)]
    again = polyindex.open(tmp_path, readonly=True).collection("t")
    assert [h.id for h in again.query("striker goal", profile="tree", k=4)] == \
        [h.id for h in coll.query("striker goal", profile="tree", k=4)]


def _cosine_top(coll, text, k=5):
    """Reference: the k live documents of highest cosine with the query, from the stored
    embeddings (the tree's `sim=cos`; dense's inner product differs by the bfloat16 norms)."""
    q = np.asarray(coll.encoder.encode([text])[0], np.float64)
    snap = coll.view()
    scored = []
    for seg, live in zip(snap.segments, snap.live):
        x = seg.docs.embeddings().astype(np.float64)
        cos = x @ q / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))
        ids = seg.docs.ids
        for row in range(len(x)):
            if live is None or live[row]:
                scored.append((-cos[row], ids[row]))
    return [i for _, i in sorted(scored)[:k]]


def test_online_buffer_segments_grow_their_own_trees(tmp_path):
    """Online writes: each acknowledged batch is a buffer segment with its own tree (built by
    incremental insertion); sealing builds the sealed segment's tree; results survive a reopen."""
    with polyindex.open(tmp_path) as setup:
        setup.create_collection("o", ["dense", "tree:branch=4,leaf=4"])
    eng = polyindex.open(tmp_path, online=True)
    coll = eng.collection("o")
    docs = [{"_id": f"d{i}", "title": "", "text": f"note {i} on subject {i % 7}"} for i in range(30)]
    coll.add(docs[:12])
    coll.add(docs[12:])
    exact = {"retrieve": [{"index": "tree", "k": 5, "params": "budget=0"}]}
    before = [h.id for h in coll.query("subject 3", profile=exact, k=5)]
    assert len(coll.view().segments) == 2  # two buffer segments, each with its own tree
    assert before == _cosine_top(coll, "subject 3")
    coll.seal()
    after = [h.id for h in coll.query("subject 3", profile=exact, k=5)]
    eng.close()
    with polyindex.open(tmp_path) as reopened:
        again = [h.id for h in reopened.collection("o").query("subject 3", profile=exact, k=5)]
    assert after == before == again
