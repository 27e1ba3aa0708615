"""``polyindex serve --processes 2``: real processes, real gRPC on loopback (issue 19).

Fresh connections are spread over the processes by the kernel (SO_REUSEPORT); each test
connection asks Stats which process it reached (one channel is one connection), so a write
can be sent through the follower and through the writer on purpose. Visibility is checked on
every process with a generous deadline (the bound is documented, 50 ms; no timing asserts).
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import grpc
import pytest

from conftest import start_server

from polyindex.client.remote import Client
from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.wire.grpc_errors import Unavailable

DEADLINE_S = 20.0  # process starts and restarts on a busy 2-core machine; never a timing goal


def start(data, *extra, env=None):
    return start_server(data, "--processes", "2", *extra, env=env)


def stop(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too (not yet reaped by a parent that is gone)
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def eventually(check, what: str, deadline_s: float = DEADLINE_S):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            if check():
                return
        except (grpc.RpcError, Unavailable):
            pass  # a process restarting: connections in its accept queue are reset
        assert time.monotonic() < deadline, f"not within {deadline_s} s: {what}"
        time.sleep(0.02)


class Conn:
    """One channel (one connection, to one process) and the process it reached."""

    def __init__(self, address: str):
        # its own connection: grpcio channels of one process otherwise share one per target
        self.channel = grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)])
        self.stub = pb_grpc.PolyindexStub(self.channel)
        p = self.stub.Stats(pb.StatsRequest(), timeout=10, wait_for_ready=True).process
        self.pid, self.role = p.pid, p.role

    def has(self, doc_id: str) -> bool:
        return self.stub.Get(pb.GetRequest(collection="c", ids=[doc_id]), timeout=10).found[0]

    def upsert(self, doc_id: str, text: str) -> int:
        msg = pb.UpsertRequest(collection="c", documents=[pb.Document(id=doc_id, text=text)])
        return self.stub.Upsert(iter([msg]), timeout=30).upserted


def connect_to(address: str, role: str, tries: int = 200, must: bool = True) -> Conn | None:
    for _ in range(tries):
        c = Conn(address)
        if c.role == role:
            return c
        c.channel.close()
    if must:
        raise AssertionError(f"{tries} fresh connections never reached the {role}")
    return None


def pid_of(address: str, role: str) -> int | None:
    c = connect_to(address, role, tries=20, must=False)
    if c is None:
        return None
    c.channel.close()
    return c.pid


@pytest.fixture(scope="module")
def group(tmp_path_factory, frontend):
    data = tmp_path_factory.mktemp("group")
    proc, address = start(data, "--metrics-port", "0", "--frontend", frontend)
    with Client(address) as c:
        c.create_collection("c", ["lexical"]).add(
            [{"id": f"d{i}", "text": f"alpha river {i}"} for i in range(20)])
    yield proc, address
    if proc.poll() is None:
        stop(proc)


def test_queries_over_fresh_connections_reach_both_processes(group):
    _, address = group
    served = set()
    for _ in range(60):
        with Client(address, transport="python") as c:  # a fresh connection each time
            hits = c.collection("c").query("alpha river", profile="lexical", k=5)
            assert len(hits) == 5
    with Client(address) as c:
        stats = c.stats(processes=True)
    roles = sorted(p["role"] for p in stats["processes"])
    assert roles == ["follower", "writer"], stats["processes"]
    served = {p["pid"] for p in stats["processes"] if p["requests"].get("Query", 0) > 0}
    assert len(served) == 2, f"only {served} answered queries: {stats['processes']}"
    assert stats["requests_all"]["Query"] >= 60


def test_info_shows_the_processes(group, cli):
    _, address = group
    r = cli("info", "--server", address, "--json")
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)
    assert sorted(p["role"] for p in stats["processes"]) == ["follower", "writer"]
    assert all(p["pid"] and not p["error"] for p in stats["processes"])
    shown = cli("info", "--server", address)
    assert shown.returncode == 0 and "follower" in shown.stdout and "writer" in shown.stdout


def test_info_shows_a_busy_process_by_pid_and_role(group):
    """A process too busy to answer its sibling's Stats (here: stopped) is still named by
    its pid and role, with a readable state (it was ``DEADLINE_EXCEE...`` and pid ``-``)."""
    from rich.console import Console

    from polyindex.cli.show import show_server
    _, address = group
    follower = connect_to(address, "follower")
    writer_pid = pid_of(address, "writer")
    os.kill(writer_pid, signal.SIGSTOP)
    try:
        stats = follower.stub.Stats(pb.StatsRequest(processes=True), timeout=10)
    finally:
        os.kill(writer_pid, signal.SIGCONT)
        follower.channel.close()
    busy = [p for p in stats.processes if p.error]
    assert [(p.pid, p.role) for p in busy] == [(writer_pid, "writer")], stats.processes
    assert busy[0].error == "busy: no answer within 2 s"
    out = Console(width=200, record=True)
    show_server(out, address, {"processes": [{"worker": p.worker, "pid": p.pid, "role": p.role,
                                              "uptime_s": p.uptime_s,
                                              "requests_total": p.requests_total,
                                              "restarts": p.restarts, "error": p.error}
                                             for p in stats.processes],
                               "requests_all_total": 0, "collections": {}})
    text = out.export_text()
    assert f"{writer_pid}" in text and "busy: no answer within 2 s" in text, text
    assert "DEADLINE" not in text


def test_a_write_through_either_process_is_visible_through_every_process(group):
    _, address = group
    writer, follower = connect_to(address, "writer"), connect_to(address, "follower")
    assert writer.pid != follower.pid
    assert follower.upsert("via-follower", "alpha forwarded") == 1  # the writer answered
    assert follower.has("via-follower")  # read your write: the follower caught up at once
    assert writer.upsert("via-writer", "alpha direct") == 1
    for conn in (writer, follower):
        for doc_id in ("via-follower", "via-writer"):
            eventually(lambda: conn.has(doc_id), f"{doc_id} on the {conn.role}")
    # a follower's write errors are the writer's, class and all
    with pytest.raises(grpc.RpcError) as e:
        follower.stub.Delete(pb.DeleteRequest(collection="nope", ids=["x"]), timeout=10)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(e.value.trailing_metadata())["polyindex-error"] == "NotFound"
    deleted = follower.stub.Delete(pb.DeleteRequest(collection="c", ids=["via-writer"]), timeout=10)
    assert deleted.deleted == 1
    eventually(lambda: not writer.has("via-writer"), "a forwarded delete on the writer")
    for conn in (writer, follower):
        conn.channel.close()


def test_a_drop_and_re_create_through_the_follower_are_read_at_once_on_its_connection(group):
    """A reader looks at its collection's folder at most every 50 ms; a follower that
    forwarded a drop or create forgets its handle, so its client never sees the old one."""
    _, address = group
    follower = connect_to(address, "follower")

    def get(doc_id):
        return follower.stub.Get(pb.GetRequest(collection="d", ids=[doc_id]), timeout=10)

    def create():
        follower.stub.CreateCollection(pb.CreateCollectionRequest(name="d", indexes=["lexical"],
                                                                  model="none"), timeout=30)

    def upsert(doc_id):
        msg = pb.UpsertRequest(collection="d", documents=[pb.Document(id=doc_id, text="a b")])
        follower.stub.Upsert(iter([msg]), timeout=30)
    create()
    upsert("old")
    assert get("old").found[0]
    follower.stub.DropCollection(pb.DropCollectionRequest(name="d"), timeout=30)
    with pytest.raises(grpc.RpcError) as e:
        get("old")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    create()
    upsert("new")
    assert list(get("old").found) == [False] and list(get("new").found) == [True]
    follower.stub.DropCollection(pb.DropCollectionRequest(name="d"), timeout=30)
    follower.channel.close()


def test_a_worker_that_dies_is_restarted(group):
    proc, address = group
    follower = connect_to(address, "follower")
    old = follower.pid
    follower.channel.close()
    os.kill(old, signal.SIGKILL)

    def restarted():
        with Client(address) as c:
            ps = c.stats(processes=True)["processes"]
        return any(p["role"] == "follower" and p["pid"] not in (0, old) and p["restarts"] == 1
                   for p in ps)
    eventually(restarted, "a new follower")
    writer = connect_to(address, "writer")
    wpid = writer.pid
    writer.channel.close()
    os.kill(wpid, signal.SIGKILL)  # its lock goes with it; the new writer takes it again
    eventually(lambda: pid_of(address, "writer") not in (None, wpid), "a new writer")
    with Client(address) as c:
        coll = c.collection("c")
        assert coll.get(["via-follower"])[0] is not None  # acknowledged before the kill
        assert coll.add([{"id": "after", "text": "alpha after"}]) == 1
    assert proc.poll() is None


def test_metrics_label_each_process_and_sum_the_group(group):
    import urllib.request
    proc, address = group
    with Client(address) as c:  # (counters start again with a restarted worker)
        c.collection("c").query("alpha", profile="lexical")
    # the port was printed with the serving line; find it from the parent's listening sockets
    port = _metrics_port(proc.pid)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert re.search(r'polyindex_process\{.*role="writer".*\} 1\.0', text)
    assert re.search(r'polyindex_process\{.*role="follower".*\} 1\.0', text)
    assert re.search(r'polyindex_group_requests_total\{code="OK",rpc="Query"\} \d+', text)
    assert 'polyindex_group_worker_up{role="writer",worker="0"} 1.0' in text


def _metrics_port(pid: int) -> int:
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")}
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in inodes:  # LISTEN
                return int(parts[1].split(":")[1], 16)
    raise AssertionError("the parent serves no metrics port")


def test_sigterm_stops_every_process(tmp_path):
    proc, address = start(tmp_path)
    with Client(address) as c:
        c.create_collection("c", ["lexical"]).add([{"id": "a", "text": "alpha"}])
        pids = [p["pid"] for p in c.stats(processes=True)["processes"]]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    rc = stop(proc)
    assert not any(alive(p) for p in pids)
    assert rc == 0, f"the group exited {rc}; its stderr: {proc.stderr.read()[-3000:]}"
    with __import__("polyindex").open(tmp_path, readonly=True) as eng:  # sealed at close
        assert eng.collection("c").info()["segments"] == 1


def test_sigkill_of_the_parent_leaves_no_worker_serving(tmp_path):
    proc, address = start(tmp_path)
    with Client(address) as c:
        pids = [p["pid"] for p in c.stats(processes=True)["processes"]]
    proc.kill()
    proc.wait()
    eventually(lambda: not any(alive(p) for p in pids), "workers gone after the parent")


def test_a_port_held_by_another_program_fails_clearly(tmp_path):
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that shares
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "polyindex.cli.main", "serve", "--data",
                            str(tmp_path), "--port", str(port), "--processes", "2"],
                           capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr


def test_a_directory_held_by_another_writer_fails_clearly(tmp_path):
    import polyindex
    with polyindex.open(tmp_path):  # this process holds the directory's lock
        r = subprocess.run([sys.executable, "-m", "polyindex.cli.main", "serve", "--data",
                            str(tmp_path), "--port", "0", "--processes", "2"],
                           capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "did not start" in r.stderr and "already open for writing" in r.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_group_starts_again_at_once_on_its_port_after_sigterm(tmp_path):
    """A clean stop leaves the server's side of its connections in TIME_WAIT on the port
    (the server closed first); the next group's check of the port must not trip on them."""
    port = free_port()
    # the held connection never speaks HTTP/2, and gRPC's stop waits out the grace for it:
    # a short grace, which the group's workers take from the setting as one process does
    env = {**os.environ, "POLYINDEX_SHUTDOWN_GRACE_S": "0.5"}
    for attempt in range(3):
        proc, address = start(tmp_path, "--port", str(port), env=env)
        assert address == f"127.0.0.1:{port}"
        held = socket.create_connection(("127.0.0.1", port), timeout=10)  # open across the stop
        with Client(address) as c:
            c.list_collections()
        code, err = stop(proc), proc.stderr.read()
        assert code == 0, err[-2000:]
        assert err.count("waiting up to 0.5 s") == 2, err[-2000:]  # writer and follower
        while held.recv(65536):  # read to the server's FIN (unread bytes would make it a reset)
            pass
        held.close()  # after the server's close: the server's side waits in TIME_WAIT


