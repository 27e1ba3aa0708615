"""Malformed requests, hypothesis-driven: every one gets a clear status, the server keeps
serving, and nothing acknowledged is lost."""
from __future__ import annotations

import grpc
import pytest
from google.protobuf.struct_pb2 import Struct
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyindex.client.remote import Client
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.service.server import serve

DOCS = [{"id": f"d{i}", "text": f"sturdy document number {i} about topic {i % 5}"} for i in range(40)]
EXPECTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNIMPLEMENTED,
            grpc.StatusCode.INTERNAL, grpc.StatusCode.ALREADY_EXISTS}
SENT = {"n": 0}
FUZZ = settings(max_examples=250, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def server(tmp_path_factory, frontend):
    srv = serve(tmp_path_factory.mktemp("fuzz"), port=0, frontend=frontend)
    SENT["n"] = 0  # counted per front end
    with Client(srv.address) as c:
        c.create_collection("c", ["lexical"]).add(DOCS)
    yield srv
    srv.stop(grace=2)


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.address) as ch:
        yield ch


def call_raw(channel, method: str, payload: bytes, stream: bool = False):
    """Send bytes as they are: the server must parse and judge them."""
    ident = lambda b: b  # noqa: E731
    SENT["n"] += 1
    if stream:
        rpc = channel.stream_unary(f"/polyindex.v1.Polyindex/{method}", ident, ident)
        return rpc(iter([payload]), timeout=10)
    return channel.unary_unary(f"/polyindex.v1.Polyindex/{method}", ident, ident)(payload, timeout=10)


def expect_clean_status(fn):
    try:
        fn()
    except grpc.RpcError as e:
        assert e.code() in EXPECTED, f"unexpected status {e.code()}: {e.details()}"
        assert e.details(), "an error status without a message"
        if e.code() == grpc.StatusCode.INTERNAL:
            # parse failures of garbage bytes are reported by grpc itself as INTERNAL
            assert "deserializ" in e.details().lower() or "parse" in e.details().lower(), e.details()


METHODS = ["Query", "Delete", "Get", "CreateCollection", "DropCollection", "DescribeCollection",
           "ListCollections", "Stats"]


@FUZZ
@given(method=st.sampled_from(METHODS), payload=st.binary(max_size=300))
def test_garbage_bytes(channel, method, payload):
    if method in ("DropCollection",):  # a valid parse of garbage could name a real collection
        payload = b"\x0a\x03zzz" + payload
    expect_clean_status(lambda: call_raw(channel, method, payload))


@FUZZ
@given(payload=st.binary(max_size=300))
def test_garbage_upsert_streams(channel, payload):
    expect_clean_status(lambda: call_raw(channel, "Upsert", payload, stream=True))


floats = st.floats(allow_nan=True, allow_infinity=True, width=32)
json_values = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=10),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=8)


def struct(d):
    s = Struct()
    s.update(d)
    return s


@FUZZ
@given(collection=st.sampled_from(["c", "nope", "../x", ""]), text=st.none() | st.text(max_size=50),
       vector=st.lists(floats, max_size=8), profile=st.sampled_from(["", "lexical", "hybrid", "zzz", "dense"]),
       k=st.none() | st.integers(min_value=-5, max_value=20_000),
       flt=st.none() | st.dictionaries(st.text(max_size=6), json_values, max_size=3),
       inline=st.none() | st.dictionaries(st.sampled_from(["retrieve", "fuse", "rerank", "x"]), json_values, max_size=3))
def test_wrong_query_messages(channel, collection, text, vector, profile, k, flt, inline):
    req = pb.QueryRequest(collection=collection, vector=vector)
    if text is not None:
        req.text = text
    if inline is not None:
        req.inline_profile.CopyFrom(struct(inline))
    elif profile:
        req.profile = profile
    if k is not None:
        req.k = k
    if flt is not None:
        req.filter.CopyFrom(struct(flt))
    expect_clean_status(lambda: call_raw(channel, "Query", req.SerializeToString()))


@FUZZ
@given(docs=st.lists(st.fixed_dictionaries({"id": st.text(max_size=12), "title": st.text(max_size=8),
                                            "text": st.text(max_size=30)}), max_size=4),
       collection=st.sampled_from(["c", "nope", ""]), total=st.none() | st.integers(-2, 6))
def test_wrong_upserts(channel, docs, collection, total):
    req = pb.UpsertRequest(collection=collection, documents=[pb.Document(**d) for d in docs])
    if total is not None:
        req.expected_total = total
    # Valid rows may legitimately be written; only the collection "c" can receive them.
    expect_clean_status(lambda: call_raw(channel, "Upsert", req.SerializeToString(), stream=True))


def test_after_the_fuzz_the_server_answers_and_lost_nothing(server):
    assert SENT["n"] >= 1000, f"only {SENT['n']} malformed requests were sent"
    with Client(server.address) as c:
        coll = c.collection("c")
        got = coll.get([d["id"] for d in DOCS])
        # fuzzed upserts may have rewritten an id only with a well-formed document
        assert all(g is not None for g in got)
        assert [h.id for h in coll.query("sturdy topic", profile="lexical", k=3)]
        assert coll.count() >= len(DOCS)
