"""The benches' C++ load client (bench/native/grpc_load.cc, issue 38 part 4) makes real gRPC
calls over loopback TCP to a real server and counts what came back: every call it sends is
answered, OK answers are counted as OK and failures as failures."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import start_server, stop_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import load_client  # noqa: E402

LIST = "/polyindex.v1.Polyindex/ListCollections"
QUERY = "/polyindex.v1.Polyindex/Query"


@pytest.fixture(scope="module")
def client_binary() -> Path:
    try:
        return load_client.binary()
    except load_client.LoadClientUnavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def server(tmp_path_factory, client_binary):
    """A real server (its default front end: the client does not care which) with one
    collection of three documents."""
    from polyindex.client.remote import Client
    proc, address = start_server(tmp_path_factory.mktemp("load") / "data")
    try:
        with Client(address) as c:
            coll = c.create_collection("docs", ["lexical"], model=None)
            coll.add([{"id": str(i), "text": f"document {i} about ships"} for i in range(3)])
        yield address
    finally:
        stop_server(proc)


def test_n_calls_from_several_processes_get_n_ok_answers(server):
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    requests = [pb.QueryRequest(collection="docs", text=t, profile="lexical", k=2)
                .SerializeToString() for t in ("ships", "document 1")]
    res = load_client.run(server, QUERY, requests, clients=3, seconds=60, max_calls=40,
                          warmup=2)
    assert (res["calls"], res["ok"], res["errors"]) == (120, 120, 0), res
    assert res["first_error"] is None
    assert res["client_cpu_us_per_call"] > 0 and res["p50_ms"] > 0


def test_failed_calls_are_counted_as_failures_with_the_servers_status(server):
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    bad = pb.QueryRequest(collection="nope", text="x").SerializeToString()
    res = load_client.run(server, QUERY, [bad], clients=2, seconds=60, max_calls=10, warmup=1)
    assert (res["calls"], res["ok"], res["errors"]) == (20, 0, 20), res
    assert res["first_error"].startswith("5: ") and "nope" in res["first_error"]  # NOT_FOUND


def test_bad_arguments_and_files_are_refused_with_a_reason(client_binary, tmp_path):
    reqs = load_client.write_requests(tmp_path / "r.bin", [b"abc"])
    too_long = subprocess.run([client_binary, "127.0.0.1:1", LIST, reqs, "--seconds", "601"],
                              capture_output=True, text=True)
    assert too_long.returncode == 2 and "--seconds must be in (0, 600]" in too_long.stderr
    cut = tmp_path / "cut.bin"
    cut.write_bytes(reqs.read_bytes()[:-1])
    short = subprocess.run([client_binary, "127.0.0.1:1", LIST, cut], capture_output=True,
                           text=True)
    assert short.returncode == 2 and "message 0 is cut short" in short.stderr
