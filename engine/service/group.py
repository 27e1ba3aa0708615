"""The process group of ``polyindex serve --processes N`` as one worker sees it.

Worker 0 is the writer (it holds the data directory's lock, the WAL, seals and merges); the
others are read-only followers. Every worker listens on the shared port and on a private unix
socket in the group's runtime folder (``worker-<i>.sock``, mode 0700 folder): a follower
forwards each write to the writer's socket and answers with the writer's reply (status,
message and error class included), then catches up with the writer's WAL so that the client's
next read on this connection sees its write. ``Stats(processes=true)`` asks every sibling for
its own numbers over the same sockets.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
from polyindex.config import settings
from polyindex.wire.convert import MAX_MESSAGE_BYTES
from polyindex.wire.grpc_errors import Unavailable, from_rpc_error

RETRY_FIRST_S, RETRY_MAX_S = 0.05, 1.0  # pauses between a forwarded write's tries
_RETRIED = frozenset({"Upsert", "Delete", "DeleteWhere"})  # idempotent: see Member.forward
# Calls that run for minutes on the writer (a snapshot copies the collection, an adapt
# learns and re-encodes it): the forward waits POLYINDEX_FORWARD_WAIT_S at most for the
# writer to be reachable, then as long as the client's own deadline allows (none: until the
# writer answers)
_LONG = frozenset({"CreateSnapshot", "AdaptCollection"})
PEER_TIMEOUT_S = 2.0   # a sibling that does not answer Stats within this is reported, not waited for
_PASSED = ("authorization",)  # metadata a forwarded call carries on (the writer checks it too)
INTERNAL_KEY = "polyindex-internal"  # on calls between the processes of a group: the sender's pid


def is_internal(context) -> bool:
    return any(k == INTERNAL_KEY for k, _ in context.invocation_metadata())


def _internal_metadata(context) -> list[tuple[str, str]]:
    """A call to a sibling: the client's credentials, marked as this process's."""
    return [(k, v) for k, v in context.invocation_metadata() if k in _PASSED] + \
        [(INTERNAL_KEY, str(os.getpid()))]


def socket_path(runtime: Path, worker: int) -> Path:
    return runtime / f"worker-{worker}.sock"


@dataclass
class Member:
    """This worker's place in the group; ``None`` for a lone server."""

    worker: int
    processes: int
    runtime: Path
    restarts: int = 0
    readonly: bool = False  # `serve --readonly --processes N`: no writer, writes refused
    _channels: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def role(self) -> str:
        return self.role_of(self.worker)

    def role_of(self, worker: int) -> str:
        return "readonly" if self.readonly else "writer" if worker == 0 else "follower"

    def pid_of(self, worker: int) -> int:
        """A sibling's pid from its private socket (the kernel's SO_PEERCRED: answered even
        while the sibling is too busy to answer a call); 0 when nothing listens there."""
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(0.5)
            s.connect(str(socket_path(self.runtime, worker)))
            creds = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            return struct.unpack("3i", creds)[0]
        except OSError:
            return 0
        finally:
            s.close()

    @property
    def forwards(self) -> bool:
        return self.role == "follower"

    @property
    def private_bind(self) -> str:
        return f"unix:{socket_path(self.runtime, self.worker)}"

    def stub(self, worker: int) -> pb_grpc.PolyindexStub:
        with self._lock:
            ch = self._channels.get(worker)
            if ch is None:
                ch = self._channels[worker] = grpc.insecure_channel(
                    f"unix:{socket_path(self.runtime, worker)}",
                    options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                             ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                             # a restarted sibling's socket is found within a second (grpc's
                             # default reconnect backoff grows to 120 s)
                             ("grpc.initial_reconnect_backoff_ms", 100),
                             ("grpc.max_reconnect_backoff_ms", 1000)])
            return pb_grpc.PolyindexStub(ch)

    def forward(self, method: str, request, context):
        """Call ``method`` on the writer with the client's credentials and what is left of
        its deadline (at most ``POLYINDEX_FORWARD_WAIT_S``); its failure is raised as the
        exception it stands for. ``request``: a message, or a list of them (a stream: sent
        again whole on a retry).

        ``wait_for_ready`` waits while the writer cannot be reached (restarting), but a call
        sent on a connection that has just broken (the writer killed a moment ago) fails at
        once with UNAVAILABLE. Upsert and Delete are retried then, until the bound: retrying
        one whose outcome is unknown is safe, an upsert is idempotent by id (last write wins)
        and so is a delete (a retried one may count fewer ``deleted``). CreateCollection and
        DropCollection are not (a retry could answer ALREADY_EXISTS or NOT_FOUND for the
        call's own effect): they are sent once. grpc's own retry policy does not fit: it
        gives up on a stream past its per-call buffer (256 KB), and an Upsert may be 1 GiB."""
        left = context.time_remaining()
        if method in _LONG:
            return self._forward_long(method, request, context, left)
        wait_s = settings().forward_wait
        bound = wait_s if left is None else max(0.0, min(left, wait_s))
        ours = left is None or left > wait_s  # the wait runs out before the client's
        deadline = time.monotonic() + bound
        metadata = _internal_metadata(context)
        pause = RETRY_FIRST_S
        while True:
            try:
                return getattr(self.stub(0), method)(
                    iter(request) if isinstance(request, list) else request,
                    timeout=max(0.0, deadline - time.monotonic()), metadata=metadata,
                    wait_for_ready=True)
            except grpc.RpcError as e:
                code, retried = e.code(), method in _RETRIED
                if code == grpc.StatusCode.UNAVAILABLE and retried:
                    if time.monotonic() + pause < deadline:
                        time.sleep(pause)
                        pause = min(2 * pause, RETRY_MAX_S)
                        continue
                if ours and (code == grpc.StatusCode.DEADLINE_EXCEEDED or
                             (code == grpc.StatusCode.UNAVAILABLE and retried)):
                    raise Unavailable(f"{method}: the group's writer did not answer within "
                                      f"{wait_s:.0f} s (restarting?): "
                                      f"{e.details()}") from None
                raise from_rpc_error(e) from None

    def _forward_long(self, method: str, request, context, left: float | None):
        """A long call: wait for the writer (at most POLYINDEX_FORWARD_WAIT_S), then send it
        once, bound only by the client's deadline (not retried: it is not idempotent)."""
        stub = self.stub(0)
        wait = settings().forward_wait
        wait = wait if left is None else max(0.0, min(left, wait))
        try:
            grpc.channel_ready_future(self._channels[0]).result(timeout=wait)
        except grpc.FutureTimeoutError:
            raise Unavailable(f"{method}: the group's writer could not be reached within "
                              f"{wait:.0f} s (restarting?)") from None
        try:
            left = context.time_remaining()
            return getattr(stub, method)(request, timeout=left,
                                         metadata=_internal_metadata(context))
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def peers(self, context) -> list[tuple[int, pb.StatsResponse | str]]:
        """(worker, its Stats or why it did not answer) for every other worker, asked at once."""
        metadata = _internal_metadata(context)
        calls = []
        for w in range(self.processes):
            if w != self.worker:
                calls.append((w, self.stub(w).Stats.future(
                    pb.StatsRequest(), timeout=PEER_TIMEOUT_S, metadata=metadata)))
        out = []
        for w, fut in calls:
            try:
                out.append((w, fut.result()))
            except grpc.RpcError as e:
                out.append((w, _why(e)))
        return out

    def close(self) -> None:
        with self._lock:
            for ch in self._channels.values():
                ch.close()
            self._channels.clear()


def _why(e: grpc.RpcError) -> str:
    """A sibling's failed Stats, readably (the display has room for a few words)."""
    code = e.code()
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"busy: no answer within {PEER_TIMEOUT_S:g} s"
    if code == grpc.StatusCode.UNAVAILABLE:
        return "unreachable (starting or restarting?)"
    return f"{code.name.lower()}: {e.details()}"


def process_stats(response: pb.ProcessStats, *, pid: int, role: str, worker: int,
                  started: float, requests: dict[str, int], restarts: int) -> None:
    response.pid, response.role, response.worker = pid, role, worker
    response.uptime_s = time.time() - started
    response.requests.update(requests)
    response.requests_total = sum(requests.values())
    response.restarts = restarts
