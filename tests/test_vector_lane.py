"""The vector lane (``query.vector_lane`` decides, the dense kind's direct plan answers:
``index/dense/lane``): a plain ``query(vector=...)`` gives exactly the
general pipeline's hits (ids, order, score bits), in every case the lane covers or hands on."""
from __future__ import annotations

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.query import vector_lane
from polyindex.query.pipeline import run
from polyindex.query.requests import default_vector_profile, make_queries


def vecs(n, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def general_batch(coll, vs, k=10, profile=None):
    """The general path itself (``pipeline.run``), which the lane must equal."""
    queries = make_queries(None, list(vs))
    prof = coll._profile(profile if profile is not None
                         else default_vector_profile(queries, None, coll.kinds))
    return run(coll.view(), queries, prof, k)


def general(coll, v, k=10, profile=None):
    return general_batch(coll, [v], k, profile)[0]


def same(a, b):
    return [(h.id, h.rank, np.float32(h.score).tobytes()) for h in a] == \
        [(h.id, h.rank, np.float32(h.score).tobytes()) for h in b]


def lane_used(coll, profile=None) -> bool:
    plans = coll.view().cache.get(vector_lane.LANE_CACHE, {})
    return plans.get(profile) not in (None, vector_lane._NONE)


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
@pytest.mark.parametrize("factory", ["Flat", "HNSW16,Flat"])
def test_equal_to_the_general_path_over_segments_and_tombstones(eng, metric, factory):
    x, q = vecs(600), vecs(12, seed=1)
    x[10] = x[11]  # an exact tie: its order comes from the ids, on both paths
    coll = eng.create_collection("v", [f"dense:metric={metric},{factory}"], model=None)
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(300)])
    hits = coll.query(vector=q[0], k=10, profile="dense")
    assert lane_used(coll, "dense") and same(hits, general(coll, q[0], profile="dense"))
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(300, 600)])  # a second segment
    coll.delete([f"d{i}" for i in range(0, 600, 7)])  # tombstones in both
    for qi in range(len(q)):
        for k in (1, 10, 50):
            assert same(coll.query(vector=q[qi], k=k, profile="dense"),
                        general(coll, q[qi], k, "dense"))
    for v in (x[10], x[11]):
        hits = coll.query(vector=v, k=5, profile="dense")
        assert same(hits, general(coll, v, 5, "dense"))
    assert lane_used(coll, "dense")
    # a batch: one faiss call per segment for all, each query's hits as the general path's
    batch = [q[0], x[10], q[5], x[11], q[1]]
    for k in (1, 10, 700):
        got, want = coll.query_batch(vectors=batch, k=k, profile="dense"), \
            general_batch(coll, batch, k, "dense")
        assert len(got) == len(want) and all(same(a, b) for a, b in zip(got, want))
    # no profile named: the collection's default (its one dense index)
    assert same(coll.query(vector=q[3], k=10), general(coll, q[3], 10, None))


def test_k_over_the_rows_and_search_params(eng):
    x = vecs(40)
    coll = eng.create_collection("v", ["dense:HNSW16,Flat"], model=None)
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(40)])
    coll.save_profile("ef8", {"retrieve": [{"index": "dense", "k": 10, "params": "efSearch=8"}]})
    hits = coll.query(vector=x[3], k=100, profile="dense")
    assert len(hits) == 40 and same(hits, general(coll, x[3], 100, "dense"))
    assert same(coll.query(vector=x[5], k=10, profile="ef8"), general(coll, x[5], 10, "ef8"))
    assert lane_used(coll, "ef8")


def test_bad_vectors_get_the_general_errors(eng):
    coll = eng.create_collection("v", ["dense:metric=cosine,Flat"], model=None)
    coll.add([{"id": f"d{i}", "vector": v} for i, v in enumerate(vecs(20))])
    bad = [([1.0] * 15, "dimension"), ([0.0] * 16, "zero vector"),
           ([float("nan")] * 16, "NaN"), ([1e30] * 16, "absurd"), ("abc", "list of numbers")]
    for v, words in bad:
        with pytest.raises(InvalidArgument, match=words):
            coll.query(vector=v, k=5, profile="dense")
        with pytest.raises(InvalidArgument, match=words):  # in a batch, after a good one
            coll.query_batch(vectors=[[0.5] * 16, v], k=5, profile="dense")


