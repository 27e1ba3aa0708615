"""Segmentation independence (issue 17 part 6): the same documents as one segment or as several,
with tombstones (deleted and re-upserted ids), give the same top-k ids and scores for dense,
sparse, multivector and tree (lexical: tests/test_lexical.py::test_segmentation_independence).

Kind-level tests run the real ``pipeline.retrieve`` over a stand-in snapshot; the knobs that
used to be per segment (sparse ``rescore``, multivector ``ndocs``, tree ``budget``) are set
small enough that a per-segment budget would change the answer, which each test checks too.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
from test_multivector import clustered_tokens

import polyindex
from polyindex.index.protocol import BuildBatch, Query, merge_segments
from polyindex.index.registry import from_factory
from polyindex.query import pipeline
from polyindex.storage.segment import Segment, write_docs
from polyindex.types import Document

N, UPSERTS = 240, 30  # rows N..N+UPSERTS-1 are new versions of ids 10..39
CUTS = [0, 60, 150, 240, N + UPSERTS]  # three "add() calls" of the originals + the re-upserts
K = 10


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered(n, d=32, seed=0, topics=10):
    rng = np.random.default_rng(seed)
    centres = unit(rng.standard_normal((topics, d)))
    return unit(centres[rng.integers(topics, size=n)] + 0.4 * rng.standard_normal((n, d)))


def live_mask(seed=3):
    """Re-upserted ids' old rows and 25 random others are dead."""
    live = np.ones(N + UPSERTS, bool)
    live[10:10 + UPSERTS] = False
    live[np.random.default_rng(seed).choice(N, 25, replace=False)] = False
    return live


def layouts(kind, tmp_path, x=None, tokens=None):
    """(one segment, several segments) of the same rows, each as (segment indexes, live)."""
    n = len(x) if x is not None else len(tokens)
    live = live_mask()
    out = []
    for name, cuts in (("one", [0, n]), ("many", CUTS)):
        segs, masks = [], []
        for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
            folder = tmp_path / f"{name}{i}"
            folder.mkdir(parents=True)
            ids = [str(r) for r in range(a, b)]
            emb = None if x is None else x[a:b]
            if emb is not None:
                write_docs(folder, [Document(d, "", "t", {}) for d in ids], {}, emb)
            batch = BuildBatch(ids, [""] * (b - a), ["t"] * (b - a), emb,
                               None if tokens is None else tokens[a:b])
            info = kind.build(batch, folder)
            segs.append(kind.open(folder, info, Segment(folder, "s", b - a) if emb is not None
                                  else None))
            masks.append(live[a:b])
        out.append((segs, masks))
    return out


def retrieve(kind, segs, live, queries, params, k=K):
    """The pipeline's retrieve stage over a stand-in snapshot of ``segs``."""
    snap = SimpleNamespace(
        kinds={"x": kind}, segments=[SimpleNamespace(indexes={"x": s}) for s in segs],
        live=live, cache={"x": {}},
        bases=np.concatenate([[0], np.cumsum([s.n_rows for s in segs])]).astype(np.int64),
        ids_of=lambda keys: [str(int(k)) for k in keys],  # row r is document "r" (layouts)
        id_array=lambda keys: pa.array([str(int(k)) for k in keys], pa.string()))
    return pipeline.retrieve(snap, queries, "x", k, params, live)


def per_segment(kind, segs, live, queries, params, k=K):
    """What a per-segment budget gave: each segment searched alone, merged by score."""
    prepared = kind.prepare(queries, segs, live, params, {})
    bases = np.concatenate([[0], np.cumsum([s.n_rows for s in segs])])
    return merge_segments([s.search(prepared, k, params, m) for s, m in zip(segs, live)],
                          bases, k)


def assert_same(a, b, live):
    (s1, k1), (s2, k2) = a, b
    assert (k1 >= 0).any()
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_allclose(s1, s2, rtol=1e-5, atol=1e-6)
    assert live[k1[k1 >= 0]].all()  # tombstoned rows never come back


def differs(a, b) -> bool:
    return not np.array_equal(a[1], b[1])


# --------------------------------------------------------------------------- dense

