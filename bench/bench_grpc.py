"""gRPC service: latency and throughput over loopback against the same queries in-process.

Measures, on npl (11k docs, 93 queries), for the `lexical` profile (query text) and the
`dense` profile (precomputed query vectors, so the model's encode is not in either number):
queries/s and p50/p99 latency at 1, 4 and 16 concurrent clients, through `polyindex serve`
(a subprocess on 127.0.0.1, one client object per thread) and in-process (threads calling
`Collection.query` on the same data). Reports the added p50 latency of gRPC at 1 client
(goal: <= 1 ms for `dense` and `lexical`).

Then a load run (default 60 s): 16 clients, 90% queries / 10% upserts; target: zero errors
and the server's RSS at the end within 20% of its RSS after warm-up.

    python bench/bench_grpc.py [--seconds 5] [--load-seconds 60] [--fresh]
"""
from __future__ import annotations

import argparse
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import (ENGINE_DATA, collection_folder, console, ensure_collection,  # noqa: E402
                    polyindex_cmd, read_corpus, read_queries, save_results, table, verdict)

CONCURRENCY = (1, 4, 16)


def start_server(data: Path, workers: int = 32) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([*polyindex_cmd(), "serve", "--data", str(data), "--port", "0",
                             "--workers", str(workers)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    m = re.search(r"serving on (\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r}")
    return proc, m.group(1)


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


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
        it = iter(order * 100000)
        if profile == "dense":
            return lambda: coll.query(vector=vectors[next(it)], profile="dense", k=10)
        return lambda: coll.query(queries[next(it)], profile="lexical", k=10)
    return make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    ap.add_argument("--load-seconds", type=float, default=60.0)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    folder = collection_folder("npl")
    if folder is None:
        return
    import polyindex
    from polyindex.client import Client
    ids, _, _ = read_corpus(folder)
    ensure_collection("npl", folder, len(set(ids)), fresh=args.fresh)
    tmp = Path(tempfile.mkdtemp(prefix="bench-grpc-"))
    data = tmp / "data"
    shutil.copytree(ENGINE_DATA / "npl", data / "npl")  # the load run writes: use a copy
    queries = [t for _, t in read_queries(folder)]
    local = polyindex.open(data).collection("npl")
    vectors = local.encoder.encode(queries)
    proc, address = start_server(data)
    results: dict = {"address": address, "seconds": args.seconds, "profiles": {}}
    try:
        clients = [Client(address) for _ in range(max(CONCURRENCY))]
        for c in [local] + [cl.collection("npl") for cl in clients]:  # warm both sides
            for q, v in zip(queries[:5], vectors[:5]):
                c.query(q, profile="lexical")
                c.query(vector=v, profile="dense")
        for profile in ("lexical", "dense"):
            rows = {}
            for n in CONCURRENCY:
                rows[n] = {
                    "in_process": drive(query_calls(local, queries, vectors, profile), n, args.seconds),
                    "grpc": drive(lambda i: query_calls(clients[i].collection("npl"), queries,
                                                        vectors, profile)(i), n, args.seconds)}
            added = rows[1]["grpc"]["p50_ms"] - rows[1]["in_process"]["p50_ms"]
            results["profiles"][profile] = {"by_clients": rows, "added_p50_ms": added,
                                            "pass": added <= 1.0}
            console.print(table(
                f"npl · {profile}: gRPC over loopback vs in-process",
                ["clients", "in-proc q/s", "in-proc p50", "in-proc p99", "gRPC q/s", "gRPC p50",
                 "gRPC p99", "errors"],
                [[n, f"{r['in_process']['qps']:.0f}", f"{r['in_process']['p50_ms']:.3f}",
                  f"{r['in_process']['p99_ms']:.3f}", f"{r['grpc']['qps']:.0f}",
                  f"{r['grpc']['p50_ms']:.3f}", f"{r['grpc']['p99_ms']:.3f}",
                  r["grpc"]["errors"] + r["in_process"]["errors"]] for n, r in rows.items()]))
            console.print(f"added p50 latency of gRPC at 1 client: {added:.3f} ms (goal <= 1 ms) "
                          f"{verdict(added <= 1.0)}")
        results["load"] = load_run(clients, queries, vectors, proc.pid, args.load_seconds)
    finally:
        proc.terminate()
        try:
            results["server_exit_code"] = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            results["server_exit_code"] = None
        shutil.rmtree(tmp, ignore_errors=True)
    save_results("bench_grpc", results)


def load_run(clients, queries, vectors, pid: int, seconds: float) -> dict:
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
    console.print(table(f"load run: 16 clients, 90% queries / 10% upserts, {seconds:.0f} s",
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
