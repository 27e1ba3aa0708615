"""The native front end's cost per call on the server: CPU seconds of the server process per
lexical Query and per health Check (answered in C++ alone: the transport's floor), measured in
the same rounds, and how many server threads the calls went through (issue 38 part 4).

One `polyindex serve --frontend native` over npl as a lexical-only collection (built by
bench_grpc.py --lexical-only under bench/.work/lexical, or here), ``--clients`` threads each
on its own native channel (the channel releases the GIL), rounds alternating Query and Check.
A server that starts a thread per few calls shows it in ``threads seen``.

    python bench/bench_front_cpu.py --clients 1,8 --calls 2000 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (WORK, collection_folder, console, median, read_queries,  # noqa: E402
                    run_cli, save_results, start_serving, table)
from grpc_processes import _cpu, _tree  # noqa: E402

QUERY = "/polyindex.v1.Polyindex/Query"
HEALTH = "/grpc.health.v1.Health/Check"


def drive(address: str, path: str, requests: list[bytes], clients: int, calls: int,
          pid: int) -> dict:
    """``calls`` calls per client; server CPU per call (us), wall per call, threads seen."""
    from polyindex.client.remote import _grpc_channel
    channels = [_grpc_channel.Channel(address, False, None, 64 << 20) for _ in range(clients)]
    errors: list[int] = []

    def client(ch, offset: int) -> None:
        for i in range(calls):
            code = ch.unary(path, requests[(offset + i) % len(requests)], 30.0, ())[0]
            if code:
                errors.append(code)
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(os.listdir(f"/proc/{pid}/task"))
            done.wait(0.002)
    threads = [threading.Thread(target=client, args=(ch, 7 * j)) for j, ch in enumerate(channels)]
    watcher = threading.Thread(target=watch)
    pids = _tree(pid)
    c0, t0 = _cpu(pids), time.perf_counter()
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    c1, t1 = _cpu(pids), time.perf_counter()
    done.set()
    watcher.join()
    for ch in channels:
        ch.close()
    n = clients * calls
    return {"cpu_us": (c1 - c0) / n * 1e6, "wall_us": (t1 - t0) / n * 1e6,
            "threads_seen": len(seen), "errors": len(errors)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--calls", type=int, default=2000, help="per client and measurement")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from polyindex.client.remote import _grpc_channel
    from polyindex.service import native_front
    if _grpc_channel is None or not native_front.available():
        raise SystemExit("SKIP: the native front end or channel is not built (make native)")
    from grpc_health.v1 import health_pb2

    from polyindex.proto.polyindex.v1 import polyindex_pb2 as pb
    folder = collection_folder("npl")
    if folder is None:
        raise SystemExit("SKIP: npl is not in the shared data")
    root = WORK / "lexical"
    if not (root / "npl" / "manifest.json").exists():
        run_cli(["index", folder, "--data", root, "-c", "npl", "--index", "lexical",
                 "--model", "none", "--no-progress"], json_out=False)
    queries = [pb.QueryRequest(collection="npl", profile="lexical", k=10, text=t)
               .SerializeToString() for _, t in read_queries(folder)]
    health = [health_pb2.HealthCheckRequest().SerializeToString()]
    proc, address = start_serving(["--data", root, "--port", 0, "--frontend", "native",
                                   "--readonly"], stderr=subprocess.DEVNULL)
    out: dict = {}
    try:
        drive(address, QUERY, queries, 8, 50, proc.pid)  # warm-up: caches, threads
        for clients in map(int, args.clients.split(",")):
            runs: dict = {"query": [], "health": []}
            for r in range(args.rounds):
                order = ("query", "health") if r % 2 == 0 else ("health", "query")
                for what in order:
                    runs[what].append(drive(address, QUERY if what == "query" else HEALTH,
                                            queries if what == "query" else health, clients,
                                            args.calls, proc.pid))
            out[clients] = {w: {k: median([x[k] for x in rs]) for k in rs[0]} | {"rounds": rs}
                            for w, rs in runs.items()}
    finally:
        proc.terminate()
        proc.wait(60)
    rows = [[c, w, f"{v['cpu_us']:.0f}", f"{v['wall_us']:.0f}", v["threads_seen"], v["errors"]]
            for c, per in out.items() for w, v in per.items()]
    console.print(table(f"native front: server CPU per call (median of {args.rounds} rounds, "
                        f"{args.calls} calls per client)",
                        ["clients", "call", "server CPU us/call", "wall us/call",
                         "threads seen", "errors"], rows))
    save_results("bench_front_cpu", {"clients": out, "calls": args.calls,
                                     "load_average": os.getloadavg()})


if __name__ == "__main__":
    main()
