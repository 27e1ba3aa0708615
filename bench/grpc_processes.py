"""bench_grpc.py --processes 1,2: q/s of `polyindex serve --processes N` under 16 clients.

Each setting is its own server (`serve --processes N`) over its own copy of npl (or
``--collection``), both up for the whole run. The 16 clients are separate processes, each
with its own connection, made anew for every measurement (so the kernel's SO_REUSEPORT
spreads the 16 connections over the server's processes anew): by default the C++ load
client (``--load-client cxx``, bench/native/grpc_load.cc through load_client.py: gRPC C++
on pre-serialized requests, nothing else per call), or with ``--load-client python``
Python processes (spawned once, reused) calling over the SDK's native channel (grpcio
without it). Each warms up, then all are released together and call Query for
``seconds``. Settings are interleaved (ABAB, the order flipped each round) on this shared,
busy machine; the ratio of q/s is the median of the per-round ratios. Each measurement also
says where the machine's CPUs went (the server, each of its processes, the clients,
everything else, idle), the server's and the clients' CPU per call, how long the server's
threads waited for a CPU (run-queue delay, /proc/PID/task/*/schedstat) and their context
switches per call.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import re
import subprocess
import time

import numpy as np

from common import polyindex_cmd

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
        if msg == "ping":  # started: its imports are done
            conn.send("pong")
            continue
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
        for pipe in self.pipes:  # every interpreter up before the first measurement
            pipe.send("ping")
        for pipe in self.pipes:
            pipe.recv()

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
    return sum(_cpu_one(pid) for pid in pids)


def _cpu_one(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _per_thread(pids, name: str, read) -> int:
    """The sum of ``read(text)`` over /proc/PID/task/TID/``name`` of every thread of the
    processes (threads or processes gone meanwhile are skipped)."""
    total = 0
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/{name}") as f:
                    total += read(f.read())
            except (OSError, IndexError, ValueError):
                continue
    return total


def _waited(pids) -> float:
    """Seconds the processes' threads have spent runnable but waiting for a CPU (the
    scheduler's run-queue delay, schedstat's second field)."""
    return _per_thread(pids, "schedstat", lambda text: int(text.split()[1])) / 1e9


def _switches(pids) -> int:
    """Context switches (voluntary and not) of every thread of the processes so far: a call
    that waits for the GIL or for another thread's poll shows here."""
    return _per_thread(pids, "status", lambda text: sum(
        int(line.split()[1]) for line in text.splitlines() if "ctxt_switches" in line))


def _machine() -> dict[str, tuple[float, float]]:
    """Per CPU and for all ("cpu"): (busy, idle) seconds so far (steal counted as busy)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
        for line in f:
            if not line.startswith("cpu"):
                break
            name, *vals = line.split()
            v = [int(x) for x in vals[:8]]
            idle = v[3] + v[4]
            out[name] = ((sum(v) - idle) / tick, idle / tick)
    return out


class Meter:
    """Where the machine's CPUs went between ``start()`` and ``stop()``, in cores: the server
    (all its processes, and each worker), the clients (``client_pids``, when they are known
    for the whole run; the C++ clients report their own), everything else, idle; each CPU's
    busy share; the server's run-queue delay per second of wall time."""

    def __init__(self, server_pid: int, client_pids: list[int] | None = None,
                 metrics_url: str | None = None):
        self.server_pid, self.client_pids = server_pid, client_pids or []
        self.metrics_url = metrics_url

    def start(self) -> None:
        self.q0 = query_counts(self.metrics_url)[0] if self.metrics_url else {}
        self.pids = _tree(self.server_pid)
        self.s0 = {p: _cpu_one(p) for p in self.pids}
        self.c0, self.w0 = _cpu(self.client_pids), _waited(self.pids)
        self.x0 = _switches(self.pids)
        self.m0, self.t0 = _machine(), time.perf_counter()

    def stop(self) -> dict:
        s1 = {p: _cpu_one(p) for p in self.pids}
        c1, w1, m1, t1 = _cpu(self.client_pids), _waited(self.pids), _machine(), time.perf_counter()
        x1 = _switches(self.pids)
        wall = t1 - self.t0
        server = sum(s1.values()) - sum(self.s0.values())
        busy = m1["cpu"][0] - self.m0["cpu"][0]
        out = {"server_cores": server / wall,
               "server_process_cores": [(s1[p] - self.s0[p]) / wall for p in self.pids],
               "server_runqueue_wait": (w1 - self.w0) / wall,
               "idle_cores": (m1["cpu"][1] - self.m0["cpu"][1]) / wall,
               "cpu_busy": {k: (m1[k][0] - self.m0[k][0]) /
                            max(m1[k][0] - self.m0[k][0] + m1[k][1] - self.m0[k][1], 1e-9)
                            for k in m1 if k != "cpu"},
               "metered_s": wall, "_busy_s": busy, "_server_s": server,
               "_switches": x1 - self.x0}
        if self.client_pids:
            out["client_cores"] = (c1 - self.c0) / wall
        if self.metrics_url:  # each process's share of the calls and its CPU per call
            q1, roles = query_counts(self.metrics_url)
            out["server_processes"] = []
            for p in self.pids:
                if p in roles:
                    cpu, calls = s1[p] - self.s0[p], q1.get(p, 0) - self.q0.get(p, 0)
                    out["server_processes"].append(
                        {"pid": p, "role": roles[p], "cores": cpu / wall, "calls": calls,
                         "cpu_us_per_call": cpu * 1e6 / max(calls, 1)})
        return out