def test_profiles_the_lane_does_not_take_still_answer(eng):
    x = vecs(50)
    coll = eng.create_collection("v", ["dense:Flat"], model=None, fields={"n": "int"})
    coll.add([{"id": f"d{i}", "vector": x[i], "metadata": {"n": i}} for i in range(50)])
    coll.save_profile("rocchio", {"retrieve": [{"index": "dense", "k": 10,
                                                "params": "prf=rocchio,fb_docs=3"}]})
    hits = coll.query(vector=x[2], k=5, profile="rocchio")
    assert same(hits, general(coll, x[2], 5, "rocchio"))
    assert not lane_used(coll, "rocchio")  # feedback: the kind's prepare does the work
    # a filter, explain and payload go the general way and still answer
    got = coll.query(vector=x[2], k=5, profile="dense", filter={"n": {"lt": 10}})
    assert got and all(int(h.id[1:]) < 10 for h in got)
    assert coll.query(vector=x[2], k=3, profile="dense", explain=True)[0].explain is not None


def test_tombstoned_segments_searched_directly_equal_the_general_path(eng, monkeypatch):
    """A segment that lost a share of its rows is searched with the allow bitmap in one faiss
    call; k past the budget (and a query that comes back short of hits) takes the segment's
    own (widening) search: every answer is that search's."""
    from polyindex.index.dense import filtered as dense_filtered
    calls = []
    real = dense_filtered.search

    def counted(seg, x, k, params, allow):
        calls.append(len(x))
        return real(seg, x, k, params, allow)

    monkeypatch.setattr(dense_filtered, "search", counted)
    x, q = vecs(2000, d=8), vecs(40, d=8, seed=2)
    coll = eng.create_collection("v", ["dense:HNSW8,Flat"], model=None)
    coll.save_profile("ef4", {"retrieve": [{"index": "dense", "k": 10, "params": "efSearch=4"}]})
    coll.add([{"id": f"d{i}", "vector": x[i]} for i in range(2000)])
    # the nearest rows of every query deleted: a small budget finds few allowed ones
    near = np.argsort(-(q @ x.T), axis=1)[:, :20]
    coll.delete([f"d{i}" for i in np.unique(near)])
    seg = coll.view().segments[0].indexes["dense"]
    plan = vector_lane.plan(coll.view(), "ef4",
                            lambda: coll._profile("ef4"))
    masked = [p[4] for p in plan.parts if p[4] is not None]
    assert len(masked) == 1 and masked[0].n == int(coll.view().live[0].sum())
    assert 0.5 * seg.n_rows < masked[0].n < seg.n_rows
    for k in (1, 3, masked[0].max_k, masked[0].max_k + 1, 50):
        for v in q:
            assert same(coll.query(vector=v, k=k, profile="ef4"), general(coll, v, k, "ef4"))
    assert lane_used(coll, "ef4")
    # up to max_k one direct call (none of these queries comes back short), past it the
    # segment's own search
    calls.clear()
    for v in q:
        coll.query(vector=v, k=masked[0].max_k, profile="ef4")
    assert calls == []
    coll.query(vector=q[0], k=masked[0].max_k + 1, profile="ef4")
    assert calls == [1]


def exact_top(live: dict, v, k, metric):
    """Brute force over the live documents: [(id, score)] best first, ties in id order."""
    ids = sorted(live)
    x = np.stack([live[i] for i in ids]).astype(np.float64)
    q = np.asarray(v, np.float64)
    if metric == "cosine":
        x, q = x / np.linalg.norm(x, axis=1)[:, None], q / np.linalg.norm(q)
    s = -((x - q) ** 2).sum(1) if metric == "l2" else x @ q
    order = sorted(range(len(ids)), key=lambda j: (-s[j], ids[j]))[:k]
    return [(ids[j], s[j]) for j in order]