def test_dense_flat_segmentation_independence(tmp_path):
    """Flat is exact. ANN indexes are not segmentation independent: HNSW builds a graph per
    segment, and the filtered-search plan (exact scoring of few allowed rows, else the ANN
    index with a widened budget) is chosen per segment, so IVF/HNSW results may differ."""
    x = clustered(N + UPSERTS, seed=1)
    x[N:] = unit(x[10:10 + UPSERTS] + 0.3 * clustered(UPSERTS, seed=9))
    kind = from_factory("dense:Flat")
    params: dict = {}
    (one, l1), (many, l4) = layouts(kind, tmp_path, x=x)
    qs = [Query(vector=v) for v in clustered(12, seed=2)]
    assert_same(retrieve(kind, one, l1, qs, params), retrieve(kind, many, l4, qs, params),
                np.concatenate(l1))


# --------------------------------------------------------------------------- sparse

@pytest.fixture(scope="module")
def sparse_kind():
    x = clustered(N + UPSERTS, seed=4)
    kind = from_factory("sparse:UHD4096,k=16,epochs=1")
    kind.train(BuildBatch([str(i) for i in range(N)], [""] * N, ["t"] * N, x[:N]))
    return kind, x


@pytest.mark.parametrize("rescore", ["0", "20", None])  # None: the default, 400
def test_sparse_segmentation_independence(tmp_path, sparse_kind, rescore):
    kind, x = sparse_kind
    (one, l1), (many, l4) = layouts(kind, tmp_path, x=x)
    qs = [Query(vector=v) for v in clustered(12, seed=5)]
    params = {} if rescore is None else {"rescore": rescore}
    got1 = retrieve(kind, one, l1, qs, params)
    assert_same(got1, retrieve(kind, many, l4, qs, params), np.concatenate(l1))
    if rescore == "20":  # 20 re-scored per segment would have found other documents
        assert differs(got1, per_segment(kind, many, l4, qs, params))
    if rescore != "0":  # re-scored: exact inner products
        keys = got1[1]
        np.testing.assert_allclose(got1[0][keys >= 0], np.concatenate(
            [x[r[r >= 0]] @ q.vector for r, q in zip(keys, qs)]), atol=1e-5)


# --------------------------------------------------------------------------- multivector

@pytest.fixture(scope="module")
def mv_kind():
    toks = clustered_tokens(N + UPSERTS, seed=6)
    kind = from_factory("multivector:KMeans32,residual=PQ4")
    kind.train(BuildBatch([str(i) for i in range(N)], [""] * N, [""] * N, None, toks[:N]))
    return kind, toks


@pytest.mark.parametrize("params", [{"ndocs": "3"}, {"ndocs": "3", "nprobe": "1"},
                                    {"exhaustive": "1", "ndocs": "5"}, {}])
def test_multivector_segmentation_independence(tmp_path, mv_kind, params):
    kind, toks = mv_kind
    (one, l1), (many, l4) = layouts(kind, tmp_path, tokens=toks)
    rng = np.random.default_rng(8)
    qs = [Query(extra={"tokens": unit(rng.standard_normal((int(rng.integers(2, 8)), 32)))})
          for _ in range(12)]
    got1 = retrieve(kind, one, l1, qs, params)
    assert_same(got1, retrieve(kind, many, l4, qs, params), np.concatenate(l1))
    if params.get("ndocs") == "3":  # 3 per segment to the final pass would differ
        assert differs(got1, per_segment(kind, many, l4, qs, params))


# --------------------------------------------------------------------------- tree

def test_tree_exact_search_is_segmentation_independent(tmp_path):
    x = clustered(N + UPSERTS, seed=7)
    kind = from_factory("tree:branch=4,leaf=8")
    (one, l1), (many, l4) = layouts(kind, tmp_path, x=x)
    qs = [Query(vector=v) for v in clustered(12, seed=2)]
    exact = {"budget": "0", "rank": "best"}
    got1 = retrieve(kind, one, l1, qs, exact)
    assert_same(got1, retrieve(kind, many, l4, qs, exact), np.concatenate(l1))
    cos = (np.stack([q.vector for q in qs]) @ x.T) / np.linalg.norm(x, axis=1)
    np.testing.assert_allclose(got1[0], np.take_along_axis(cos, got1[1], 1), atol=1e-5)


