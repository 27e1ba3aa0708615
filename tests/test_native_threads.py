"""The native front end keeps its threads (issue 38 part 4): gRPC's sync server used to end a
thread after a call whenever two were idle and start another for the next call, so a busy
server made a thread (and a Python thread state) every few calls."""
from __future__ import annotations

import os
import threading

import pytest

from conftest import NEEDS_NATIVE, start_server, stop_server

PATH = "/polyindex.v1.Polyindex/ListCollections"  # answered by the Python servicer


def tids(pid: int) -> set[str]:
    return set(os.listdir(f"/proc/{pid}/task"))


@NEEDS_NATIVE
def test_calls_reuse_the_servers_threads(tmp_path):
    from polyindex.client.remote import _grpc_channel
    if _grpc_channel is None:
        pytest.skip("the native client channel is not built (make native)")
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    proc, address = start_server(tmp_path / "data", "--frontend", "native", "--workers", "8")
    try:
        request = pb.ListCollectionsRequest().SerializeToString()
        errors: list[str] = []

        def client(calls: int) -> None:
            ch = _grpc_channel.Channel(address, False, None, 4 << 20)
            for _ in range(calls):
                code = ch.unary(PATH, request, 30.0, ())[0]
                if code != 0:
                    errors.append(f"status {code}")
            ch.close()

        def burst(clients: int, calls: int) -> None:
            threads = [threading.Thread(target=client, args=(calls,)) for _ in range(clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()

        burst(8, 20)  # the server grows to what 8 clients need
        before = tids(proc.pid)
        seen: set[str] = set()
        done = threading.Event()

        def watch() -> None:  # every thread that lives for a moment (a churned one is brief)
            while not done.is_set():
                seen.update(tids(proc.pid))
                done.wait(0.001)
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            burst(1, 200)
            burst(8, 50)
        finally:
            done.set()
            watcher.join()
        new = seen - before
        assert not errors
        # a few may still be started (a poller short for a moment); one per call was the bug
        assert len(new) <= 8, f"{len(new)} new server threads over 600 calls"
    finally:
        stop_server(proc)