def stack_parts(plan):
    return [p for p in plan.parts if p[1] is None and p[3] is not None
            and "dense_stack" in p[3].__code__.co_names]


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
def test_an_online_buffer_is_one_exact_scan_equal_to_its_segments(tmp_path, metric):
    """An online collection's buffer segments (one per write) are searched as one stacked
    matrix (``index.dense.stack``) by the lane and the general path alike: the exact top-k
    of the live documents, with rows hidden inside the buffer and under it, after the
    buffer's own merge, and once every buffered row is gone."""
    import polyindex
    x, q = vecs(900, seed=3), vecs(8, seed=4)
    x[501] = x[502]  # an exact tie inside the buffer
    live = {}
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("v", [f"dense:metric={metric}"], model=None)

        def add(rows):
            coll.add([{"id": f"d{i}", "vector": v} for i, v in rows])
            live.update({f"d{i}": v for i, v in rows})

        def delete(ids):
            coll.delete(ids)
            for i in ids:
                live.pop(i, None)

        add([(i, x[i]) for i in range(300)])
        coll.seal()  # a sealed segment under the buffer

        def check(buffered):
            snap = coll.view()
            plan = vector_lane.plan(snap, "dense", lambda: coll._profile("dense"))
            n_sealed = len(snap.segments) - sum(v.segments for v in snap.stacks.values())
            assert snap.stacks and len(snap.segments) > n_sealed + buffered
            # a part for each sealed segment with live rows, one for each buffer with live
            # rows (the active one, and a frozen one while the sealer commits it)
            stacked = len(stack_parts(plan))
            assert 1 <= stacked <= len(snap.stacks) if buffered else stacked == 0
            assert len(plan.parts) == stacked + sum(
                m is None or bool(m.any()) for m in snap.live[:n_sealed])
            for v in list(q) + [x[501], x[10]]:
                for k in (1, 10, 60):
                    hits = coll.query(vector=v, k=k, profile="dense")
                    assert same(hits, general(coll, v, k, "dense"))
                    want = exact_top(live, v, k, metric)
                    assert np.allclose([h.score for h in hits], [s for _, s in want],
                                       rtol=1e-4, atol=1e-3)
                    # ties at the k-th place may keep either (documents sharing a vector)
                    assert {i for i, s in want if s > want[-1][1] + 1e-3} <= {h.id for h in hits}
            assert lane_used(coll, "dense")

        for b in range(6):  # writes of 50: rewrites of sealed rows and of buffered ones
            ids = list(range(300 + 50 * b, 350 + 50 * b)) + [b, 300 + b]
            add([(i, x[(i + 7 * b) % 900]) for i in ids])
        delete(["d301", "d1", "d420"])
        check(True)
        for b in range(6, 12):  # past MAX_BUFFER_SEGMENTS: the buffer merged into one
            add([(i, x[i]) for i in range(300 + 50 * b, 350 + 50 * b)])
        check(True)
        # every buffered document deleted: the stack's rows all hidden, the part dropped
        delete([f"d{i}" for i in range(300, 900)] + [f"d{b}" for b in range(6)])
        assert coll.count() == len(live) == 300 - 6
        check(False)


