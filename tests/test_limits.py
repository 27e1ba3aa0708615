"""Issue 37: nothing a request asks for can hurt the server.

A real ``polyindex serve`` in a subprocess on loopback: absurd index factory strings are
refused within 2 s naming the parameter while the server stays small, every request path's
cap is enforced over gRPC with the right code, and SIGTERM stops the server within its
documented bound with a call in flight, losing no acknowledged write.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest

from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service.shutdown import bound
from polyindex.types import (MAX_BATCH, MAX_FIELDS, MAX_FILTER_DEPTH, MAX_FILTER_NODES, MAX_IDS,
                             MAX_INDEXES, MAX_K, MAX_MESSAGE_BYTES, MAX_TEXT_CHARS,
                             MAX_UPSERT_RECORDS, MAX_VECTOR_DIMS)

INVALID, EXHAUSTED = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED


class Served:
    def __init__(self, data: Path, env: dict | None = None):
        self.err_path = data.parent / f"{data.name}.stderr"
        self.err = open(self.err_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "polyindex.cli.main", "serve", "--data", str(data),
             "--host", "127.0.0.1", "--port", "0"], stdout=subprocess.PIPE, stderr=self.err,
            text=True, env={**os.environ, **(env or {})})
        line = self.proc.stdout.readline()
        m = re.search(r"serving on (\S+)", line)
        assert m, f"server did not start: {line!r} {self.err_path.read_text()[-2000:]}"
        self.channel = grpc.insecure_channel(m.group(1))
        self.stub = pb_grpc.PolyindexStub(self.channel)

    def rss_kb(self, field: str = "VmHWM") -> int:
        """The server's peak (VmHWM) or current (VmRSS) resident memory, from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} for pid {self.proc.pid}")

    def stop(self) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds to exit)."""
        start = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout=bound() + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.channel.close()
            self.err.close()
        return code, time.monotonic() - start

    def log(self) -> str:
        return self.err_path.read_text()


def status_of(call, *args, **kw) -> tuple[grpc.StatusCode, str, float]:
    start = time.monotonic()
    try:
        call(*args, timeout=30, **kw)
    except grpc.RpcError as e:
        return e.code(), e.details(), time.monotonic() - start
    return grpc.StatusCode.OK, "", time.monotonic() - start


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    # the budget the absurd strings are measured against, whatever this machine's memory
    s = Served(tmp_path_factory.mktemp("limits") / "data", {"POLYINDEX_INDEX_MEMORY_MB": "1024"})
    yield s
    code, took = s.stop()
    assert code == 0 and took < bound(), (code, took, s.log()[-2000:])


# -- index factory strings: parsed and bounded, never built --------------------------------------
ABSURD = [  # (indexes, code, words the message must hold)
    (["dense:IVF99999999,PQ3"], EXHAUSTED, ["IVF's nlist", "99999999"]),
    (["dense:HNSW99999999,Flat"], EXHAUSTED, ["HNSW's M", "99999999"]),
    (["dense@x:dim=8,PQ16"], INVALID, ["PQ's M", "16"]),  # more sub-quantizers than dims
    (["dense@x:dim=1000000000,Flat"], INVALID, ["dim", "1000000000"]),
    (["dense@x:dim=65536,OPQ64,PQ64"], EXHAUSTED, ["OPQ64", "memory budget"]),
    (["dense@x:dim=8192,PQ64x16"], EXHAUSTED, ["PQ64x16", "memory budget"]),
    (["dense:PQ8x99999999"], EXHAUSTED, ["PQ's bits"]),
    (["dense:IVF1024(HNSW99999999),Flat"], INVALID, ["not a valid faiss index factory"]),
    (["dense:NSG99999999"], INVALID, ["'NSG99999999'"]),
    (["dense:PCA99999999,Flat"], INVALID, ["PCA's output dimension"]),
    (["multivector:KMeans99999999"], INVALID, ["k must be in", "99999999"]),
    (["multivector:KMeans65536,source=user,dim=65536"], EXHAUSTED, ["KMeans65536", "budget"]),
    (["multivector:KMeans64,residual=OPQ8_999999999"], INVALID, ["opq_dim"]),
    (["sparse:UHD999999999"], INVALID, ["D must be in", "999999999"]),
    (["sparse:UHD4096,k=99999999"], INVALID, ["k must be in"]),
    (["tree:branch=99999999"], INVALID, ["branch"]),
    (["tree:leaf=99999999"], INVALID, ["leaf"]),
    (["lexical:bm25,k1=1e308,b=99"], INVALID, ["b must be in"]),
    ([f"dense@f{i}:dim=4,Flat" for i in range(MAX_INDEXES + 1)], EXHAUSTED, ["indexes", "max"]),
]


def test_absurd_create_collection_is_refused_fast_and_small(served):
    for i, (indexes, code, words) in enumerate(ABSURD):
        got, details, took = status_of(served.stub.CreateCollection, pb.CreateCollectionRequest(
            name=f"absurd{i}", indexes=indexes, model="none"))
        assert got == code, (indexes, got, details)
        for w in words:
            assert w in details, (indexes, details)
        assert took < 2.0, (indexes, took)
        assert served.rss_kb() < 1 << 20, (indexes, served.rss_kb())  # peak RSS under 1 GB
    assert served.stub.ListCollections(pb.ListCollectionsRequest(), timeout=10).names == []


# -- caps of every request path, over gRPC ------------------------------------------------------
@pytest.fixture(scope="module")
def caps(served):
    served.stub.CreateCollection(pb.CreateCollectionRequest(
        name="caps", indexes=["lexical", "dense@v:dim=4,Flat"], model="none"), timeout=30)
    doc = pb.Document(id="a", text="alpha beta", vectors={"v": pb.Vector(values=[1, 0, 0, 0])})
    assert served.stub.Upsert(iter([pb.UpsertRequest(collection="caps", documents=[doc])]),
                              timeout=30).upserted == 1
    return served.stub


def _nested(depth: int) -> dict:
    spec = {"lang": "en"}
    for _ in range(depth):
        spec = {"not": spec}
    return spec


QUERY_CAPS = [  # (request fields, code, words)
    ({"text": "alpha", "k": MAX_K + 1}, EXHAUSTED, ["k must be", str(MAX_K)]),
    ({"batch": [pb.QueryItem(text="alpha")] * (MAX_BATCH + 1)}, EXHAUSTED,
     ["batch", str(MAX_BATCH)]),
    ({"text": "a" * (MAX_TEXT_CHARS + 1)}, INVALID, ["text", str(MAX_TEXT_CHARS)]),
    ({"vectors": {"v": pb.Vector(values=[0.5] * (MAX_VECTOR_DIMS + 1))}}, INVALID,
     ["'v'", str(MAX_VECTOR_DIMS)]),
    ({"vectors": {"v": pb.Vector(values=[0.5] * 5)}}, INVALID, ["dimension", "5", "4"]),
    ({"text": "alpha", "filter": None, "_filter": {"lang": {"in": ["x"] * MAX_FILTER_NODES}}},
     INVALID, ["filter", "nodes", str(MAX_FILTER_NODES)]),
    ({"text": "alpha", "filter": None, "_filter": _nested(MAX_FILTER_DEPTH)}, INVALID,
     ["filter", "deep", str(MAX_FILTER_DEPTH)]),
]


@pytest.mark.parametrize("fields,code,words", QUERY_CAPS)
def test_query_caps(caps, fields, code, words):
    from polyindex.wire.convert import to_struct
    fields = dict(fields)
    spec = fields.pop("_filter", None)
    fields.pop("filter", None)
    req = pb.QueryRequest(collection="caps", **fields)
    if spec is not None:
        req.filter.CopyFrom(to_struct(spec))
    got, details, took = status_of(caps.Query, req)
    assert got == code, (got, details)
    assert all(w in details for w in words), details
    assert took < 2.0


def test_get_and_delete_caps(caps):
    ids = [f"x{i}" for i in range(MAX_IDS + 1)]
    for call, req in ((caps.Get, pb.GetRequest(collection="caps", ids=ids)),
                      (caps.Delete, pb.DeleteRequest(collection="caps", ids=ids))):
        got, details, _ = status_of(call, req)
        assert got == EXHAUSTED and "ids" in details and str(MAX_IDS) in details, details
    assert list(caps.Get(pb.GetRequest(collection="caps", ids=["a"]), timeout=10).found) == [True]


def test_upsert_caps(caps):
    def stream(n, per=25_000):
        for start in range(0, n, per):
            yield pb.UpsertRequest(collection="caps", documents=[
                pb.Document(id=f"u{i}", text="t") for i in range(start, min(n, start + per))])
    got, details, _ = status_of(caps.Upsert, stream(MAX_UPSERT_RECORDS + 1))
    assert got == EXHAUSTED and "Upsert documents" in details, details
    assert str(MAX_UPSERT_RECORDS) in details
    big = pb.Document(id="big", text="x" * MAX_MESSAGE_BYTES)  # one message over gRPC's cap
    got, details, _ = status_of(caps.Upsert, iter([pb.UpsertRequest(collection="caps",
                                                                     documents=[big])]))
    assert got == EXHAUSTED, details
    got = caps.Get(pb.GetRequest(collection="caps", ids=["u0", "big"]), timeout=10)
    assert list(got.found) == [False, False]  # nothing of either stream was written


def test_create_collection_caps(caps):
    for req, code, words in [
        (pb.CreateCollectionRequest(name="n" * 129, indexes=["lexical"], model="none"),
         INVALID, ["name", "1-128"]),
        (pb.CreateCollectionRequest(name="f", indexes=["lexical"], model="none",
                                    fields={f"f{i}": "int" for i in range(MAX_FIELDS + 1)}),
         EXHAUSTED, ["fields", str(MAX_FIELDS)]),
        (pb.CreateCollectionRequest(name="s", indexes=["lexical"], model="none",
                                    segment_size=10**12), INVALID, ["segment_size", "10,000,000"]),
    ]:
        got, details, _ = status_of(caps.CreateCollection, req)
        assert got == code and all(w in details for w in words), (got, details)


# -- SIGTERM: bounded, with a call in flight, acknowledged writes kept ----------------------------
@pytest.mark.slow  # three server starts and a stop at its bound: ~25 s
def test_sigterm_stops_within_the_bound_with_a_call_in_flight(tmp_path):
    # the close's seal never returns (a stand-in for a first seal training for minutes)
    env = {"POLYINDEX_FAILPOINTS": "commit.segment.write=hang",
           "POLYINDEX_SHUTDOWN_GRACE_S": "1", "POLYINDEX_SHUTDOWN_SEAL_S": "2"}
    limit = bound(1, 2)
    s = Served(tmp_path / "data", env)
    s.stub.CreateCollection(pb.CreateCollectionRequest(name="c", indexes=["lexical"],
                                                       model="none"), timeout=30)
    docs = [pb.Document(id=f"d{i}", text=f"acknowledged {i}") for i in range(3)]
    ack = s.stub.Upsert(iter([pb.UpsertRequest(collection="c", documents=docs)]), timeout=30)
    assert ack.upserted == 3

    def slow_stream():  # an Upsert whose stream stays open: in flight when SIGTERM comes
        yield pb.UpsertRequest(collection="c", documents=[pb.Document(id="late", text="x")])
        time.sleep(60)

    answer = {}
    t = threading.Thread(target=lambda: answer.update(code=status_of(
        s.stub.Upsert, slow_stream())[0]), daemon=True)
    t.start()
    time.sleep(1.0)
    code, took = s.stop()
    log = s.log()
    assert took < limit + 1.0, (took, limit, log[-2000:])
    assert code == 0, log[-2000:]
    assert "waiting up to 1 s for 1 Upsert in flight" in log, log[-2000:]
    assert "sealing c (3 documents)" in log and "exiting now" in log, log[-2000:]
    t.join(10)
    assert answer.get("code") not in (None, grpc.StatusCode.OK)  # cut off, not written

    s = Served(tmp_path / "data")  # the WAL replays the acknowledged writes
    try:
        got = s.stub.Get(pb.GetRequest(collection="c", ids=["d0", "d1", "d2", "late"]), timeout=30)
        assert list(got.found) == [True, True, True, False]
        assert [d.text for d in got.documents[:3]] == [f"acknowledged {i}" for i in range(3)]
    finally:
        code, took = s.stop()
    assert code == 0 and took < bound(), (took, s.log()[-2000:])


def test_the_readme_limits_table_is_the_code():
    """README's "Limits" table states the caps ``polyindex.types`` enforces."""
    from polyindex import types
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("### Limits", 1)[1].split("\n\n", 3)[2]
    for cap, shown in [(types.MAX_K, "10,000"), (types.MAX_BATCH, "1,024"),
                       (types.MAX_TEXT_CHARS, "8,192 characters"),
                       (types.MAX_VECTOR_DIMS, "65,536 dimensions"),
                       (types.MAX_FILTER_NODES, "1,024 JSON nodes"),
                       (types.MAX_FILTER_DEPTH, "32 levels"), (types.MAX_IDS, "10,000"),
                       (types.MAX_SCROLL, "page (`limit`) | 10,000"),
                       (types.MAX_UPSERT_RECORDS, "100,000"), (types.MAX_ID_CHARS, "1,024 char"),
                       (types.MAX_INDEXES, "16, "), (types.MAX_FIELDS, "256 |")]:
        assert shown in table and f"{cap:,}" in shown, (cap, shown)
    assert types.MAX_UPSERT_BYTES == 1 << 30 and "1 GiB" in table
    assert types.MAX_MESSAGE_BYTES == 64 << 20 and "64 MiB" in table


