"""gRPC service: latency and throughput over loopback against the same queries in-process.

Measures, on npl (11k docs, 93 queries), for the `lexical` profile (query text) and the
`dense` profile (precomputed query vectors, so the model's encode is not in either number):
queries/s and p50/p99 latency at 1, 4 and 16 concurrent clients, through `polyindex serve`
(a subprocess on 127.0.0.1, one client object per thread) and in-process (threads calling
`Collection.query` on the same data). Reports the added p50 latency of gRPC at 1 client
(goal: <= 0.5 ms for `dense` and `lexical`, issue 38) as the median over ``--rounds``
alternations of an in-process and a gRPC measurement (half ``--seconds`` each), with a health check's round trip
per round as the transport floor and the server's own Query handler time (``took_ms``) to
split the added latency into transport and the query running slower inside the server.

The 1-client rounds run against each front end of ``--frontends`` (default: native, gRPC C++
server and client channel, the default deployment; and python, grpcio's server and client, as
the reference), each its own server over its own copy of the data, with the client SDK on the
matching transport, all measured in the same rounds; the goal is checked on the first.
The throughput tables and the load run use the first front end.

Two setups (``--setups``): ``pinned`` runs the server with ``--cpus LAST`` and pins this
process (clients and the in-process reference) to the other CPUs, so no call pays for waking a
thread on another vCPU inside the server; ``free`` pins nothing. The goal is checked in both.

Then, in the last setup, a load run (default 60 s): 16 clients, 90% queries / 10% upserts;
target: zero errors and the server's RSS at the end within 20% of its RSS after warm-up.

    python bench/bench_grpc.py [--seconds 5] [--rounds 5] [--load-seconds 60]
        [--setups pinned,free] [--frontends native,python] [--fresh]

``--lexical-only`` runs both modes on npl as a lexical-only collection (``--index lexical
--model none``, built under bench/.work/lexical): the `lexical` profile only, no model loaded
anywhere, no load run (it mixes in dense and hybrid queries).

``--processes 1,2`` measures instead `polyindex serve --processes N` for each N: 16 client
processes (``--load-client cxx``, the default: the C++ load client, bench/native/grpc_load.cc,
built by `make native` or on first use; ``python``: Python processes over the SDK's channel),
`lexical` and `dense`, q/s, p50/p99, errors, the server's and the clients' CPU per call, the
settings interleaved over ``--rounds`` rounds of ``--seconds`` each (``grpc_processes.py``;
goal: >= 1.6x the q/s of the first setting for lexical), written to
bench/results/bench_grpc_processes.json. ``--port P``: the settings' servers on P, P+1, ...
(default: any free port).
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    ENGINE_DATA,
    WORK,
    collection_folder,
    console,
    ensure_collection,
    median,
    read_corpus,
    read_queries,
    run_cli,
    save_results,
    start_serving,
    table,
    verdict,
)

CONCURRENCY = (1, 4, 16)
ADDED_GOAL_MS = 0.5  # issue 38 (issue 19 asked for 1 ms)


def start_server(data: Path, frontend: str, workers: int = 32, cpus: str | None = None
                 ) -> tuple[subprocess.Popen, str]:
    extra = ["--cpus", cpus] if cpus is not None else []
    return start_serving(["--data", data, "--port", 0, "--workers", workers,
                          "--frontend", frontend, *extra])


def stop_server(proc: subprocess.Popen):
    proc.terminate()
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return None


def setups(arg: str) -> dict[str, tuple[str | None, set[int]]]:
    """name -> (the server's --cpus, the CPUs of this process: clients and in-process)."""
    cpus = sorted(os.sched_getaffinity(0))
    out = {}
    for name in arg.split(","):
        if name == "pinned" and len(cpus) >= 2:  # the server on the last CPU, clients elsewhere
            out[name] = (str(cpus[-1]), set(cpus[:-1]))
        elif name == "free":
            out[name] = (None, set(cpus))
        elif name != "pinned":
            raise SystemExit(f"unknown setup {name!r} (pinned, free)")
    return out


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_jiffies() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs: time the hypervisor gave this VM's vCPUs to others."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    return (vals[7] if len(vals) > 7 else 0), sum(vals[:8])


def drive(make_call, clients: int, seconds: float) -> dict:
    """``clients`` threads call ``make_call(thread_index)()`` in a loop; latencies in ms."""
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    stop = time.perf_counter() + seconds

    def worker(i):
        call = make_call(i)
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                call()
            except Exception as e:  # noqa: BLE001 - counted, reported
                errors.append(f"{type(e).__name__}: {e}")
            lat[i].append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    allv = np.concatenate([np.asarray(x) for x in lat]) if any(lat) else np.zeros(1)
    return {"qps": len(allv) / wall, "p50_ms": float(np.percentile(allv, 50)),
            "p99_ms": float(np.percentile(allv, 99)), "calls": int(len(allv)),
            "errors": len(errors), "first_errors": errors[:3]}


def query_calls(coll, queries, vectors, profile):
    def make(i):
        rng = random.Random(i)
        order = list(range(len(queries)))
        rng.shuffle(order)
        it = itertools.cycle(order)
        if profile == "dense":
            return lambda: coll.query(vector=vectors[next(it)], profile="dense", k=10)
        return lambda: coll.query(queries[next(it)], profile="lexical", k=10)
    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--setups", default="pinned,free",
                    help="pinned: server --cpus LAST, clients on the other CPUs; free: no pinning")
    ap.add_argument("--rounds", type=int, default=5,
                    help="1-client in-process/gRPC alternations for the added latency")
    ap.add_argument("--frontends", default="native,python",
                    help="server front ends; the goal is checked on the first")
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--processes", default=None,
                    help="e.g. 1,2: compare `serve --processes N` settings instead (16 client "
                         "processes, lexical and dense)")
    ap.add_argument("--lexical-only", action="store_true",
                    help="npl as a lexical-only collection, the lexical profile only, no model")
    ap.add_argument("--load-client", choices=("cxx", "python"), default="cxx",
                    help="with --processes: the 16 clients are C++ (light) or Python processes")
    ap.add_argument("--port", type=int, default=0,
                    help="with --processes: the first server's port (the next ones follow)")
    ap.add_argument("--collection", default="npl",
                    help="with --processes: the shared collection to serve")
    ap.add_argument("--root", type=Path, default=None,
                    help="with --processes: a data directory holding the collection already "
                         "indexed (lexical and dense: a copy of the lead's cache), used as is")
    ap.add_argument("--server-workers", type=int, default=None,
                    help="with --processes: each server process's --workers (default: serve's, 8)")
    args = ap.parse_args()
    frontends = args.frontends.split(",")
    if args.processes:
        folder = collection_folder(args.collection)
        return processes_main(args, folder) if folder is not None else None
    folder = collection_folder("npl")
    if folder is None:
        return
    import polyindex
    from polyindex.service.affinity import pin_process
    root = collection_root(folder, args)
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpc-"))
    for fe in frontends:  # one server per front end, each on its own copy (the load run writes)
        shutil.copytree(root / "npl", tmp / fe / "npl")
    queries = [t for _, t in read_queries(folder)]
    local = polyindex.open(root).collection("npl")
    vectors = [None] * len(queries) if args.lexical_only else local.encoder.encode(queries)
    profiles = ("lexical",) if args.lexical_only else ("lexical", "dense")
    all_cpus = os.sched_getaffinity(0)
    results: dict = {"seconds": args.seconds, "frontends": frontends, "setups": {}}
    plan = setups(args.setups)
    try:
        for i, (name, (server_cpus, client_cpus)) in enumerate(plan.items()):
            pin_process(client_cpus)
            servers = {fe: start_server(tmp / fe, fe, cpus=server_cpus) for fe in frontends}
            addresses = {fe: address for fe, (_, address) in servers.items()}
            res: dict = {"server_cpus": server_cpus, "client_cpus": sorted(client_cpus)}
            try:
                console.rule(f"setup {name}: server CPUs {server_cpus or 'all'}, clients and "
                             f"in-process on CPUs {sorted(client_cpus)}")
                res["profiles"], clients = latency(local, addresses, queries, vectors,
                                                   args.seconds, name, args.rounds, profiles)
                if i == len(plan) - 1 and not args.lexical_only:  # once, in the last setup (the default deployment: free)
                    res["load"] = load_run(clients, queries, vectors, servers[frontends[0]][0].pid,
                                           args.load_seconds, frontends[0])
                for c in clients:
                    c.close()
            finally:
                res["server_exit_codes"] = {fe: stop_server(proc)
                                            for fe, (proc, _) in servers.items()}
            results["setups"][name] = res
    finally:
        pin_process(all_cpus)
        shutil.rmtree(tmp, ignore_errors=True)
    save_results("bench_grpc_lexical" if args.lexical_only else "bench_grpc", results)


