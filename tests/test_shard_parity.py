"""Every profile of a sharded deployment (2 shards x 2 replicas, in this process) answers as
one node holding every document, quiet and while a writer streams (issue 43 part 1).

The collection: the first 500 documents of cacm (../shared/data) with seeded random unit
embeddings (given, so no model runs) and three dense indexes: exact (``dense:Flat``), HNSW
and IVF. The approximate ones equal one node at a documented search depth: efSearch past
the collection's size, nprobe = nlist (every list; Flat storage, so exact distances). Each
replica of a shard is a read-only follower of its writer, reads rotate over them, and a
query's rerank calls go to the replica (and snapshot) its retrieve read.

Under writes: a writer thread streams more cacm documents into both deployments, batch by
batch, while this thread queries both; small segments make both seal and merge in the
background all along. An answer is compared when no batch was in flight from before the
first query to after the second (both then hold the same acknowledged writes); every other
answer must still come back whole (no row of a moved snapshot read by a rerank).

The collection-level artifacts are one for every shard: the sparse projector and the IVF
template are trained once, on the collection's first batch (``storage.shared_training``),
so sparse and IVF at its default nprobe equal one node; the tree equals one node at its
flat setting (``budget=0``: its trees are per segment, so a budgeted search follows how rows
fell into segments, as an HNSW graph does). The multivector codebook (the user's token
matrices here, so no model runs) is trained once too, from a first batch of at least
``SHARED_MIN_TOKENS`` tokens. The document-quality language model is one for every shard
(the router's first batch): checked below.
"""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from polyindex.distributed.serving import ShardedEngine
from polyindex.engine import Engine
from polyindex.query.profiles import HYBRID_MV, LTR

from test_shards import _same, trees_models

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CACM = SHARED / "cacm"
N_BASE, N_STREAM, BATCH = 500, 160, 20
HNSW = "dense@hnsw:dim=384,metric=ip,HNSW8,Flat"
IVF = "dense@ivf:dim=384,metric=ip,IVF4,Flat"
SPARSE = "sparse:UHD4096,k=16,epochs=1"
TREE = "tree:branch=4,leaf=8"
# the user's token matrices (no model runs): its codebook is trained on the first batch
MV = "multivector:KMeans16,residual=PQ4,source=user,dim=16"
KINDS = ["lexical", "dense:Flat", HNSW, IVF, SPARSE, TREE, MV]
DEEP = {  # the documented per-shard search depth: exact on this collection
    "dense-hnsw": {"retrieve": [{"index": "dense@hnsw", "k": 10, "params": "efSearch=2000"}]},
    "dense-ivf": {"retrieve": [{"index": "dense@ivf", "k": 10, "params": "nprobe=4"}]},
    # the tree's flat search (every leaf, exact similarity): its trees are per segment
    "tree-flat": {"retrieve": [{"index": "tree", "k": 10, "params": "budget=0"}]},
}
MV_ALL = {"retrieve": [{"index": "multivector", "k": 10,
                        "params": "exhaustive=1,ndocs=100000"}]}
PROFILES = {"lexical": "lexical", "dense": "dense", **DEEP,
            # IVF at its default nprobe: one template (centroids) for every segment and shard
            "dense-ivf-default": {"retrieve": [{"index": "dense@ivf", "k": 10}]},
            "sparse": "sparse", "hybrid": "hybrid",
            # every row to the final MaxSim (``exhaustive=1``, ``ndocs`` past the collection):
            # at default depths the final pass takes ``ndocs`` candidates of the whole
            # collection on one node, of a shard's here
            "multivector-exhaustive": MV_ALL,
            "hybrid-mv-exhaustive": {**HYBRID_MV, "retrieve": HYBRID_MV["retrieve"][:2] + [
                {**MV_ALL["retrieve"][0], "k": 100}]},
            # last: after the other rows' ~1,600 streamed documents (lexical's top 1,000 then
            # ends inside runs of equal scores)
            "ltr": {**LTR, "rerank": {"model": "trees", "window": 100}}}

pytestmark = pytest.mark.skipif(not CACM.is_dir(),
                                reason="../shared/data has no cacm (the shared IR collections)")