FAISS_STRINGS = ["Flat", "HNSW32", "HNSW16,Flat", "HNSW32,PQ8", "HNSW32,SQ8", "HNSW32,SQfp16",
                 "IVF16,Flat", "IVF16,PQ8", "IVF16,PQ8x4fs", "IVF16_HNSW32,Flat", "IVF16,SQ8",
                 "IVF16,SQfp16", "PQ8", "PQ8x4fs", "SQ4", "SQ8", "SQbf16", "OPQ8,PQ8",
                 "OPQ8_64,IVF16,PQ8", "PCA64,Flat", "PCAR64,IVF16,Flat", "RR64,Flat",
                 "L2norm,HNSW32,Flat", "IVF16,PQ8,RFlat", "PQ8,Refine(Flat)", "Flat,RFlat"]


@pytest.mark.parametrize("dim", [96, 128])
def test_the_parse_knows_what_faiss_would_build(dim):
    """What the plan says without building (trains, keeps the exact vectors) is what faiss's
    empty index says, for every form the grammar takes; faiss accepts each of them."""
    import faiss

    from polyindex.index.dense import faiss_factory
    for s in FAISS_STRINGS:
        plan = faiss_factory.check(s, dim)
        index = faiss.index_factory(dim, s, faiss.METRIC_INNER_PRODUCT)  # owns what downcast views
        keeps = isinstance(faiss.downcast_index(index),
                           (faiss.IndexFlat, faiss.IndexHNSWFlat, faiss.IndexIVFFlat))
        assert (plan.trains, plan.keeps_vectors) == (not index.is_trained, keeps), s


