"""Runs of plain flat segments searched as one ``IndexShards`` in the vector lane
(``index/dense/shards``): the same hits, score bits and tie choices as the segments searched
one by one (the general path), and the same as the rows in one segment wherever no tie run
crosses the k-th place."""
from __future__ import annotations

import numpy as np
import pytest

from polyindex.index.dense import shards
from polyindex.query import vector_lane
from test_vector_lane import general, same


def lane_parts(coll, profile="dense"):
    return coll.view().cache[vector_lane.LANE_CACHE][profile].parts


@pytest.mark.parametrize("metric", ["ip", "cosine", "l2"])
def test_many_segments_answer_as_one(eng, metric):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((400, 16)).astype(np.float32)
    x[200:260] = x[0]  # one vector in many rows, across segments: tie runs past the k-th place
    many = eng.create_collection("many", [f"dense:metric={metric},Flat"], model=None)
    one = eng.create_collection("one", [f"dense:metric={metric},Flat"], model=None)
    for s in range(0, 400, 20):
        many.add([{"id": f"d{i:03d}", "vector": x[i]} for i in range(s, s + 20)])
    one.add([{"id": f"d{i:03d}", "vector": x[i]} for i in range(400)])
    queries = [x[0], x[5], *rng.standard_normal((6, 16)).astype(np.float32)]
    for k in (1, 10, 50, 500):
        for q in queries:
            got = many.query(vector=q, k=k, profile="dense")
            assert same(got, general(many, q, k, "dense")), (k, metric)
            if q is not queries[0]:  # (a tie run across the k-th place follows rows: which
                # rows of it one segment's heap keeps is faiss's, docs/notes/segmentation-...)
                assert same(got, one.query(vector=q, k=k, profile="dense")), (k, metric)
    parts = lane_parts(many)
    assert len(parts) == 1 and isinstance(parts[0][3].__self__, shards.Run)  # one call
    # a batch too, and tombstones split the run around the segments that have them
    assert [[(h.id, h.score) for h in hs] for hs in many.query_batch(vectors=queries, k=10,
                                                                     profile="dense")] == \
        [[(h.id, h.score) for h in general(many, q, 10, "dense")] for q in queries]
    many.delete(["d030", "d031", "d250"])
    one.delete(["d030", "d031", "d250"])
    for q in queries:
        got = many.query(vector=q, k=60, profile="dense")
        assert same(got, general(many, q, 60, "dense"))
        if q is not queries[0]:
            assert same(got, one.query(vector=q, k=60, profile="dense"))
    assert len(lane_parts(many)) == 5  # run, tombstoned segment, run, tombstoned, run


def test_straddling_tie_keeps_the_per_segment_choice(eng):
    x = np.ones((40, 4), np.float32)  # every row ties
    coll = eng.create_collection("t", ["dense:Flat"], model=None)
    for s in range(0, 40, 10):
        coll.add([{"id": f"d{i:02d}", "vector": x[i]} for i in range(s, s + 10)])
    for k in (5, 15, 39):
        hits = coll.query(vector=x[0], k=k, profile="dense")
        assert same(hits, general(coll, x[0], k, "dense"))
        assert [h.id for h in hits] == sorted(h.id for h in hits)  # ties in id order


def test_general_path_runs_and_filters(eng):
    """Hybrid and filtered dense stages (the general pipeline) search runs too, and a
    filter's masked segments one by one: the same hits as one segment's."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    many = eng.create_collection("many", ["dense:Flat"], model=None, fields={"n": "int"})
    one = eng.create_collection("one", ["dense:Flat"], model=None, fields={"n": "int"})
    rows = [{"id": f"d{i:03d}", "vector": x[i], "metadata": {"n": i % 7}} for i in range(300)]
    for s in range(0, 300, 30):
        many.add(rows[s:s + 30])
    one.add(rows)
    from polyindex.query import pipeline
    for q in rng.standard_normal((5, 16)).astype(np.float32):
        assert same(general(many, q, 20, "dense"), one.query(vector=q, k=20, profile="dense"))
        a = many.query(vector=q, k=20, profile="dense", filter={"n": 3})
        b = one.query(vector=q, k=20, profile="dense", filter={"n": 3})
        assert [(h.id, h.score) for h in a] == [(h.id, h.score) for h in b]
    runs = many.view().cache["dense"][pipeline._RUNS][1]
    assert list(runs) == [0] and runs[0][0] == 10  # the ten segments: one run