def _unit(rng, n: int) -> np.ndarray:
    x = rng.normal(size=(n, 384)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _tokens(rng, n: int) -> np.ndarray:
    """A token matrix (n, 16) clustered around 24 topic directions, as real tokens are."""
    x = _TOPICS[rng.integers(len(_TOPICS), size=n)] + 0.35 * rng.normal(size=(n, 16))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


_TOPICS = np.random.default_rng(16).normal(size=(24, 16))
_TOPICS /= np.linalg.norm(_TOPICS, axis=1, keepdims=True)
_QRNG = np.random.default_rng(17)
QTOKENS = [_tokens(_QRNG, int(_QRNG.integers(4, 10))) for _ in range(12)]


def _cacm(n: int, tokens: bool = False):
    docs = []
    with open(CACM / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            docs.append({"id": str(d["_id"]), "title": d.get("title") or "", "text": d["text"]})
            if len(docs) == n:
                break
    with open(CACM / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f][:12]
    rng = np.random.default_rng(43)
    emb = _unit(rng, len(docs))
    for d, v in zip(docs, emb):  # the named fields carry the same vectors as the default one
        d["vectors"] = {"hnsw": v.tolist(), "ivf": v.tolist()}
    trng = np.random.default_rng(18)  # apart: the embeddings stay what they were
    for d in docs if tokens else ():
        d["tokens"] = _tokens(trng, int(trng.integers(8, 30)))  # ~19 a document
    return docs, emb, queries, list(_unit(rng, len(queries)))


@pytest.fixture(autouse=True)
def full_weight_ranker(tmp_path_factory, monkeypatch):
    from polyindex.rerank import registry
    monkeypatch.setattr(registry, "SHIPPED",
                        trees_models(tmp_path_factory.getbasetemp() / "models"))
    registry.clear_cache()
    yield
    registry.clear_cache()


@contextmanager
def _deployments(tmp_path, n_docs: int):
    docs, emb, queries, qvecs = _cacm(n_docs, tokens=True)
    one_engine = Engine(tmp_path / "one", online=True)
    one = one_engine.create_collection("c", KINDS, segment_size=100)
    sharded = ShardedEngine.in_process(tmp_path / "sharded", shards=2, replicas=2)
    routed = sharded.create_collection("c", KINDS, segment_size=100)
    try:
        for lo in range(0, N_BASE, 250):
            for target in (one, routed):
                target.add(docs[lo:lo + 250], embeddings=emb[lo:lo + 250])
        gone = [docs[i]["id"] for i in range(3, N_BASE, 29)]
        one.delete(gone)
        routed.delete(gone)
        routed.catch_up()
        yield one, routed, sharded, (docs, emb, queries, qvecs), iter(range(N_BASE, n_docs,
                                                                            N_STREAM))
    finally:
        sharded.close()
        one_engine.close()


@pytest.fixture(scope="module")
def deployments(tmp_path_factory):
    """Both deployments, built once for the module (~15 s); each profile's test streams its
    own next ``N_STREAM`` documents into both."""
    with _deployments(tmp_path_factory.mktemp("deployments"),
                      N_BASE + N_STREAM * len(PROFILES)) as made:
        yield made


USING = {"dense-hnsw": "hnsw", "dense-ivf": "ivf", "dense-ivf-default": "ivf"}


def _query(target, profile, queries, qvecs):
    if profile in USING:  # a named vector field's profile takes its query vectors
        return target.query_batch(vectors=qvecs, using=USING[profile], k=10,
                                  profile=PROFILES[profile])
    return target.query_batch(queries, vectors=qvecs, k=10, profile=PROFILES[profile],
                              tokens=QTOKENS[:len(queries)])


def _compare(one, routed, profile, queries, qvecs, where):
    a, b = _query(one, profile, queries, qvecs), _query(routed, profile, queries, qvecs)
    assert sum(len(x) for x in a) >= 8 * len(queries), (profile, where)
    for qi, (x, y) in enumerate(zip(a, b)):
        _same(x, y, f"{profile}, {where}, query {qi}")


@pytest.mark.slow  # ~10 s each (the deployments, ~15 s, built once): a stream into both
@pytest.mark.parametrize("profile", list(PROFILES))
def test_profile_equals_one_node_quiet_and_under_a_streaming_writer(deployments, profile):
    # ltr last: its window reads each stage's top k (lexical's 1,000) after ~1,600 streamed
    # documents, where a run of equal BM25 scores straddles the 1,000th place (which of its
    # members are kept is by id: ``ties.cut_ties``)
    one, routed, sharded, (docs, emb, queries, qvecs), starts = deployments
    assert sharded.backend.n_replicas == 2
    _compare(one, routed, profile, queries, qvecs, "quiet")

    acked = [0]  # batches both deployments acknowledged
    busy = threading.Event()  # a batch is in flight
    failed: list = []

    start = next(starts)

    def stream():
        try:
            for lo in range(start, start + N_STREAM, BATCH):
                busy.set()
                part = slice(lo, lo + BATCH)
                one.add(docs[part], embeddings=emb[part])
                routed.add(docs[part], embeddings=emb[part])
                acked[0] += 1
                busy.clear()
                time.sleep(0.05)  # room for quiet comparisons between batches
        except BaseException as e:  # noqa: BLE001  re-raised by the test below
            failed.append(e)
            busy.clear()

    writer = threading.Thread(target=stream)
    writer.start()
    compared = answered = 0
    while writer.is_alive() or compared < 2:
        before, was_busy = acked[0], busy.is_set()
        routed.catch_up()  # whichever replica answers holds every acknowledged write
        b = _query(routed, profile, queries, qvecs)
        a = _query(one, profile, queries, qvecs)
        answered += 1
        assert all(len(x) == 10 for x in b), (profile, "a sharded answer came back short")
        if not was_busy and not busy.is_set() and acked[0] == before:
            for qi, (x, y) in enumerate(zip(a, b)):
                _same(x, y, f"{profile}, streaming after batch {before}, query {qi}")
            compared += 1
        if not writer.is_alive() and compared >= 2:
            break
    writer.join()
    assert not failed, failed
    assert compared >= 2 and answered >= compared
    routed.catch_up()
    assert routed.count() == one.count()
    _compare(one, routed, profile, queries, qvecs, "after the stream")


@pytest.mark.slow  # 10-30 s each on the shared machine (the sparse projector trains)
@pytest.mark.parametrize("kind,profile", [
    (SPARSE, "sparse"),
    # IVF at its default nprobe, deletes in every shard
    ("dense@ivf:dim=384,metric=ip,IVF8,Flat", {"retrieve": [{"index": "dense@ivf", "k": 10}]}),
    (TREE, DEEP["tree-flat"]),
])
def test_trained_kinds_equal_one_node(tmp_path, kind, profile):
    """One node (embedded: its first segment is its first batch) against 2 x 2 shards given
    the same two batches: the collection's artifact is trained once, on the first batch, and
    every shard holds the same files, byte for byte; answers equal at default depths (the
    tree at its flat setting: its trees are per segment, so its budgeted search is not)."""
    docs, emb, queries, qvecs = _cacm(400)
    for d in docs:
        d["vectors"] = {"ivf": d["vectors"]["ivf"]} if "ivf" in kind else {}
        if not d["vectors"]:
            d.pop("vectors")
    kinds = ["lexical", "dense:Flat", kind]
    one = Engine(tmp_path / "one").create_collection("c", kinds)
    sharded = ShardedEngine.in_process(tmp_path / "sharded", shards=2, replicas=2)
    routed = sharded.create_collection("c", kinds)
    for lo in (0, 200):
        for target in (one, routed):
            target.add(docs[lo:lo + 200], embeddings=emb[lo:lo + 200])
    gone = [docs[i]["id"] for i in range(5, 400, 23)]
    for target in (one, routed):
        target.delete(gone)
    routed.catch_up()
    try:
        using = {"using": "ivf"} if "ivf" in kind else {}
        texts = None if using else queries
        a = one.query_batch(texts, vectors=qvecs, k=10, profile=profile, **using)
        b = routed.query_batch(texts, vectors=qvecs, k=10, profile=profile, **using)
        for qi, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{kind}, query {qi}")
        arts = [sorted((f.relative_to(sh.path / "c"), f.read_bytes())
                       for f in (sh.path / "c" / "artifacts").rglob("*")
                       if f.is_file() and "quality" not in f.parts)
                for sh in sharded.backend.shards]
        if not kind.startswith("tree"):
            assert arts[0] and arts[0] == arts[1]
            mine = sorted(f.relative_to(tmp_path / "one" / "c")
                          for f in (tmp_path / "one" / "c" / "artifacts").rglob("*")
                          if f.is_file() and "quality" not in f.parts)
            assert [f for f, _ in arts[0]] == mine
    finally:
        sharded.close()


def test_a_lost_snapshot_reruns_the_query_and_never_reads_other_rows(tmp_path, monkeypatch):
    """The replica a query's retrieve read no longer holds its snapshot when the rerank asks
    (evicted here; on Ray: the replica died): the router runs the query again, and past
    ``LOST_RETRIES`` says UNAVAILABLE, rather than reading rows of another snapshot."""
    from polyindex.distributed import router as router_mod
    from polyindex.distributed.shard import Shard
    from polyindex.wire.grpc_errors import Unavailable
    docs, emb, queries, qvecs = _cacm(120)
    for d in docs:
        d.pop("vectors")
    one = Engine(tmp_path / "one").create_collection("c", ["lexical", "dense:Flat"])
    sharded = ShardedEngine.in_process(tmp_path / "sharded", shards=2, replicas=2)
    routed = sharded.create_collection("c", ["lexical", "dense:Flat"])
    for target in (one, routed):
        target.add(docs, embeddings=emb)
    routed.catch_up()
    ltr = PROFILES["ltr"]
    want = [[h.id for h in x] for x in one.query_batch(queries[:3], vectors=qvecs[:3], k=10,
                                                       profile=ltr)]
    real, lost = Shard._snapshot_of, []

    def lose_first(self, name, token):  # the query's first rerank call loses its snapshot
        if token is not None and not lost:
            lost.append(token)
            self._pinned.pop(token, None)
            return None
        lost.append(None)
        return real(self, name, token)

    monkeypatch.setattr(Shard, "_snapshot_of", lose_first)
    got = routed.query_batch(queries[:3], vectors=qvecs[:3], k=10, profile=ltr)
    assert [[h.id for h in x] for x in got] == want
    assert any(t is not None for t in lost)  # it was lost, and the rerun answered
    monkeypatch.setattr(Shard, "_snapshot_of", lambda self, name, token: None)
    with pytest.raises(Unavailable, match="lost between retrieve and rerank"):
        routed.query_batch(queries[:3], vectors=qvecs[:3], k=10, profile=ltr)
    assert router_mod.LOST_RETRIES >= 1
    sharded.close()


def _qualities(snapshots) -> dict[str, float]:
    out = {}
    for snap in snapshots:
        for seg in snap.segments:
            for i, q in zip(seg.docs.ids_at(np.arange(seg.docs.n_rows)), seg.docs.quality()):
                out[i] = float(q)
    return out


def test_document_quality_is_one_language_model_across_shards(tmp_path):
    """The quality feature's language model is the collection's, not each shard's: the
    router's first batch, whole, on every shard, as one node computes it from its first
    segment (here: the same batch)."""
    docs, emb, _, _ = _cacm(200)
    for d in docs:
        d.pop("vectors")
    sharded = ShardedEngine.in_process(tmp_path / "sharded", shards=2, replicas=2)
    routed = sharded.create_collection("c", ["lexical", "dense:Flat"])
    routed.add(docs[:150], embeddings=emb[:150])
    routed.add(docs[150:], embeddings=emb[150:])  # a later batch: the stored model
    routed.seal()
    shards = sharded.backend.shards
    got = _qualities([sh.engine.collection("c").view() for sh in shards])
    lm = [(sh.path / "c" / "artifacts" / "quality" / "lm.npz").read_bytes() for sh in shards]
    sharded.close()
    assert lm[0] == lm[1]
    assert set(got) == {d["id"] for d in docs} and not np.isnan(list(got.values())).any()
    # one node given the same batches: its first segment (the first batch) made its model
    with Engine(tmp_path / "one150") as eng:
        ref = eng.create_collection("c", ["lexical", "dense:Flat"])
        ref.add(docs[:150], embeddings=emb[:150])
        ref.add(docs[150:], embeddings=emb[150:])
        want = _qualities([ref.view()])
    np.testing.assert_allclose([got[i] for i in want], [want[i] for i in want], rtol=1e-6)