def measure(clients, kind: str, address: str, requests: list[bytes], seconds: float,
            server_pid: int, tmp, metrics_url: str | None = None) -> dict:
    """One 16-client measurement: q/s, latencies, errors, and the CPU accounting; the
    server's and the clients' CPU per call (us)."""
    if kind == "cxx":
        import load_client
        res = load_client.run(address, PATH, requests, CLIENTS, seconds,
                              meter=Meter(server_pid, metrics_url=metrics_url), tmp=tmp)
    else:
        meter = Meter(server_pid, [p.pid for p in clients.procs], metrics_url)
        meter.start()
        res = clients.run(address, requests, seconds)
        res.update(meter.stop())
        res["client_cpu_us_per_call"] = res["client_cores"] * res["metered_s"] * 1e6 / max(
            res["calls"], 1)
    wall = res.pop("metered_s")
    busy, server = res.pop("_busy_s"), res.pop("_server_s")
    res["other_cores"] = (busy - server) / wall - res["client_cores"]
    res["server_cpu_us_per_call"] = server * 1e6 / max(res["calls"], 1)
    res["server_switches_per_call"] = res.pop("_switches") / max(res["calls"], 1)
    return res


def start_group(data, processes: int, workers: int | None = None, port: int = 0,
                metrics_port: int = 0):
    """``serve --processes N`` in a session of its own, as a group's workers are (with the
    kernel's autogroup scheduling, on here, CPU time is shared between sessions first, and
    a lone server in the bench's session would share one share with the 16 clients), with
    its /metrics (each process's Query count): (process, address, metrics URL)."""
    extra = ["--workers", workers] if workers else []  # else the server's default (8)
    proc = subprocess.Popen([*polyindex_cmd(), "serve", "--data", str(data), "--port", str(port),
                             *map(str, extra), "--processes", str(processes),
                             "--metrics-port", str(metrics_port)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+) .*metrics on (127\.0\.0\.1:\d+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, m.group(1), f"http://{m.group(2)}/metrics"


def query_counts(url: str) -> tuple[dict[int, float], dict[int, str]]:
    """(Query calls answered so far by each process, each process's role), from /metrics: a
    group's parent labels every worker's series with its pid; a lone server's are its own."""
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    counts: dict[int, float] = {}
    roles: dict[int, str] = {}
    for line in text.splitlines():
        if line.startswith("polyindex_process{"):
            pid, role = re.search(r'pid="(\d+)"', line), re.search(r'role="(\w+)"', line)
            roles[int(pid.group(1))] = role.group(1)
    lone = next(iter(roles)) if len(roles) == 1 else None
    for line in text.splitlines():
        if line.startswith("polyindex_requests_total{") and 'rpc="Query"' in line:
            m = re.search(r'pid="(\d+)"', line)
            pid = int(m.group(1)) if m else lone
            counts[pid] = counts.get(pid, 0.0) + float(line.rsplit(" ", 1)[1])
    return counts, roles


def query_requests(queries, vectors, profile: str, collection: str = "npl") -> list[bytes]:
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    return [pb.QueryRequest(collection=collection, profile=profile, k=10,
                            **({"vector": v.tolist()} if profile == "dense" else {"text": q})
                            ).SerializeToString() for q, v in zip(queries, vectors)]


def compare(data_copies: dict, settings: list[int], queries, vectors, seconds: float,
            rounds: int, console, table, workers: int | None = None,
            profiles=("lexical", "dense"), load_client_kind: str = "cxx", port: int = 0,
            tmp=None, collection: str = "npl") -> dict:
    """Start one server per setting, then rounds of (setting x profile) measurements."""
    requests = {p: query_requests(queries, vectors, p, collection) for p in profiles}
    if load_client_kind == "cxx":
        import load_client
        load_client.binary()  # built now (or a clear error) rather than inside a round
    servers = {n: start_group(data_copies[n], n, workers, port + i if port else 0,
                              port + 50 + i if port else 0)
               for i, n in enumerate(settings)}
    clients = Clients() if load_client_kind == "python" else None
    runs: dict = {n: {p: [] for p in requests} for n in settings}
    try:
        for r in range(rounds):
            order = settings if r % 2 == 0 else settings[::-1]
            for profile in requests:
                for n in order:
                    res = measure(clients, load_client_kind, servers[n][1], requests[profile],
                                  seconds, servers[n][0].pid, tmp, servers[n][2])
                    runs[n][profile].append(res)
                    per = ", ".join(f"{p['role']} {p['cores']:.2f} cores {p['calls']:.0f} calls "
                                    f"{p['cpu_us_per_call']:.0f} us/call"
                                    for p in res.get("server_processes", ()))
                    console.print(
                        f"round {r + 1} {profile:7s} --processes {n}: {res['qps']:7.0f} q/s  "
                        f"p50 {res['p50_ms']:.2f} ms  p99 {res['p99_ms']:.2f} ms  errors "
                        f"{res['errors']}  cores: server {res['server_cores']:.2f} ({per}) "
                        f"clients {res['client_cores']:.2f} other {res['other_cores']:.2f} "
                        f"idle {res['idle_cores']:.2f}  us/call: server "
                        f"{res['server_cpu_us_per_call']:.0f} client "
                        f"{res['client_cpu_us_per_call']:.0f}  server waited for a CPU "
                        f"{res['server_runqueue_wait']:.2f} s/s, "
                        f"{res['server_switches_per_call']:.1f} context switches/call")
    finally:
        if clients is not None:
            clients.close()
        codes = {}
        for n, (proc, *_) in servers.items():
            proc.terminate()
            try:
                codes[n] = proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                codes[n] = None
    return summarize(runs, settings, console, table, codes, collection)


KEYS = ("qps", "p50_ms", "p99_ms", "server_cores", "client_cores", "other_cores",
        "idle_cores", "server_cpu_us_per_call", "client_cpu_us_per_call",
        "server_runqueue_wait", "server_switches_per_call")


def summarize(runs: dict, settings: list[int], console, table, codes,
              collection: str = "npl") -> dict:
    base = settings[0]
    out: dict = {"settings": settings, "rounds": runs, "server_exit_codes": codes, "profiles": {}}
    rows, cpu_rows = [], []
    for profile in runs[base]:
        per = {}
        for n in settings:
            rs = runs[n][profile]
            per[n] = {k: float(np.median([r[k] for r in rs])) for k in KEYS}
            per[n]["errors"] = sum(r["errors"] for r in rs)
            roles: dict = {}
            for r in rs:
                for proc in r.get("server_processes", ()):
                    roles.setdefault(proc["role"], []).append(proc)
            per[n]["by_role"] = {role: {k: float(np.median([x[k] for x in xs]))
                                        for k in ("cores", "calls", "cpu_us_per_call")}
                                 for role, xs in roles.items()}
        for n in settings:
            ratios = [a["qps"] / b["qps"] for a, b in zip(runs[n][profile], runs[base][profile])]
            per[n]["ratio_vs_first"] = float(np.median(ratios))
            per[n]["round_ratios"] = ratios
            p = per[n]
            split = " + ".join(f"{role} {x['cores']:.2f} ({x['cpu_us_per_call']:.0f} us/call)"
                               for role, x in p["by_role"].items())
            rows.append([profile, n, f"{p['qps']:.0f}", f"{p['p50_ms']:.2f}",
                         f"{p['p99_ms']:.2f}", p["errors"], f"{p['ratio_vs_first']:.2f}x",
                         " ".join(f"{x:.2f}" for x in ratios)])
            cpu_rows.append([profile, n, f"{p['server_cores']:.2f}", split or "-",
                             f"{p['server_cpu_us_per_call']:.0f}", f"{p['client_cores']:.2f}",
                             f"{p['client_cpu_us_per_call']:.0f}", f"{p['other_cores']:.2f}",
                             f"{p['idle_cores']:.2f}", f"{p['server_runqueue_wait']:.2f}",
                             f"{p['server_switches_per_call']:.1f}"])
        out["profiles"][profile] = per
    n_rounds = len(runs[base][next(iter(runs[base]))])
    console.print(table(f"{collection}, {CLIENTS} client processes: `serve --processes N` "
                        f"(medians of {n_rounds} interleaved rounds)",
                        ["profile", "processes", "q/s", "p50 ms", "p99 ms", "errors",
                         f"q/s vs {base}", "per round"], rows))
    console.print(table("where the CPU went (cores of the machine's "
                        f"{os.cpu_count()}; CPU per call from /proc and each process's Query "
                        "count)",
                        ["profile", "processes", "server cores", "per process (CPU per call)",
                         "server us/call", "client cores", "client us/call", "other cores",
                         "idle", "server waited for a CPU s/s", "server switches/call"],
                        cpu_rows))
    return out
