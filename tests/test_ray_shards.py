"""Sharded serving on Ray (issue 19 part 3): shard actors with replicas behind the gRPC
server, the SDK unchanged; a dead replica is replaced by another, a shard with none answers
UNAVAILABLE, or, when the request allows it, a partial answer that names the shard.

One local Ray for the module (loopback only, no dashboard, a small object store).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray[data]')")

from polyindex.client import Client  # noqa: E402
from polyindex.distributed import cluster  # noqa: E402
from polyindex.distributed.router import shard_of  # noqa: E402
from polyindex.distributed.serving import ShardedEngine  # noqa: E402
from polyindex.engine import Engine  # noqa: E402
from polyindex.errors import FailedPrecondition  # noqa: E402
from polyindex.service.server import serve  # noqa: E402
from polyindex.wire.grpc_errors import Unavailable  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "engine" / "cli" / "demo_data" / "cranfield"


@pytest.fixture(scope="module")
def local_ray():
    r = cluster.start(num_cpus=2, object_store_bytes=128 * 1024 * 1024)
    yield r
    r.shutdown()


@pytest.fixture(scope="module")
def corpus():
    docs = []
    with open(DEMO / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs.append({"id": str(d["_id"]), "title": d["title"], "text": d["text"]})
            if len(docs) == 150:
                break
    with open(DEMO / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f][:8]
    return docs, queries


@pytest.fixture(scope="module")
def served(local_ray, corpus, tmp_path_factory):
    """2 shards x 2 replicas behind a gRPC server on loopback, and a one-node reference
    written with the same batches (the router encodes each batch once, as one node)."""
    docs, _ = corpus
    tmp = tmp_path_factory.mktemp("rayshards")
    engine = ShardedEngine(tmp / "sharded", shards=2, replicas=2)
    srv = serve(tmp / "sharded", host="127.0.0.1", port=0, engine=engine)
    ref = Engine(tmp / "one").create_collection("c", ["lexical", "dense"], dtype="float32")
    client = Client(srv.address, timeout=600)  # the first write loads the model
    coll = client.create_collection("c", ["lexical", "dense"], dtype="float32")
    for batch in (docs[:80], docs[80:]):
        coll.add(batch)
        ref.add(batch)
    yield engine, client, ref
    client.close()
    srv.stop(5)


def test_grpc_answers_equal_one_node(served, corpus):
    engine, client, ref = served
    _, queries = corpus
    coll = client.collection("c")
    assert coll.count() == ref.count() == 150
    for profile in ("lexical", "dense", "hybrid", "ltr"):
        a = ref.query_batch(queries, k=10, profile=profile)
        b = coll.query_batch(queries, k=10, profile=profile)
        for x, y in zip(a, b):
            assert [h.id for h in y] == [h.id for h in x], profile
            np.testing.assert_allclose([h.score for h in y], [h.score for h in x], rtol=1e-5)
    # every shard holds the ids that hash to it, in both replicas' view
    got = coll.get([d for d in ("1", "2", "3")])
    assert [g.id for g in got] == ["1", "2", "3"]
    assert shard_of("1", 2) in (0, 1)


def test_answers_equal_one_node_while_a_writer_streams(served, corpus):
    """Replicas under writes (issue 43): a writer streams batches into both deployments
    while the router queries ``hybrid`` and ``ltr``; reads rotate over each shard's two
    replicas, and a query's rerank calls go to the replica its retrieve read. An answer
    given while no batch was in flight equals one node's."""
    import threading
    engine, client, ref = served
    _, queries = corpus
    routed = engine.collection("c")
    extra = []
    with open(DEMO / "corpus.jsonl") as f:
        for n, line in enumerate(f):
            if n >= 150:
                d = json.loads(line)
                extra.append({"id": str(d["_id"]), "title": d["title"], "text": d["text"]})
            if len(extra) == 40:
                break
    acked, busy, failed = [0], threading.Event(), []

    def stream():
        try:
            for lo in range(0, len(extra), 10):
                busy.set()
                client.collection("c").add(extra[lo:lo + 10])
                ref.add(extra[lo:lo + 10])
                acked[0] += 1
                busy.clear()
                time.sleep(0.2)
        except BaseException as e:  # noqa: BLE001  re-raised below
            failed.append(e)
            busy.clear()

    writer = threading.Thread(target=stream)
    writer.start()
    compared = 0
    while writer.is_alive() or compared < 2:
        before, was_busy = acked[0], busy.is_set()
        routed.catch_up()
        got = {p: routed.query_batch(queries, k=10, profile=p) for p in ("hybrid", "ltr")}
        want = {p: ref.query_batch(queries, k=10, profile=p) for p in ("hybrid", "ltr")}
        if not was_busy and not busy.is_set() and acked[0] == before:
            for p in got:
                for x, y in zip(want[p], got[p]):
                    assert [h.id for h in y] == [h.id for h in x], (p, before)
            compared += 1
    writer.join()
    assert not failed, failed
    assert compared >= 2 and routed.count() == ref.count() == 190


def test_a_dead_replica_is_replaced_and_a_dead_shard_is_unavailable(served, corpus):
    engine, client, ref = served
    _, queries = corpus
    coll = client.collection("c")
    want = [h.id for h in ref.query(queries[0], k=5, profile="hybrid")]
    # kill shard 1's follower for good: reads fall over to its writer
    ray.kill(engine.handles[1][1], no_restart=True)
    for _ in range(4):  # reads rotate over the replicas: each one meets the dead follower
        assert [h.id for h in coll.query(queries[0], k=5, profile="hybrid")] == want
    # kill its writer too: shard 1 has no replica
    ray.kill(engine.handles[1][0], no_restart=True)
    with pytest.raises(Unavailable, match="shard 1"):
        coll.query(queries[0], k=5, profile="hybrid")
    part = coll.query_batch([queries[0]], k=5, profile="lexical", allow_partial=True)
    assert part.unavailable_shards == (1,)
    owned = {h.id for h in part[0]}
    assert owned and all(shard_of(i, 2) == 0 for i in owned)


def test_shard_count_is_fixed(tmp_path, local_ray):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "shards.json").write_text('{"shards": 3}\n')
    with pytest.raises(FailedPrecondition, match="3 shards"):
        ShardedEngine(tmp_path / "d", shards=2)