def collection_root(folder: Path, args, name: str = "npl") -> Path:
    """The data directory holding ``name`` (npl): the shared bench one (lexical + dense), or
    with ``--lexical-only`` a lexical-only copy without a model."""
    if not args.lexical_only:
        ids, _, _ = read_corpus(folder)
        ensure_collection(name, folder, len(set(ids)), fresh=args.fresh)
        return ENGINE_DATA
    root = WORK / "lexical"
    if args.fresh:
        shutil.rmtree(root / name, ignore_errors=True)
    if not (root / name / "manifest.json").exists():
        run_cli(["index", folder, "--data", root, "-c", name, "--index", "lexical",
                 "--model", "none", "--no-progress"], json_out=False)
    return root


def processes_main(args, folder: Path) -> None:
    """``--processes 1,2``: see grpc_processes.py."""
    import polyindex
    from grpc_processes import compare

    settings = [int(x) for x in args.processes.split(",")]
    name = args.collection
    root = args.root if args.root is not None else collection_root(folder, args, name)
    queries = [t for _, t in read_queries(folder)]
    if args.lexical_only:
        vectors, profiles = [None] * len(queries), ("lexical",)
    else:
        with polyindex.open(root, readonly=True) as eng:
            vectors = eng.collection(name).encoder.encode(queries)
        profiles = ("lexical", "dense")
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpc-processes-"))
    try:
        copies = {}
        for n in settings:  # each server writes its own directory (the writer's lock)
            copies[n] = tmp / f"p{n}"
            shutil.copytree(root / name, copies[n] / name)
        res = compare(copies, settings, queries, vectors, args.seconds,
                      args.rounds, console, table, args.server_workers, profiles,
                      args.load_client, args.port, tmp, name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if len(settings) > 1:
        ratio = res["profiles"]["lexical"][settings[-1]]["ratio_vs_first"]
        errors = sum(v["errors"] for per in res["profiles"].values() for v in per.values())
        res["pass"] = ratio >= 1.6 and errors == 0
        console.print(f"lexical q/s, --processes {settings[-1]} vs {settings[0]}: {ratio:.2f}x "
                      f"(goal >= 1.6x), errors {errors} (goal 0) {verdict(res['pass'])}")
    res.update(seconds=args.seconds, cpus=os.cpu_count(), load_avg=os.getloadavg(),
               server_workers=args.server_workers, load_client=args.load_client)
    save_results("bench_grpc_processes_lexical" if args.lexical_only
                 else "bench_grpc_processes", res)


def warm(colls, queries, vectors) -> None:
    for c in colls:
        for q, v in zip(queries[:5], vectors[:5]):
            c.query(q, profile="lexical")
            if v is not None:
                c.query(vector=v, profile="dense")


def one_client_rounds(local, addresses: dict[str, str], queries, vectors, profile: str,
                      seconds: float, rounds: int) -> list[dict]:
    """1 client, in-process then each front end's server, alternated ``rounds`` times
    (``seconds`` each): this VM's speed drifts over minutes, and alternating puts every side
    of a round on the same machine. Every gRPC measurement opens a fresh client and closes
    it, so the in-process rounds run while this process holds no gRPC channel. Per front end
    a health check's round trip (the transport floor, no engine work) and the server's Query
    handler time for the same queries are recorded too, and per round the share of CPU time
    the hypervisor stole from this VM (/proc/stat)."""
    import grpc

    from polyindex.client.remote import Client
    out = []
    for _ in range(rounds):
        steal0, total0 = cpu_jiffies()
        local_r = drive(query_calls(local, queries, vectors, profile), 1, seconds)
        row: dict = {"in_process_p50_ms": local_r["p50_ms"], "frontends": {}}
        for fe, address in addresses.items():
            client = Client(address, transport=fe)  # the front end's own client transport
            warm([client.collection("npl")], queries, vectors)
            grpc_r = drive(lambda i: query_calls(client.collection("npl"), queries, vectors,
                                                 profile)(i), 1, seconds)
            check = health_check(client)
            for _ in range(200):
                check()
            floor = drive(lambda i: check, 1, min(seconds, 1.0))
            client.close()
            with grpc.insecure_channel(address) as ch:
                handler = server_handler_ms(ch, queries, vectors, profile, min(seconds, 1.0))
            row["frontends"][fe] = {"grpc_p50_ms": grpc_r["p50_ms"],
                                    "added_p50_ms": grpc_r["p50_ms"] - local_r["p50_ms"],
                                    "health_p50_ms": floor["p50_ms"],
                                    "server_handler_p50_ms": handler, "errors": grpc_r["errors"]}
        steal1, total1 = cpu_jiffies()
        row["cpu_steal"] = (steal1 - steal0) / max(total1 - total0, 1)
        out.append(row)
    return out


def health_check(client):
    """A no-op call (health Check) over the client's own transport: the transport floor."""
    from grpc_health.v1 import health_pb2
    req = health_pb2.HealthCheckRequest()
    if client.transport == "native":
        payload = req.SerializeToString()
        return lambda: client._native.unary("/grpc.health.v1.Health/Check", payload, 30.0, ())
    return lambda: client._health.Check(req, timeout=30.0)


def server_handler_ms(channel, queries, vectors, profile: str, seconds: float) -> float:
    """p50 of the time the server's Query handler took (``took_ms``) over ``seconds`` of the
    same 1-client queries: what of the added latency is the query running slower inside the
    server, and what is transport (gRPC p50 minus this)."""
    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    from polyindex.proto.polyindex.v1 import polyindex_pb2_grpc as pb_grpc
    stub = pb_grpc.PolyindexStub(channel)
    reqs = [pb.QueryRequest(collection="npl", profile=profile, k=10,
                            **({"vector": v.tolist()} if profile == "dense" else {"text": q}))
            for q, v in zip(queries, vectors)]
    took: list[float] = []
    it = itertools.cycle(reqs)
    drive(lambda i: lambda: took.append(stub.Query(next(it), timeout=30).took_ms), 1, seconds)
    return median(took)


def latency(local, addresses: dict[str, str], queries, vectors, seconds: float, setup: str,
            rounds: int, profiles=("lexical", "dense")):
    """Per profile: the 1-client rounds (the added-latency goal, every front end), then 1, 4
    and 16 clients in-process then over gRPC to the first front end (throughput); returns
    (results, that front end's clients). The in-process reference runs first, while this
    process holds no gRPC channel yet."""
    from polyindex.client.remote import Client
    main_fe = next(iter(addresses))
    warm([local], queries, vectors)
    paired = {p: one_client_rounds(local, addresses, queries, vectors, p, seconds / 2, rounds)
              for p in profiles}
    by_profile: dict = {p: {n: {"in_process": drive(query_calls(local, queries, vectors, p), n,
                                                     seconds)} for n in CONCURRENCY}
                        for p in profiles}
    clients = [Client(addresses[main_fe], transport=main_fe) for _ in range(max(CONCURRENCY))]
    warm([cl.collection("npl") for cl in clients], queries, vectors)
    for p in profiles:
        for n in CONCURRENCY:
            by_profile[p][n]["grpc"] = drive(lambda i: query_calls(clients[i].collection("npl"),
                                                             queries, vectors, p)(i), n, seconds)
    out = {}
    for profile in profiles:
        rows, rounds_ = by_profile[profile], paired[profile]
        added = {fe: median([r["frontends"][fe]["added_p50_ms"] for r in rounds_])
                 for fe in addresses}
        out[profile] = {"one_client_rounds": rounds_, "by_clients": rows,
                        "added_p50_ms": added, "pass": added[main_fe] <= ADDED_GOAL_MS}
        console.print(table(
            f"npl · {profile} · {setup}: gRPC ({main_fe} front end) over loopback vs in-process",
            ["clients", "in-proc q/s", "in-proc p50", "in-proc p99", "gRPC q/s", "gRPC p50",
             "gRPC p99", "errors"],
            [[n, f"{r['in_process']['qps']:.0f}", f"{r['in_process']['p50_ms']:.3f}",
              f"{r['in_process']['p99_ms']:.3f}", f"{r['grpc']['qps']:.0f}",
              f"{r['grpc']['p50_ms']:.3f}", f"{r['grpc']['p99_ms']:.3f}",
              r["grpc"]["errors"] + r["in_process"]["errors"]] for n, r in rows.items()]))
        console.print(table(
            f"npl · {profile} · {setup}: 1 client, in-process and each front end alternated "
            "(p50 ms)",
            ["round", "front end", "in-proc", "gRPC", "added", "health", "server handler",
             "CPU steal"],
            [[i + 1, fe, f"{r['in_process_p50_ms']:.3f}", f"{f['grpc_p50_ms']:.3f}",
              f"{f['added_p50_ms']:.3f}", f"{f['health_p50_ms']:.3f}",
              f"{f['server_handler_p50_ms']:.3f}", f"{r['cpu_steal']:.1%}"]
             for i, r in enumerate(rounds_) for fe, f in r["frontends"].items()]))
        for fe, a in added.items():
            goal = f"(goal <= {ADDED_GOAL_MS} ms) {verdict(a <= ADDED_GOAL_MS)}" if fe == main_fe else "(reference)"
            console.print(f"added p50 latency of gRPC at 1 client, {fe} front end ({setup}, "
                          f"median of {rounds} rounds): {a:.3f} ms {goal}")
    return out, clients


def load_run(clients, queries, vectors, pid: int, seconds: float, frontend: str) -> dict:
    """16 clients, 90% queries (lexical/dense/hybrid) and 10% upserts, for ``seconds``."""
    counter = iter(range(10**9))
    lock = threading.Lock()

    def make(i):
        coll = clients[i].collection("npl")
        rng = random.Random(1000 + i)

        def call():
            r = rng.random()
            q = rng.randrange(len(queries))
            if r < 0.10:
                with lock:
                    n = next(counter)
                coll.add([{"id": f"load-{n}", "title": "", "text": f"load document {n} {queries[q]}"}])
            elif r < 0.40:
                coll.query(queries[q], profile="lexical", k=10)
            elif r < 0.70:
                coll.query(vector=vectors[q], profile="dense", k=10)
            else:
                coll.query(queries[q], profile="hybrid", k=10)
        return call

    warm = min(10.0, seconds / 6)
    drive(make, 16, warm)
    rss_warm = rss_mib(pid)
    res = drive(make, 16, seconds)
    rss_end = rss_mib(pid)
    growth = rss_end / rss_warm - 1
    ok = res["errors"] == 0 and growth <= 0.20
    res.update({"seconds": seconds, "rss_after_warmup_mib": rss_warm, "rss_end_mib": rss_end,
                "rss_growth": growth, "pass": ok})
    res["frontend"] = frontend
    console.print(table(f"load run ({frontend} front end): 16 clients, 90% queries / 10% "
                        f"upserts, {seconds:.0f} s",
                        ["calls", "q/s", "p50 ms", "p99 ms", "errors", "RSS warm MiB",
                         "RSS end MiB", "growth", "verdict"],
                        [[res["calls"], f"{res['qps']:.0f}", f"{res['p50_ms']:.2f}",
                          f"{res['p99_ms']:.2f}", res["errors"], f"{rss_warm:.0f}",
                          f"{rss_end:.0f}", f"{growth:+.1%}", verdict(ok)]]))
    if res["first_errors"]:
        console.print(f"first errors: {res['first_errors']}")
    return res


if __name__ == "__main__":
    main()