def test_tree_budget_is_collection_wide(tmp_path):
    """With a budget, each tree expands its share of it (by live rows), not the whole."""
    x = clustered(N + UPSERTS, seed=7)
    kind = from_factory("tree:branch=4,leaf=8")
    _, (many, live) = layouts(kind, tmp_path, x=x)
    qs = [Query(vector=v) for v in clustered(12, seed=2)]
    params = {"budget": "12"}
    prepared = kind.prepare(qs, many, live, params, {})
    shares = [prepared.budget_of(s) for s in many]
    assert shares == [round(12 * m.sum() / sum(m.sum() for m in live)) for m in live]
    assert sum(shares) <= 12 + len(many) and min(shares) >= 1
    snap_cache: dict = {}
    split = kind.prepare(qs, many, live, params, snap_cache)
    for s, m in zip(many, live):
        s.search(split, K, params, m, budget=split.budget_of(s))
    whole = kind.prepare(qs, many, live, params, {})
    for s, m in zip(many, live):
        s.search(whole, K, params, m)  # the old rule: the full budget in every segment
    assert split.expanded.sum() < whole.expanded.sum()
    # the pipeline takes the split budgets
    got = retrieve(kind, many, live, qs, params)
    bases = np.concatenate([[0], np.cumsum([s.n_rows for s in many])])
    ref = merge_segments([s.search(split, K, params, m, budget=split.budget_of(s))
                          for s, m in zip(many, live)], bases, K)
    np.testing.assert_array_equal(got[1], ref[1])


# --------------------------------------------------------------------------- collections

WORDS = ("boundary layer flow wing supersonic heat transfer shock wave pressure cylinder "
         "plate laminar turbulent nozzle jet cone body drag lift panel flutter buckling "
         "stress shell vibration mach number reynolds skin friction").split()


def test_collection_profiles_do_not_depend_on_segments(tmp_path):
    """The same documents added in one call or in three, then the same deletes and
    re-upserts: equal hits for each kind's profile and hybrid. Vectors are the user's (a
    model's embeddings of a text depend slightly on the batch it was encoded in), and the
    sparse projector is shared (it is trained on the first segment)."""
    rng = np.random.default_rng(0)
    vecs = clustered(150, seed=11)
    docs = [{"_id": f"d{i}", "title": "", "vector": vecs[i].tolist(),
             "text": " ".join(rng.choice(WORDS, size=int(rng.integers(5, 15))))}
            for i in range(150)]
    eng = polyindex.open(tmp_path)
    indexes = ["lexical", "dense:Flat", "tree:branch=4,leaf=8", "sparse:UHD4096,k=16,epochs=1"]
    colls = []
    for name, cuts in (("one", [0, 150]), ("many", [0, 40, 100, 150])):
        coll = eng.create_collection(name, indexes, model=None)
        if colls:
            coll.kinds["sparse"].projector = colls[0].kinds["sparse"].projector
        for a, b in zip(cuts, cuts[1:]):
            coll.add(docs[a:b])
        coll.delete([f"d{i}" for i in range(0, 150, 7)])
        coll.add([{**d, "text": d["text"] + " shock wave",
                   "vector": unit(vecs[i] + 0.3 * vecs[i + 1]).tolist()}
                  for i, d in zip(range(20, 35), docs[20:35])])
        colls.append(coll)
    one, many = colls
    assert (len(one.view().segments), len(many.view().segments)) == (2, 4)
    assert one.count() == many.count() == 150 - len(range(0, 150, 7)) + len(
        [i for i in range(20, 35) if i % 7 == 0])
    sparse = {"retrieve": [{"index": "sparse", "k": K, "params": "rescore=15"}]}
    tree = {"retrieve": [{"index": "tree", "k": K, "params": "budget=0"}]}
    texts = ["supersonic flow over a cone", "heat transfer laminar plate shock wave",
             "buckling of shells", "jet nozzle drag"]
    qvecs = clustered(len(texts), seed=12)
    for profile in ("lexical", "dense", "hybrid", "sparse", "hybrid-sparse", sparse, tree):
        for text, v in zip(texts, qvecs):
            h1 = one.query(text, vector=v, profile=profile, k=K)
            h2 = many.query(text, vector=v, profile=profile, k=K)
            assert h1 and [h.id for h in h1] == [h.id for h in h2], (profile, text)
            np.testing.assert_allclose([h.score for h in h1], [h.score for h in h2],
                                       rtol=1e-5, atol=1e-6)
