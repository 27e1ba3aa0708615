"""A sharded collection answers as one node holding every document would (issue 19 part 3).

The router and the shards run in this process (``LocalShards``: the same router and shard
code the Ray actors run, without Ray's start-up), over S = 1, 2 and 4 shards: lexical,
dense, hybrid and ltr give the one-node ids in the one-node order with the one-node scores,
through deletes and re-upserts that leave tombstones and several segments per shard. The
embeddings are computed once and given to both (a text's bf16 embedding depends slightly on
the batch it was encoded in; the router encodes each batch once, as one node does); here
they are seeded random unit vectors, with query vectors given, so no model runs.
tests/test_ray_shards.py runs the same router over Ray actors, gRPC and the real model.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from polyindex.distributed.backends import LOST, LocalShards
from polyindex.distributed.router import SHIFT, ShardedCollection, shard_of
from polyindex.distributed.shard import Shard
from polyindex.engine import Engine

DEMO = Path(__file__).resolve().parents[1] / "engine" / "cli" / "demo_data" / "cranfield"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
# Exact dense search: an approximate graph (HNSW, which ``auto`` picks from 10,000 rows)
# finds different near neighbours in one big segment than in several small ones.
INDEXES = ["lexical", "dense:Flat"]
PROFILES = ["lexical", "dense", "hybrid", "ltr"]


def _load(folder: Path, n_docs: int, n_queries: int):
    docs = []
    with open(folder / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs.append({"id": str(d["_id"]), "title": d.get("title") or "", "text": d["text"]})
            if len(docs) == n_docs:
                break
    with open(folder / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f][:n_queries]
    return docs, queries


def _build(one_dir: Path, shard_dirs: list[Path], docs, emb):
    """The same writes to one node and to the shards: two batches, deletes, re-upserts."""
    one = Engine(one_dir).create_collection("c", INDEXES)
    shards = [Shard(d) for d in shard_dirs]
    for sh in shards:
        sh.create("c", INDEXES, {})
    routed = ShardedCollection("c", LocalShards(shards))
    half = len(docs) // 2
    gone = [docs[i]["id"] for i in range(3, len(docs), 17)]
    again = list(range(5, len(docs), 23))  # re-upserted: old rows become tombstones
    for target in (one, routed):
        target.add(docs[:half], embeddings=emb[:half])
        target.add(docs[half:], embeddings=emb[half:])
        target.delete(gone)
        target.add([docs[i] for i in again], embeddings=emb[again])
    return one, routed, shards


def _same(a, b, where: str, rtol: float = 1e-5) -> None:
    """Same ids in the same order and the same scores; only exactly tied scores may be
    ordered differently (one node orders them by its row order, the router by shard)."""
    assert len(a) == len(b), where
    sa = np.array([h.score for h in a])
    sb = np.array([h.score for h in b])
    np.testing.assert_allclose(sb, sa, rtol=rtol, atol=1e-6, err_msg=where)
    groups = {}
    for h in a:
        groups.setdefault(round(h.score, 5), set()).add(h.id)
    last = round(a[-1].score, 5) if a else None
    for h, g in zip(a, b):
        key = round(h.score, 5)
        if key != last:  # a tie group cut by k may hold other members on either side
            assert g.id in groups[key], f"{where}: rank {h.rank}: {g.id} where one node has {h.id}"


def _unit(rng, n: int) -> np.ndarray:
    x = rng.normal(size=(n, 384)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def corpus():
    docs, queries = _load(DEMO, 360, 25)
    rng = np.random.default_rng(7)
    return docs, queries, _unit(rng, len(docs)), list(_unit(rng, len(queries)))


def trees_models(models: Path) -> Path:
    """A models folder: the shipped general ranker, and as ``trees`` the same with its trees
    weighed 1 (shipped: the guard's weight, which may be 0, computing no feature at all): the
    ``ltr-trees`` profile then exercises every rerank feature."""
    from polyindex.rerank import registry
    if not (models / "trees").is_dir():
        (models / "trees").mkdir(parents=True)
        shutil.copytree(registry.SHIPPED / "general", models / "general")
        for f in registry.SHIPPED_FILES:
            text = (registry.SHIPPED / "general" / f).read_text()
            if f.endswith(".json"):
                meta = json.loads(text)
                meta["tree_weight"] = 1.0
                text = json.dumps(meta)
            (models / "trees" / f).write_text(text)
    return models


@pytest.fixture(autouse=True)
def full_weight_ranker(tmp_path_factory, monkeypatch):
    """``trees_models`` as the shipped models, for every test here (across shards)."""
    from polyindex.rerank import registry
    models = trees_models(tmp_path_factory.getbasetemp() / "models")
    monkeypatch.setattr(registry, "SHIPPED", models)
    registry.clear_cache()
    yield
    registry.clear_cache()


def _compare(one, routed, queries, qvecs, where: str) -> None:
    from polyindex.query.profiles import LTR
    trees = {**LTR, "rerank": {"model": "trees", "window": 100}}
    for profile in [*PROFILES, trees]:
        a = one.query_batch(queries, vectors=qvecs, k=10, profile=profile)
        b = routed.query_batch(queries, vectors=qvecs, k=10, profile=profile)
        assert sum(len(x) for x in a) >= 5 * len(queries), (profile, where)  # mostly full
        for qi, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{profile if isinstance(profile, str) else 'ltr-trees'}, {where}, "
                        f"query {qi}", 1e-5)


@pytest.mark.parametrize("n_shards", [1, 2, 4])
def test_sharded_answers_equal_one_node(tmp_path, corpus, n_shards):
    docs, queries, emb, qvecs = corpus
    one, routed, shards = _build(tmp_path / "one", [tmp_path / f"s{s}" for s in range(n_shards)],
                                 docs, emb)
    assert routed.count() == one.count()
    per_shard = [sh.info("c")["documents"] for sh in shards]
    if n_shards > 1:
        assert all(n > 0 for n in per_shard), per_shard  # the hash spread the ids
    _compare(one, routed, queries, qvecs, f"S={n_shards}")
    # a filter-free text query with payload comes back whole from the owning shard
    hit = routed.query(queries[0], k=1, profile="lexical", with_text=True)[0]
    assert hit.text == next(d["text"] for d in docs if d["id"] == hit.id)


def test_ids_route_to_one_shard_and_writes_read_back(tmp_path, corpus):
    docs, _, emb, _ = corpus
    shards = [Shard(tmp_path / f"s{s}") for s in range(3)]
    for sh in shards:
        sh.create("c", INDEXES, {})
    routed = ShardedCollection("c", LocalShards(shards))
    routed.add(docs[:60], embeddings=emb[:60])
    for d in docs[:60]:
        owner = shard_of(d["id"], 3)
        found = [sh.get("c", [d["id"]])[0] is not None for sh in shards]
        assert found == [s == owner for s in range(3)], d["id"]
    got = routed.get([docs[0]["id"], "nope", docs[59]["id"]])
    assert [g.id if g else None for g in got] == [docs[0]["id"], None, docs[59]["id"]]
    assert routed.delete([docs[0]["id"], "nope"]) == 1
    assert routed.count() == 59


def test_statistics_follow_writes(tmp_path, corpus):
    """A write on one shard changes every shard's BM25 statistics (its df and N): the next
    query answers with the new numbers, as one node does."""
    docs, queries, emb, _ = corpus
    one, routed, _ = _build(tmp_path / "one", [tmp_path / f"s{s}" for s in range(2)],
                            docs[:120], emb[:120])
    before = routed.query(queries[1], k=5, profile="lexical")
    extra = [{"id": f"x{i}", "title": "", "text": queries[1]} for i in range(30)]
    extra_emb = emb[:30]
    one.add(extra, embeddings=extra_emb)
    routed.add(extra, embeddings=extra_emb)
    a, b = one.query(queries[1], k=10, profile="lexical"), routed.query(queries[1], k=10,
                                                                      profile="lexical")
    _same(a, b, "after the write")
    assert [h.score for h in b[:5]] != [h.score for h in before]


def test_router_keys_split_by_shard():
    key = (np.int64(3) << SHIFT) | np.int64(12345)
    assert key >> SHIFT == 3 and key - (np.int64(3) << SHIFT) == 12345


@pytest.mark.skipif(not (SHARED / "nfcorpus").is_dir() or not (SHARED / "npl").is_dir(),
                    reason="../shared/data has no nfcorpus or npl (the shared IR collections)")
@pytest.mark.parametrize("name", ["nfcorpus", "npl"])
def test_shared_collections_sharded_equal_one_node(tmp_path, name):
    docs, queries = _load(SHARED / name, 100_000, 20)  # the whole collection
    rng = np.random.default_rng(11)
    emb, qvecs = _unit(rng, len(docs)), list(_unit(rng, len(queries)))
    for n_shards in (2, 4):
        base = tmp_path / f"S{n_shards}"
        one, routed, _ = _build(base / "one", [base / f"s{s}" for s in range(n_shards)],
                                docs, emb)
        _compare(one, routed, queries, qvecs, f"{name}, S={n_shards}")


def test_features_read_the_rows_retrieve_answered_from(tmp_path, corpus):
    """A merge published between a query's retrieve and its rerank features moves rows: the
    shard answers the features from the snapshot the retrieve used (its token), so the
    candidates' keys still name the same documents."""
    from polyindex.query.requests import make_queries
    docs, _, emb, _ = corpus
    sh = Shard(tmp_path / "s")
    sh.create("c", INDEXES, {})
    coll = sh.engine.collection("c")
    for lo in range(0, 120, 40):  # three segments
        coll.add(docs[lo:lo + 40], embeddings=emb[lo:lo + 40])
        coll.seal()
    coll.delete([docs[i]["id"] for i in range(0, 40, 3)])  # the first segment's rows shift
    sh.install("c", 1, sh.table("c")[1], sh.table("c")[0])
    queries = make_queries(["wing pressure distribution"], None)
    got = sh.retrieve("c", queries, "lexical", [20], None, 1)
    keys = [got["stages"][0][1][0][got["stages"][0][1][0] >= 0]]
    before = sh.features("c", queries, keys, 1, False)["X"]  # no token: today's snapshot
    got = sh.retrieve("c", queries, "lexical", [20], None, 1)
    coll.compact(max_segments=1)
    assert len(coll.view().segments) == 1
    after = sh.features("c", queries, keys, 1, False, got["snapshot"])["X"]
    np.testing.assert_allclose(np.nan_to_num(after, nan=-7), np.nan_to_num(before, nan=-7),
                               rtol=1e-5)  # statistics recomputed: float noise only
    # read once (unpinned), or another replica's token: not held, so the router is told
    # the snapshot is lost (it asks again from the retrieve) rather than read other rows
    assert sh.features("c", queries, keys, 1, False, got["snapshot"]) == LOST
    other = Shard(tmp_path / "s", readonly=True, replica=1)
    token = sh.retrieve("c", queries, "lexical", [20], None, 1)["snapshot"]
    assert other.kind_scores("c", queries, keys, {"index": "lexical"}, token) == LOST
    other.close()