def test_a_field_without_a_declared_dim_trains_any_valid_pq(tmp_path):
    """PQ6 divides a 12-d field but not the dimension the check assumes before the first
    segment: the collection trains and answers (nothing is probed at a made-up dimension)."""
    import numpy as np

    import polyindex
    rng = np.random.default_rng(0)
    x = rng.standard_normal((300, 12)).astype(np.float32)
    with polyindex.open(tmp_path / "d") as eng:
        coll = eng.create_collection("v", ["dense:PQ6x4"], model=None)
        coll.add([{"id": f"d{i}", "vector": x[i].tolist()} for i in range(len(x))])
        coll.seal()
        hits = coll.query(vector=x[7].tolist(), k=3)
    assert hits[0].id == "d7"


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


@pytest.mark.slow  # loads the embedding model
def test_an_upsert_whose_call_is_over_stops_encoding(tmp_path):
    """The model's encoding of an Upsert stops at its next chunk once the call is over (here
    its deadline passed); nothing of it is written and the server goes idle."""
    s = Served(tmp_path / "data")
    try:
        s.stub.CreateCollection(pb.CreateCollectionRequest(name="c", indexes=["lexical", "dense"]),
                                timeout=60)
        warm = pb.UpsertRequest(collection="c", documents=[pb.Document(id="w", text="warm up")])
        assert s.stub.Upsert(iter([warm]), timeout=300).upserted == 1  # the model is loaded
        words = "river flow bank water stone bridge city light night day".split()
        docs = [pb.Document(id=f"d{i}", text=" ".join(words[(i + j) % 10] for j in range(60)))
                for i in range(4000)]
        got, _, _ = status_of(lambda r, **kw: s.stub.Upsert(r, **{**kw, "timeout": 3}),
                              iter([pb.UpsertRequest(collection="c", documents=docs)]))
        assert got == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(3)  # the chunk under way finishes
        before = _cpu_s(s.proc.pid)
        time.sleep(3)
        busy = _cpu_s(s.proc.pid) - before
        assert busy < 0.5, f"the server still worked {busy:.1f} s of CPU in 3 s"
        found = s.stub.Get(pb.GetRequest(collection="c", ids=["d0", "d3999", "w"]), timeout=30)
        assert list(found.found) == [False, False, True]
    finally:
        code, took = s.stop()
    assert code == 0 and took < bound(), (took, s.log()[-2000:])


def test_an_ivf_with_more_lists_than_vectors_is_searched_exactly_until_it_can_train(tmp_path):
    """IVF<n> given fewer than n vectors (faiss's own error was an unexpected RuntimeError:
    INTERNAL): the segment is built exact and answers; a later batch with enough trains."""
    import numpy as np

    import polyindex
    x = np.random.default_rng(0).standard_normal((80, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # each vector's best inner product: itself
    with polyindex.open(tmp_path / "d") as eng:
        coll = eng.create_collection("v", ["dense:IVF64,Flat"], model=None)
        assert coll.add([{"id": f"d{i}", "vector": x[i].tolist()} for i in range(10)]) == 10
        assert coll.query(vector=x[3], k=1)[0].id == "d3"
        coll.add([{"id": f"d{i}", "vector": x[i].tolist()} for i in range(10, 80)])
        assert coll.count() == 80 and coll.query(vector=x[42], k=1)[0].id == "d42"
