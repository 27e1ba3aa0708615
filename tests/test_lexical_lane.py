"""The text lane (``index/lexical/lane``): a plain lexical query answered by the lexical kind's
direct plan, one kernel call over every segment, gives the general pipeline's hits bit for
bit (ids, order, float32 scores), whatever the segmentation; calls it does not take go the
general way."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.query import vector_lane
from polyindex.query.pipeline import run
from polyindex.query.requests import make_queries

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def general(coll, text, k, profile="lexical"):
    """The general pipeline's hits for one text query (what the lane must equal)."""
    return run(coll.view(), make_queries([text], None), coll._profile(profile), k)[0]


def pairs(hits):
    return [(h.id, h.score, h.rank) for h in hits]


def lane_used(coll, profile="lexical") -> bool:
    plans = coll.view().cache.get(vector_lane.LANE_CACHE, {})
    got = plans.get(("text", profile))
    return got is not None and got is not vector_lane._NONE


def read_beir(name: str, limit_queries: int):
    docs = []
    with open(DATA / name / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                docs.append({"id": str(d["_id"]), "title": d.get("title") or "",
                             "text": d.get("text") or ""})
    queries = []
    with open(DATA / name / "queries.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip() and len(queries) < limit_queries:
                queries.append(json.loads(line)["text"])
    return docs, queries


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "cisi" / "corpus.jsonl").is_file(),
                    reason="../shared/data/cisi not present (the shared IR collections)")
def test_lane_equals_general_and_one_segment_on_a_shared_collection(eng):
    """cisi (long queries: ~50 terms) written in 60 adds, never compacted, with deletions:
    for every query the lane's top k equals the general path's (ids, order, scores bit for
    bit) and the same documents as one segment give the same top k."""
    docs, queries = read_beir("cisi", 120)
    many = eng.create_collection("many", ["lexical"], model=None)
    step = -(-len(docs) // 60)
    for a in range(0, len(docs), step):
        many.add(docs[a:a + step])
    gone = [d["id"] for d in docs[::37]]
    many.delete(gone)
    one = eng.create_collection("one", ["lexical"], model=None)
    one.add([d for d in docs if d["id"] not in set(gone)])
    one.compact()
    assert len(many.view().segments) >= 50 and len(one.view().segments) == 1
    for k in (10, 100):
        for text in queries:
            got = many.query(text, k=k, profile="lexical")
            assert pairs(got) == pairs(general(many, text, k)), text
            single = one.query(text, k=k, profile="lexical")
            assert [h.id for h in got] == [h.id for h in single], text
            np.testing.assert_allclose([h.score for h in got], [h.score for h in single],
                                       rtol=1e-6)
    assert lane_used(many) and lane_used(one)


def _corpus(n, seed=0):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(60)]
    return [{"id": f"d{i:04d}", "text": " ".join(rng.choice(words, rng.integers(3, 30)))}
            for i in range(n)]


def test_lane_matches_general_with_ties_deletes_and_many_segments(eng):
    """Equal scores across segments (duplicate texts under different ids, written in
    reverse id order) come in id order, as the general path puts them; deletions and
    empty matches too."""
    coll = eng.create_collection("c", ["lexical"], model=None)
    docs = _corpus(400)
    dup = [{"id": f"z{i:03d}", "text": "alpha beta gamma"} for i in range(30)]
    for part in range(8):
        coll.add(docs[part * 50:(part + 1) * 50] + dup[::-1][part * 4:(part + 1) * 4])
    coll.delete(["d0003", "d0100", "z010"])
    texts = ["alpha", "alpha beta", "w1 w2 w3", "w5 w5 w7 alpha", "w59", "nothing here",
             " ".join(f"w{i}" for i in range(40))]
    for k in (1, 5, 10, 50, 500):
        for text in texts:
            assert pairs(coll.query(text, k=k, profile="lexical")) == \
                pairs(general(coll, text, k)), (text, k)
    tied = coll.query("alpha", k=30, profile="lexical")
    assert [h.id for h in tied] == sorted(h.id for h in tied)  # one score: id order
    assert coll.query("nothing here", k=5, profile="lexical") == []
    assert lane_used(coll)
    batch = coll.query_batch(["alpha beta", "w1 w2"], k=7, profile="lexical")
    assert [pairs(h) for h in batch] == [pairs(general(coll, t, 7)) for t in
                                        ("alpha beta", "w1 w2")]


