"""What a follower's query costs beside the writer's, without transport (issue 38 part 4).

In one process, over the same copy of npl as a lexical-only collection (built by
bench_grpc.py --lexical-only under bench/.work/lexical, or here): an online writer engine and
a read-only engine following it (what a `serve --processes N` follower runs), each behind the
native front's Python dispatcher (request bytes in, response bytes out: the part of a call
that runs under the GIL). Rounds alternate writer and reader; per call: the dispatcher's CPU
time (``time.thread_time``), ``Collection.view()`` (the reader's WAL and manifest checks) and
``Engine.collection`` (the reader's look at the folder). Reports medians and reader / writer.

    python bench/bench_follower_cost.py [--rounds 5] [--calls 2000]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (WORK, collection_folder, console, median, read_queries,  # noqa: E402
                    run_cli, save_results, table)
from grpc_processes import query_requests  # noqa: E402


class _Call:
    """What the dispatcher asks of a call: no metadata, a far deadline, still active."""

    def metadata(self):
        return ()

    def time_remaining(self):
        return 30.0

    def is_active(self):
        return True


def per_call_us(fn, calls: int) -> float:
    t0 = time.thread_time()
    for i in range(calls):
        fn(i)
    return (time.thread_time() - t0) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    folder = collection_folder("npl")
    if folder is None:
        return
    from polyindex.engine import Engine
    from polyindex.service.metrics import Metrics
    from polyindex.service.native_front import Dispatcher, routes
    from polyindex.service.servicer import PolyindexService
    root = WORK / "lexical"
    if not (root / "npl" / "manifest.json").exists():
        run_cli(["index", folder, "--data", root, "-c", "npl", "--index", "lexical",
                 "--model", "none", "--no-progress"], json_out=False)
    queries = [t for _, t in read_queries(folder)]
    requests = query_requests(queries, [None] * len(queries), "lexical")
    tmp = Path(tempfile.mkdtemp(prefix="bench-follower-"))
    shutil.copytree(root / "npl", tmp / "npl")
    engines = {"writer": Engine(tmp, online=True), "reader": Engine(tmp, readonly=True)}
    try:
        call = _Call()
        sides = {}
        for name, eng in engines.items():
            table_ = routes(PolyindexService(eng, Metrics(eng)), "polyindex.v1.Polyindex")
            index = next(i for i, r in enumerate(table_) if r.name == "Query")
            dispatch = Dispatcher(table_, None)
            for req in requests * 3:  # warm: numba, caches, the follower's first catch-up
                assert dispatch(index, req, call)[0] == 0
            coll = eng.collection("npl")
            sides[name] = {
                "dispatch": lambda i, d=dispatch, x=index: d(x, requests[i % len(requests)], call),
                "view": lambda i, c=coll: c.view(),
                "collection": lambda i, e=eng: e.collection("npl")}
        runs = {name: {what: [] for what in fns} for name, fns in sides.items()}
        for _ in range(args.rounds):
            for what in ("dispatch", "view", "collection"):
                for name in sides:
                    n = args.calls if what == "dispatch" else args.calls * 5
                    runs[name][what].append(per_call_us(sides[name][what], n))
    finally:
        for eng in engines.values():
            eng.close()
        shutil.rmtree(tmp, ignore_errors=True)
    res = {name: {what: median(v) for what, v in per.items()} for name, per in runs.items()}
    rows = [[what, f"{res['writer'][what]:.1f}", f"{res['reader'][what]:.1f}",
             f"{res['reader'][what] - res['writer'][what]:+.1f}"]
            for what in ("dispatch", "view", "collection")]
    console.print(table(f"npl lexical, CPU us per call (medians of {args.rounds} alternated "
                        "rounds)", ["what", "writer", "reader (follower)", "reader - writer"],
                        rows))
    save_results("bench_follower_cost", {"rounds": runs, "medians": res, "calls": args.calls})


if __name__ == "__main__":
    main()
