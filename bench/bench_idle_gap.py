"""How much slower a query runs right after the CPU idled: the part of a server's latency that
no transport change removes.

On npl, in-process, one query at a time: the p50 of `Collection.query` in a tight loop, and
with a ``--gap`` sleep before each query (a server's worker waits about that long for the
next request from one client: a gRPC round trip). Both are timed with the thread's CPU time
too, so a slower query is told from a query that waited. The two are interleaved
``--passes`` times (ABBA) so drifts in this VM's speed bias neither.

    python bench/bench_idle_gap.py [--gap-ms 0.7] [--queries 1500] [--passes 4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import (  # noqa: E402
    ENGINE_DATA,
    collection_folder,
    console,
    ensure_collection,
    interleaved,
    median,
    read_corpus,
    read_queries,
    save_results,
    table,
)


def measure(call, n: int, gap_s: float) -> tuple[float, float]:
    """(wall p50 ms, thread CPU p50 ms) of ``call(i)``, sleeping ``gap_s`` before each."""
    wall, cpu = [], []
    for i in range(n):
        if gap_s:
            time.sleep(gap_s)
        w, c = time.perf_counter(), time.thread_time()
        call(i)
        cpu.append((time.thread_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return median(wall), median(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gap-ms", type=float, default=0.7)
    ap.add_argument("--queries", type=int, default=1500, help="per measurement")
    ap.add_argument("--passes", type=int, default=4)
    args = ap.parse_args()
    folder = collection_folder("npl")
    if folder is None:
        return
    import polyindex
    ids, _, _ = read_corpus(folder)
    ensure_collection("npl", folder, len(set(ids)))
    coll = polyindex.open(ENGINE_DATA).collection("npl")
    queries = [t for _, t in read_queries(folder)]
    vectors = coll.encoder.encode(queries)
    calls = {"lexical": lambda i: coll.query(queries[i % len(queries)], profile="lexical", k=10),
             "dense": lambda i: coll.query(vector=vectors[i % len(queries)], profile="dense", k=10)}
    results, rows = {"gap_ms": args.gap_ms, "profiles": {}}, []
    for name, call in calls.items():
        measure(call, 200, 0.0)  # warm
        samples = interleaved({"tight": lambda: measure(call, args.queries, 0.0),
                               "gap": lambda: measure(call, args.queries, args.gap_ms / 1000)},
                              args.passes)
        r = {k: {"wall_p50_ms": median(w for w, _ in v), "cpu_p50_ms": median(c for _, c in v)}
             for k, v in samples.items()}
        r["slowdown"] = r["gap"]["cpu_p50_ms"] / r["tight"]["cpu_p50_ms"]
        results["profiles"][name] = r
        rows.append([name, f"{r['tight']['wall_p50_ms']:.3f}", f"{r['tight']['cpu_p50_ms']:.3f}",
                     f"{r['gap']['wall_p50_ms']:.3f}", f"{r['gap']['cpu_p50_ms']:.3f}",
                     f"{r['slowdown']:.2f}x"])
    console.print(table(f"npl, in-process, 1 query at a time: tight loop vs {args.gap_ms:g} ms "
                        f"idle before each query (median of {args.passes} passes)",
                        ["profile", "tight wall p50", "tight CPU p50", "after gap wall p50",
                         "after gap CPU p50", "CPU slowdown"], rows))
    save_results("bench_idle_gap", results)


if __name__ == "__main__":
    main()
