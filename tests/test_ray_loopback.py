"""Ray stays on this machine in tests: a Ray started as the project starts it
(``distributed.cluster.start``: address "local", no dashboard, the loopback environment set
before the import) holds no socket on a non-loopback address, listening or connected.

The sockets are read from /proc (no psutil in the venv): each process's ``fd/`` links name
socket inodes, ``/proc/net/{tcp,tcp6,udp,udp6}`` give each inode's addresses. Ray's
processes are this process (the driver's core worker) and every process below it (GCS,
raylet, agents, workers: a local Ray is started as the driver's children).
"""
from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'ray[data]')")
if not Path("/proc/net/tcp").exists():
    pytest.skip("needs Linux /proc to list sockets", allow_module_level=True)

LISTEN, UNCONNECTED = "0A", "07"  # TCP states; a UDP socket without a peer shows 07 too


def _address(hexaddr: str) -> tuple[ipaddress._BaseAddress, int]:
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    # /proc prints each 32-bit word in host (little-endian) order
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw), int(port, 16)


def socket_table() -> dict[int, tuple[str, str, tuple, tuple]]:
    """inode -> (protocol, state, (local ip, port), (remote ip, port)) for every inet socket."""
    out = {}
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        path = Path("/proc/net") / proto
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            f = line.split()
            out[int(f[9])] = (proto, f[3], _address(f[1]), _address(f[2]))
    return out


def children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                # the command may hold spaces and parentheses: the ppid follows the last ')'
                ppid = int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # gone meanwhile
            kids.setdefault(ppid, []).append(int(p.name))
    return kids


def descendants(pid: int) -> list[int]:
    kids, out, todo = children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def process_sockets(pids) -> list[tuple[int, str, tuple]]:
    """(pid, command, socket row) of every inet socket the processes hold."""
    table, found = socket_table(), []
    for pid in pids:
        try:
            cmd = (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                   .decode(errors="replace")[:80])
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:
                continue
            if link.startswith("socket:[") and int(link[8:-1]) in table:
                found.append((pid, cmd, table[int(link[8:-1])]))
    return found


def _loopback(ip) -> bool:
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def off_machine(found) -> list[str]:
    """The sockets bound to, or connected to, an address other than loopback. An unbound
    socket (wildcard, port 0) reaches nothing and is not counted."""
    bad = []
    for pid, cmd, (proto, state, (lip, lport), (rip, rport)) in found:
        if lport and not _loopback(lip):
            bad.append(f"pid {pid} ({cmd}): {proto} bound to {lip}:{lport} (state {state})")
        if state not in (LISTEN, UNCONNECTED) and rport and not _loopback(rip):
            bad.append(f"pid {pid} ({cmd}): {proto} connected to {rip}:{rport}")
    return bad


@pytest.fixture(scope="module")
def local_ray():
    from polyindex.distributed import cluster
    r = cluster.start(num_cpus=1, object_store_bytes=80 * 1024 * 1024)
    yield r
    r.shutdown()


def test_ray_holds_only_loopback_sockets(local_ray):
    @local_ray.remote
    def pid():
        return os.getpid()

    @local_ray.remote
    class Counter:
        def pid(self):
            return os.getpid()

    actor = Counter.remote()
    worker_pids = {local_ray.get(pid.remote()), local_ray.get(actor.pid.remote())}
    procs = descendants(os.getpid())
    assert worker_pids <= set(procs), "Ray's workers are not below the driver"
    assert len(procs) >= 4, procs  # the driver, GCS, raylet, workers at least
    found = process_sockets(procs)
    listening = [s for s in found if s[2][0].startswith("tcp") and s[2][1] == LISTEN]
    assert len({pid for pid, _, _ in listening}) >= 3, listening  # GCS, raylet, workers
    assert off_machine(found) == []


def test_sharded_serving_holds_only_loopback_sockets(local_ray, tmp_path):
    """The shard actors of ``serve --shards`` (a writer and a follower per shard) too."""
    from polyindex.distributed.serving import ShardedEngine
    engine = ShardedEngine(tmp_path / "d", shards=2, replicas=2)
    try:
        actors = {p for ps in engine.pids() for p in ps}
        procs = descendants(os.getpid())
        assert actors <= set(procs) and len(actors) == 4
        found = process_sockets(procs)
        assert any(pid in actors for pid, _, _ in found)  # the actors do hold sockets
        assert off_machine(found) == []
    finally:
        engine.close()


def test_the_check_sees_a_socket_on_every_address():
    """The check is not blind: a socket of this process bound to 0.0.0.0 is reported."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        bad = off_machine(process_sockets([os.getpid()]))
    assert any("bound to 0.0.0.0" in b for b in bad), bad