def test_lane_with_block_max_pruning_matches(eng, setting):
    """Queries whose top k block-max MaxScore prunes (one frequent term) equal the general
    path's, with pruning on and off."""
    rng = np.random.default_rng(3)
    docs = [{"id": f"d{i:05d}", "text": "common " + " ".join(
        f"r{x}" for x in rng.integers(0, 2000, rng.integers(1, 8)))} for i in range(20_000)]
    coll = eng.create_collection("c", ["lexical"], model=None)
    coll.add(docs[:12_000])
    coll.add(docs[12_000:])
    for text in ("common r5", "common r17 r18", "r3 common common"):
        for k in (10, 100):
            assert pairs(coll.query(text, k=k, profile="lexical")) == \
                pairs(general(coll, text, k))


def test_calls_the_lane_does_not_take(eng):
    """Filters, explain, payloads, BM25L/BM25+ and RM3 profiles go the general way; a bad
    query is reported as the general path reports it."""
    coll = eng.create_collection("c", ["lexical"], model=None, fields={"n": "int"},
                                 profiles={
                                     "luc": {"retrieve": [{"index": "lexical", "k": 10,
                                                           "params": {"variant": "lucene"}}]},
                                     "l": {"retrieve": [{"index": "lexical", "k": 10,
                                                         "params": {"variant": "bm25l"}}]},
                                     "rm3": {"retrieve": [{"index": "lexical", "k": 10,
                                                           "params": {"prf": "rm3"}}]}})
    coll.add([dict(d, metadata={"n": i}) for i, d in enumerate(_corpus(200))])
    text = "w1 w2 w3"
    assert pairs(coll.query(text, k=10, profile="luc")) == pairs(general(coll, text, 10, "luc"))
    assert lane_used(coll, "luc")
    for name in ("l", "rm3"):
        assert pairs(coll.query(text, k=10, profile=name)) == \
            pairs(general(coll, text, 10, name))
        assert not lane_used(coll, name)
    assert vector_lane.plain_call([text], None, None, None, 10, "lexical", None, False, False,
                                  None) == "text"
    assert vector_lane.plain_call([text], None, None, None, 10, "lexical", {"n": 1}, False,
                                  False, None) is None
    hits = coll.query(text, k=5, profile="lexical", with_text=True)
    assert hits and hits[0].text is not None  # the general path filled the payload
    with pytest.raises(InvalidArgument):
        coll.query("   ", k=5, profile="lexical")


def test_tuned_scorer_is_read_per_query(eng):
    """``set_scorer`` (tune-bm25) swaps the kind's scorer; the lane's plan reads it per
    query, so it answers with the new one as the general path does."""
    coll = eng.create_collection("c", ["lexical"], model=None)
    coll.add(_corpus(300))
    text = "w4 w9 w9"
    before = coll.query(text, k=10, profile="lexical")
    coll.kinds["lexical"].set_scorer("bm25,k1=0.4,b=0.2")
    after = coll.query(text, k=10, profile="lexical")
    assert pairs(after) == pairs(general(coll, text, 10))
    assert [h.score for h in after] != [h.score for h in before]


def test_ids_gathered_at_once(eng):
    """Many ids are gathered in one kernel and decoded once (``storage/strings``), the same
    as one at a time; a string holding the separator (ids cannot: control characters are
    refused at the edge) or a row out of range makes the gather give up (None), so the
    caller's own path answers."""
    import pyarrow as pa
    from polyindex.storage import strings
    coll = eng.create_collection("c", ["lexical"], model=None)
    coll.add([{"id": f"é{i}✓", "text": "same words"} for i in range(30)])
    docs = coll.view().segments[0].docs
    rows = np.array([5, 0, 29, 3, 3, 17, 8])
    assert docs.ids_at(rows) == [docs.ids_at(np.array([r]))[0] for r in rows]
    arr = pa.array(["a", "b\x00c", "d"])
    offsets = np.frombuffer(arr.buffers()[1], np.int32)
    data = np.frombuffer(arr.buffers()[2], np.uint8)
    assert strings.take(offsets, data, np.array([0, 2], np.int64)) == ["a", "d"]
    assert strings.take(offsets, data, np.array([1, 0], np.int64)) is None
    assert strings.take(offsets, data, np.array([0, 3], np.int64)) is None
