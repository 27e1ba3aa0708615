"""bench_grpc.py --processes 1,2: q/s of `polyindex serve --processes N` under 16 clients.

Each setting is its own server (`serve --processes N --port 0`) over its own copy of npl, both
up for the whole run. The 16 clients are separate processes (spawned once, reused): a Python
client in one process would be GIL-bound itself. Each opens a fresh connection per
measurement (so the kernel's SO_REUSEPORT spreads the 16 connections over the server's
processes anew), warms up, waits at a barrier, and calls Query for ``seconds`` with
pre-serialized requests over the SDK's native gRPC C++ channel (grpcio without it): the
client-side Python work per call is a few microseconds, so the clients take little of the
two cores away from the servers. Settings are interleaved (ABAB, the order flipped each
round) on this shared, busy machine; the ratio of q/s is the median of the per-round ratios.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import time

import numpy as np

from common import start_serving

CLIENTS = 16
MAX_MESSAGE = 64 << 20
PATH = "/polyindex.v1.Polyindex/Query"


def _client(conn, barrier) -> None:
    """A client process: for each ("run", address, requests, seconds) message, one fresh
    connection, a warm-up, the barrier, then calls until the time is up; replies with
    (latencies ms, calls that failed, the first failure)."""
    from polyindex.client.remote import _grpc_channel
    while True:
        msg = conn.recv()
        if msg is None:
            return
        _, address, requests, seconds = msg
        if _grpc_channel is not None:
            ch = _grpc_channel.Channel(address, False, None, MAX_MESSAGE)
            call = lambda req: ch.unary(PATH, req, 30.0, ())[0]  # noqa: E731
        else:
            import grpc
            ch = grpc.insecure_channel(address, [("grpc.use_local_subchannel_pool", 1)])
            raw = ch.unary_unary(PATH)

            def call(req):
                try:
                    raw(req, timeout=30.0)
                    return 0
                except grpc.RpcError as e:
                    return e.code().value[0]
        lat, errors, first = [], 0, None
        for i in range(20):  # warm-up (connection, server caches)
            call(requests[i % len(requests)])
        barrier.wait()
        stop = time.perf_counter() + seconds
        i = 0
        while (t0 := time.perf_counter()) < stop:
            code = call(requests[i % len(requests)])
            lat.append((time.perf_counter() - t0) * 1000)
            if code != 0:
                errors += 1
                first = first or f"status {code}"
            i += 1
        ch.close()
        conn.send((np.asarray(lat, dtype=np.float32), errors, first))


class Clients:
    def __init__(self, n: int = CLIENTS):
        ctx = mp.get_context("spawn")  # fresh interpreters: no gRPC state inherited
        self.barrier = ctx.Barrier(n)
        self.pipes, self.procs = [], []
        for _ in range(n):
            ours, theirs = ctx.Pipe()
            p = ctx.Process(target=_client, args=(theirs, self.barrier), daemon=True)
            p.start()
            self.pipes.append(ours)
            self.procs.append(p)

    def run(self, address: str, requests: list[bytes], seconds: float) -> dict:
        rng = np.random.default_rng(len(requests))
        for i, pipe in enumerate(self.pipes):  # each client its own order of the queries
            order = rng.permutation(len(requests))
            pipe.send(("run", address, [requests[j] for j in order], seconds))
        t0 = time.perf_counter()
        out = [pipe.recv() for pipe in self.pipes]
        wall = time.perf_counter() - t0
        lat = np.concatenate([o[0] for o in out])
        errors = sum(o[1] for o in out)
        return {"qps": len(lat) / seconds, "p50_ms": float(np.percentile(lat, 50)),
                "p99_ms": float(np.percentile(lat, 99)), "calls": int(len(lat)),
                "errors": errors, "first_error": next((o[2] for o in out if o[2]), None),
                "wall_s": wall}

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for p in self.procs:
            p.join(10)


def _tree(pid: int) -> list[int]:
    """A process and its children (a group's parent and its workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *map(int, f.read().split())]
    except OSError:
        return [pid]


def _cpu(pids) -> float:
    """CPU seconds (user + system, every thread) the processes used so far."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
        except (OSError, IndexError, ValueError):
            continue
    return total / os.sysconf("SC_CLK_TCK")


def _machine() -> tuple[float, float]:
    """(busy, idle) CPU seconds of the whole machine so far (steal counted as busy)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    idle = v[3] + v[4]
    return (sum(v) - idle) / os.sysconf("SC_CLK_TCK"), idle / os.sysconf("SC_CLK_TCK")


def accounted(run, server_pid: int, client_pids: list[int]) -> dict:
    """``run()``'s result with where the machine's CPUs went meanwhile, in cores: the server
    (all its processes), the 16 clients, everything else on this shared machine, idle."""
    servers = _tree(server_pid)
    s0, c0, (b0, i0), t0 = _cpu(servers), _cpu(client_pids), _machine(), time.perf_counter()
    res = run()
    s1, c1, (b1, i1), t1 = _cpu(servers), _cpu(client_pids), _machine(), time.perf_counter()
    wall = t1 - t0
    res.update(server_cores=(s1 - s0) / wall, client_cores=(c1 - c0) / wall,
               other_cores=((b1 - b0) - (s1 - s0) - (c1 - c0)) / wall,
               idle_cores=(i1 - i0) / wall)
    return res


def start_group(data, processes: int, workers: int | None = None):
    extra = ["--workers", workers] if workers else []  # else the server's default (8)
    return start_serving(["--data", data, "--port", 0, *extra, "--processes", processes])


def query_requests(queries, vectors, profile: str) -> list[bytes]:
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    return [pb.QueryRequest(collection="npl", profile=profile, k=10,
                            **({"vector": v.tolist()} if profile == "dense" else {"text": q})
                            ).SerializeToString() for q, v in zip(queries, vectors)]


def compare(data_copies: dict, settings: list[int], queries, vectors, seconds: float,
            rounds: int, console, table, workers: int | None = None,
            profiles=("lexical", "dense")) -> dict:
    """Start one server per setting, then rounds of (setting x profile) measurements."""
    requests = {p: query_requests(queries, vectors, p) for p in profiles}
    servers = {n: start_group(data_copies[n], n, workers) for n in settings}
    clients = Clients()
    runs: dict = {n: {p: [] for p in requests} for n in settings}
    try:
        for r in range(rounds):
            order = settings if r % 2 == 0 else settings[::-1]
            for profile in requests:
                for n in order:
                    res = accounted(lambda: clients.run(servers[n][1], requests[profile],
                                                        seconds),
                                    servers[n][0].pid, [p.pid for p in clients.procs])
                    runs[n][profile].append(res)
                    console.print(f"round {r + 1} {profile:7s} --processes {n}: "
                                  f"{res['qps']:7.0f} q/s  p50 {res['p50_ms']:.2f} ms  "
                                  f"p99 {res['p99_ms']:.2f} ms  errors {res['errors']}  cores: "
                                  f"server {res['server_cores']:.2f} clients "
                                  f"{res['client_cores']:.2f} other {res['other_cores']:.2f} "
                                  f"idle {res['idle_cores']:.2f}")
    finally:
        clients.close()
        codes = {}
        for n, (proc, _) in servers.items():
            proc.terminate()
            try:
                codes[n] = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[n] = None
    return summarize(runs, settings, console, table, codes)


def summarize(runs: dict, settings: list[int], console, table, codes) -> dict:
    base = settings[0]
    out: dict = {"settings": settings, "rounds": runs, "server_exit_codes": codes, "profiles": {}}
    rows = []
    for profile in runs[base]:
        per = {}
        for n in settings:
            rs = runs[n][profile]
            per[n] = {k: float(np.median([r[k] for r in rs]))
                      for k in ("qps", "p50_ms", "p99_ms", "server_cores", "client_cores",
                                "other_cores", "idle_cores")}
            per[n]["errors"] = sum(r["errors"] for r in rs)
        for n in settings:
            ratios = [a["qps"] / b["qps"] for a, b in zip(runs[n][profile], runs[base][profile])]
            per[n]["ratio_vs_first"] = float(np.median(ratios))
            per[n]["round_ratios"] = ratios
            rows.append([profile, n, f"{per[n]['qps']:.0f}", f"{per[n]['p50_ms']:.2f}",
                         f"{per[n]['p99_ms']:.2f}", per[n]["errors"],
                         f"{per[n]['ratio_vs_first']:.2f}x",
                         " ".join(f"{x:.2f}" for x in ratios),
                         f"{per[n]['server_cores']:.2f}", f"{per[n]['client_cores']:.2f}",
                         f"{per[n]['other_cores']:.2f}", f"{per[n]['idle_cores']:.2f}"])
        out["profiles"][profile] = per
    console.print(table(f"npl, {CLIENTS} client processes: `serve --processes N` (medians of "
                        f"{len(runs[base][next(iter(runs[base]))])} interleaved rounds)",
                        ["profile", "processes", "q/s", "p50 ms", "p99 ms", "errors",
                         f"q/s vs {base}", "per round", "server cores", "client cores",
                         "other cores", "idle"], rows))
    return out