def test_a_large_buffer_is_searched_through_a_graph_grown_off_the_write_path(tmp_path,
                                                                            monkeypatch):
    """In a collection past the dense ``auto`` HNSW size the buffer indexer grows an HNSW over
    the buffer's rows (``online.buffer_index``): searches through it and the exact rest
    agree between the lane and the general path, find the exact top-10 (recall), never
    return a deleted or replaced row, keep the graph through the buffer's merge, and honour
    a filter."""
    import time

    import polyindex
    from polyindex.index.dense import kind as dense
    from polyindex.online import buffer_index
    monkeypatch.setattr(dense, "AUTO_HNSW_ROWS", 400)
    monkeypatch.setattr(buffer_index, "FIRST_ROWS", 200)
    monkeypatch.setattr(buffer_index, "STEP_ROWS", 200)
    monkeypatch.setattr("polyindex.online.writes.SEAL_DOCS", 100_000)
    x, q = vecs(3000, d=24, seed=5), vecs(30, d=24, seed=6)
    live = {}
    with polyindex.open(tmp_path, online=True) as eng:
        coll = eng.create_collection("v", ["dense"], model=None, fields={"n": "int"})

        def add(ids, shift=0):
            coll.add([{"id": f"d{i}", "vector": x[(i + shift) % 3000], "metadata": {"n": i}}
                      for i in ids])
            live.update({f"d{i}": x[(i + shift) % 3000] for i in ids})

        add(range(0, 500))
        coll.seal()
        for s in range(500, 1700, 100):  # 12 writes: the buffer merges past 8 segments
            add(range(s, s + 100))
        add(range(600, 700), shift=1111)  # replaced rows in the buffer
        coll.delete([f"d{i}" for i in range(800, 850)])
        for i in range(800, 850):
            live.pop(f"d{i}")

        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            view = next(iter(coll.view().stacks.values()), None)
            if view is not None and view.graph is not None and view.indexed >= 1000:
                break
            time.sleep(0.05)
        assert view is not None and view.graph is not None and view.indexed >= 1000
        # one snapshot for both paths: the indexer may publish a further-grown graph between
        # the lane's query and the general one, and an HNSW search may then differ
        snap = coll.view()
        monkeypatch.setattr(coll, "view", lambda: snap)
        found = 0
        for v in q:
            for k in (1, 10, 50):
                hits = coll.query(vector=v, k=k, profile="dense")
                assert same(hits, general(coll, v, k, "dense"))
                assert len(hits) == k and all(h.id in live for h in hits)
                got = {h.id: h.score for h in hits}
                want = dict(exact_top(live, v, k, "ip"))
                assert all(abs(got[i] - want[i]) < 1e-3 for i in got.keys() & want.keys())
                if k == 10:
                    found += len(got.keys() & want.keys())
        assert found >= 0.9 * 10 * len(q)  # recall@10 over the whole collection
        odd = coll.query(vector=q[0], k=20, profile="dense", filter={"n": {"gte": 1200}})
        assert len(odd) == 20 and all(int(h.id[1:]) >= 1200 for h in odd)


def test_one_guard_decides_for_query_and_query_batch(eng, monkeypatch):
    """``query`` and ``query_batch`` both ask ``vector_lane.plain_call`` (one guard), and the
    plan comes from the kind's ``direct_plan`` (the protocol's ``PlansDirectly``)."""
    from polyindex.index.protocol import PlansDirectly, implements
    x = vecs(50)
    coll = eng.create_collection("v", ["dense:Flat", "lexical"], model=None)
    coll.add([{"id": f"d{i}", "vector": x[i], "text": f"w{i}"} for i in range(50)])
    assert implements(coll.kinds["dense"], PlansDirectly)
    assert implements(coll.kinds["lexical"], PlansDirectly)  # the text lane
    asked = []
    real = vector_lane.plain_call

    def spy(*args):
        asked.append(real(*args))
        return asked[-1]
    monkeypatch.setattr(vector_lane, "plain_call", spy)
    assert same(coll.query(vector=x[3], k=5, profile="dense"), general(coll, x[3], 5, "dense"))
    got = coll.query_batch(vectors=[x[1], x[2]], k=4, profile="dense")
    assert all(same(a, b) for a, b in zip(got, general_batch(coll, [x[1], x[2]], 4, "dense")))
    coll.query(vector=x[3], k=5, profile="dense", explain=True)
    # the lane answered query and query_batch; explain asked twice (query, then query_batch)
    assert asked == ["vector", "vector", None, None]
    assert lane_used(coll, "dense")
    assert not real(None, [x[1]], None, None, 0, "dense", None, False, False, None)
    assert not real(None, [{"dense": x[1]}], None, None, 3, None, None, False, False, None)
