"""A dense query's cost per segment: ``--segments`` segments of ``--rows`` vectors against
the same rows as one exact (``Flat``) segment, through the vector lane, and raw faiss beside
it (the segments searched one call each, one ``IndexShards`` call, one ``Flat``), all in one
process in interleaved rounds (issue 38: ~18 us a segment before ``index/dense/shards``).

    .venv/bin/python bench/bench_dense_segments.py --segments 100 --rows 100

Writes bench/results/bench_dense_segments.json.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from common import WORK, console, save_results, table  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--segments", type=int, default=100)
    ap.add_argument("--rows", type=int, default=100)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--work", type=Path, default=WORK / "dense_segments")
    args = ap.parse_args()
    os.environ["POLYINDEX_MERGE_EMBEDDED"] = "0"  # the segments as written
    from polyindex.config import reload_settings
    reload_settings()
    import faiss
    import polyindex
    shutil.rmtree(args.work, ignore_errors=True)
    rng = np.random.default_rng(0)
    n = args.segments * args.rows
    x = rng.standard_normal((n, args.dim)).astype(np.float32)
    q = rng.standard_normal((args.queries, args.dim)).astype(np.float32)
    eng = polyindex.open(args.work)
    many = eng.create_collection("many", ["dense:Flat"], model=None)
    one = eng.create_collection("one", ["dense:Flat"], model=None)
    for s in range(0, n, args.rows):
        many.add([{"id": f"d{i}", "vector": x[i]} for i in range(s, s + args.rows)])
    one.add([{"id": f"d{i}", "vector": x[i]} for i in range(n)])
    same = all([(h.id, h.score) for h in many.query(vector=v, k=10)] ==
               [(h.id, h.score) for h in one.query(vector=v, k=10)] for v in q)
    faiss.omp_set_num_threads(1)
    subs = []
    for s in range(0, n, args.rows):
        sub = faiss.IndexFlatIP(args.dim)
        sub.add(x[s:s + args.rows])
        subs.append(sub)
    shards = faiss.IndexShards(args.dim, False, True)
    shards.metric_type = faiss.METRIC_INNER_PRODUCT
    for sub in subs:
        shards.add_shard(sub)
    flat = faiss.IndexFlatIP(args.dim)
    flat.add(x)
    runs = {
        "lane, many segments": lambda v: many.query(vector=v, k=10),
        "lane, one segment": lambda v: one.query(vector=v, k=10),
        "faiss, a call per segment": lambda v: [s.search(v[None], 11) for s in subs],
        "faiss, IndexShards": lambda v: shards.search(v[None], 11),
        "faiss, one Flat": lambda v: flat.search(v[None], 11),
    }
    times = {name: [] for name in runs}
    for name, fn in runs.items():  # warm
        for v in q[:20]:
            fn(v)
    order = list(runs.items())
    for r in range(args.rounds):
        for name, fn in order[r % len(order):] + order[:r % len(order)]:
            for v in q:
                t0 = time.perf_counter()
                fn(v)
                times[name].append((time.perf_counter() - t0) * 1e6)
    p50 = {name: round(statistics.median(v), 1) for name, v in times.items()}
    eng.close()
    console.print(table(f"{args.segments} segments of {args.rows} x {args.dim}, p50 us; "
                        f"lane hits equal one segment's: {same}",
                        ["search", "p50 us", "vs one segment"],
                        [[name, us, f"{us / p50['lane, one segment']:.2f}x"
                          if name.startswith("lane") else
                          f"{us / p50['faiss, one Flat']:.2f}x"] for name, us in p50.items()]))
    save_results("bench_dense_segments", {"args": {k: str(v) for k, v in vars(args).items()},
                                          "p50_us": p50, "same_hits": same})


if __name__ == "__main__":
    main()
