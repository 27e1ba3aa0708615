"""Hybrid's fixed cost: its lexical leg's ties put in id order by integers (each segment's id
ranks, ``Segment.id_ranks``) and reciprocal rank fusion's best ``keep`` taken by one kernel
(``fusion._rrf_top``). Both must give what the strings and numpy's sorts gave: the same
keys, order and float64 sums."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from polyindex.index import ties
from polyindex.rerank import fusion
from polyindex.storage.snapshot import Snapshot

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def full_rrf(lists, k, weights, keep):
    keys, sums = fusion.rrf(lists, k, weights)  # no keep: numpy's sorts
    return keys[:keep], sums[:keep]


@pytest.mark.parametrize("seed", range(6))
def test_rrf_kernel_equals_numpy(seed):
    rng = np.random.default_rng(seed)
    pool = rng.permutation(5000)[:1500].astype(np.int64)
    lex = rng.choice(pool, 1000, replace=False)
    dense = np.concatenate([rng.choice(pool[:300], 90, replace=False), np.full(10, -1)])
    third = rng.choice(pool, 50, replace=False)
    for lists, weights in (([lex, dense], [1.0, 1.1]), ([lex, dense], [1.0, 1.0]),
                           ([lex, dense, third], [1.0, 1.1, 0.5]), ([dense], [1.0])):
        # equal weights make many equal sums (rank r in one list = rank r in another):
        # the order then comes from the ranks and keys, which the kernel must follow
        for keep in (1, 10, 100, 250):
            got = fusion.rrf(lists, 60, weights, keep=keep)
            want = full_rrf(lists, 60, weights, keep)
            assert np.array_equal(got[0], want[0]), (keep, weights)
            assert got[1].tobytes() == want[1].tobytes(), (keep, weights)


def test_rrf_rescale_and_large_keep_use_numpy_alike():
    rng = np.random.default_rng(9)
    a, b = rng.permutation(400)[:200], rng.permutation(400)[:100]
    resc = (np.sort(a[:20]), 2.0)
    got = fusion.rrf([a, b], 60, [1.0, 1.1], resc, keep=10)
    want = fusion.rrf([a, b], 60, [1.0, 1.1], resc)
    assert np.array_equal(got[0], want[0][:10]) and np.array_equal(got[1], want[1][:10])
    got = fusion.rrf([a, b], 60, [1.0, 1.1], keep=300)  # keep beside the keys: numpy's
    want = fusion.rrf([a, b], 60, [1.0, 1.1])
    assert np.array_equal(got[0], want[0][:300])


def test_order_ties_by_ranks_equals_by_strings():
    rng = np.random.default_rng(2)
    ids = np.array([f"doc-{rng.integers(10**6)}-{i}" for i in range(3000)], dtype=object)
    ranks = np.empty(3000, np.int32)
    ranks[np.argsort(ids.astype(str), kind="stable")] = np.arange(3000)
    scores = np.sort(rng.integers(0, 40, (2, 1000)).astype(np.float32), axis=1)[:, ::-1]
    keys = np.stack([rng.permutation(3000)[:1000] for _ in range(2)]).astype(np.int64)
    keys[1, -5:] = -1
    scores = np.ascontiguousarray(scores)
    by_str = ties.order_ties(scores, keys, lambda kk: list(ids[kk]))
    by_rank = ties.order_ties(scores, keys, lambda kk: list(ids[kk]),
                              id_ranks=lambda kk: ranks[kk])
    assert np.array_equal(by_str, by_rank) and not np.array_equal(by_str, keys)
    gave_none = ties.order_ties(scores, keys, lambda kk: list(ids[kk]),
                                id_ranks=lambda kk: None)  # no ranks for these: strings
    assert np.array_equal(gave_none, by_str)


def read_beir(name: str, limit_queries: int):
    docs = []
    with open(DATA / name / "corpus.jsonl", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                docs.append({"id": str(d["_id"]), "title": d.get("title") or "",
                             "text": d.get("text") or ""})
    with open(DATA / name / "queries.jsonl", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f if line.strip()][:limit_queries]
    return docs, queries


def old_way(monkeypatch):
    """The code before: ties by strings, fusion by numpy's sorts."""
    monkeypatch.setattr(Snapshot, "id_ranks", lambda self, keys: None)
    real = fusion.rrf
    monkeypatch.setattr(fusion, "rrf", lambda lists, k=60, weights=None, rescale=None,
                        keep=None: real(lists, k, weights, rescale))


@pytest.mark.slow
@pytest.mark.skipif(not (DATA / "cisi" / "corpus.jsonl").is_file(),
                    reason="../shared/data/cisi not present (the shared IR collections)")
def test_hybrid_top10_and_fused_scores_unchanged_on_a_shared_collection(eng, monkeypatch):
    """cisi, each document three times under ids out of row order (so the lexical leg's
    top 1000 is full of ties), with vectors, in several segments and as one: the hybrid
    profile's top 10 (ids, order, fused scores bit for bit) equals the old code's."""
    docs, queries = read_beir("cisi", 25)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((len(docs), 32)).astype(np.float32)
    rows = [{"id": f"{c}{d['id']}", "title": d["title"], "text": d["text"], "vector": x[i]}
            for c in "zam" for i, d in enumerate(docs)]
    rows = [rows[i] for i in rng.permutation(len(rows))]
    many = eng.create_collection("many", ["lexical", "dense"], model=None)
    for a in range(0, len(rows), 900):
        many.add(rows[a:a + 900])
    one = eng.create_collection("one", ["lexical", "dense"], model=None)
    one.add(rows)
    one.compact()
    assert len(many.view().segments) >= 4 and len(one.view().segments) == 1
    qv = rng.standard_normal((len(queries), 32)).astype(np.float32)
    cases = [(c, t, v, k) for c in (many, one) for t, v in zip(queries, qv) for k in (10, 100)]
    used = []
    real_ranks = Snapshot.id_ranks
    monkeypatch.setattr(Snapshot, "id_ranks",
                        lambda self, keys: used.append(1) or real_ranks(self, keys))
    new = [[(h.id, h.score) for h in c.query(t, vector=v, k=k, profile="hybrid")]
           for c, t, v, k in cases]
    assert used  # the one-segment collection's ties went by ranks
    old_way(monkeypatch)
    old = [[(h.id, h.score) for h in c.query(t, vector=v, k=k, profile="hybrid")]
           for c, t, v, k in cases]
    assert new == old
    assert all(len(h) == k for h, (_, _, _, k) in zip(new, cases))


def test_id_ranks_order_non_ascii_ids_as_code_points(eng):
    """Every document alike, so all tie: the general path's order (ties by the segment's id
    ranks) is the ids' code point order, astral and accented ids included."""
    from polyindex.query.pipeline import run
    from polyindex.query.requests import make_queries
    ids = ["zeta", "Zeta", "\u00e9t\u00e9", "a\u00ff", "\U0001F600", "abc", "ab", "b", "\u4e2d",
           "A-1", "a-10", "a-9"]
    coll = eng.create_collection("u", ["lexical"], model=None)
    coll.add([{"id": i, "text": "same words here"} for i in ids])
    coll.compact()
    snap = coll.view()
    assert len(snap.segments) == 1
    hits = run(snap, make_queries(["same words"], None), coll._profile("lexical"), 20)[0]
    assert [h.id for h in hits] == sorted(ids)
    ranks = snap.segments[0].docs.id_ranks()
    assert not ranks.flags.writeable and sorted(ranks.tolist()) == list(range(len(ids)))
