"""A server loads its collections' text models when it starts, not at the first query
(issue 37): health answers NOT_SERVING until they are ready, the load is logged, and the
first hybrid query after SERVING answers quickly. Real servers on loopback, the real model."""
from __future__ import annotations

import re
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import start_server, stop_server

from polyindex.client.remote import Client

DOCS = [{"id": "wing", "text": "flutter of a swept wing at transonic speed"},
        {"id": "heat", "text": "heat transfer in hypersonic flow"},
        {"id": "cake", "text": "chocolate cake with butter"}]
FIRST_QUERY_S = 5.0  # the model's 20-40 s load is what this keeps out of the first query


def start(data, *extra):
    return start_server(data, *extra)


def stop(proc) -> str:
    """SIGTERM; the server's stderr."""
    code, err = stop_server(proc)
    assert code == 0, err[-3000:]
    return err


def health_until_serving(address: str, deadline_s: float = 240.0) -> list[str]:
    """The statuses health answered, polled until SERVING."""
    seen = []
    end = time.monotonic() + deadline_s
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < end:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=10,
                                wait_for_ready=True).status
            name = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            if not seen or seen[-1] != name:
                seen.append(name)
            if name == "SERVING":
                return seen
            time.sleep(0.1)
    raise AssertionError(f"not SERVING within {deadline_s} s: {seen}")


def first_hybrid_query_s(address: str) -> float:
    with Client(address) as c:
        start = time.perf_counter()
        hits = c.collection("c").query("hypersonic heat flow", profile="hybrid", k=2)
        took = time.perf_counter() - start
    assert hits[0].id == "heat"
    return took


@pytest.mark.slow  # the model loads in three server processes: 1-3 minutes on 2 busy cores
def test_models_load_when_the_server_starts_and_health_waits_for_them(tmp_path):
    data = tmp_path / "data"
    # A collection created through a running server: its model loads at creation
    proc, address = start(data)
    with Client(address) as c:
        c.create_collection("c", ["lexical", "dense"], dtype="float32").add(DOCS)
    err = stop(proc)
    assert "polyindex: loading model all-MiniLM-L6-v2 for collections c" in err, err
    assert re.search(r"polyindex: model all-MiniLM-L6-v2 ready in [\d.]+ s", err), err

    # A fresh server over it: NOT_SERVING while the model loads, then SERVING; the first
    # hybrid query pays no load
    proc, address = start(data)
    try:
        seen = health_until_serving(address)
        took = first_hybrid_query_s(address)
    finally:
        err = stop(proc)
    assert seen == ["NOT_SERVING", "SERVING"], seen
    assert took < FIRST_QUERY_S, f"the first hybrid query took {took:.1f} s"
    assert "polyindex: loading model all-MiniLM-L6-v2 for collections c" in err, err
    assert re.search(r"polyindex: model all-MiniLM-L6-v2 ready in [\d.]+ s", err), err

    # Every worker of a group loads it at its start (each answers health for itself)
    proc, address = start(data, "--processes", "2")
    try:
        serving = every_worker_serving(address)
        took = first_hybrid_query_s(address)
    finally:
        err = stop(proc)
    assert len(serving) == 2, serving
    assert took < FIRST_QUERY_S, f"the first hybrid query took {took:.1f} s"
    assert err.count("polyindex: loading model all-MiniLM-L6-v2 for collections c") == 2, err
    assert len(re.findall(r"polyindex: model all-MiniLM-L6-v2 ready in [\d.]+ s", err)) == 2, err


def every_worker_serving(address: str, deadline_s: float = 240.0) -> set[int]:
    """The pids of a group's workers, once each answered SERVING on its own connection."""
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
    serving: set[int] = set()
    end = time.monotonic() + deadline_s
    while len(serving) < 2:
        assert time.monotonic() < end, f"only {serving} SERVING within {deadline_s} s"
        # its own connection: grpcio channels of one process otherwise share one per target
        with grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)]) as ch:
            pid = pb_grpc.PolyindexStub(ch).Stats(pb.StatsRequest(), timeout=10,
                                                  wait_for_ready=True).process.pid
            status = health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=10).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                serving.add(pid)
        time.sleep(0.1)
    return serving