@pytest.mark.slow  # a group's start, a writer's restart and a stop: 20-30 s here
def test_a_write_through_a_follower_waits_out_a_killed_writers_restart(tmp_path, frontend):
    proc, address = start(tmp_path, "--frontend", frontend)
    try:
        with Client(address) as c:
            c.create_collection("c", ["lexical"])
        follower = connect_to(address, "follower")
        assert follower.upsert("before", "alpha before") == 1  # its channel to the writer is up
        writer = connect_to(address, "writer")
        wpid = writer.pid
        writer.channel.close()
        os.kill(wpid, signal.SIGKILL)
        start_s = time.monotonic()
        for i in range(3):  # sent at once: the follower's connection to the writer just broke
            msg = pb.UpsertRequest(collection="c", documents=[pb.Document(id=f"during-{i}",
                                                                          text="alpha during")])
            assert follower.stub.Upsert(iter([msg]), timeout=60).upserted == 1
        deleted = follower.stub.Delete(pb.DeleteRequest(collection="c", ids=["before"]),
                                       timeout=60)
        assert deleted.deleted == 1
        assert time.monotonic() - start_s < 40
        new_writer = connect_to(address, "writer")
        assert new_writer.pid != wpid  # the writer that acknowledged them is the new one
        for conn in (follower, new_writer):
            for i in range(3):
                eventually(lambda: conn.has(f"during-{i}"), f"during-{i} on the {conn.role}")
            eventually(lambda: not conn.has("before"), f"the delete on the {conn.role}")
        assert proc.poll() is None
    finally:
        rc = stop(proc)
    assert rc == 0, proc.stderr.read()[-2000:]
