"""Batched multivector search against one query at a time (issue 39 part 2), on an indexed
collection: the judged queries' tokens encoded once, then ``MultivectorKind.search_snapshot``
over the whole batch (one first- and one final-pass kernel call per segment per 64 queries)
against one call per query, interleaved (ABBA passes, median); the top k must be the same.

Usage: ``python bench/bench_mv_batch.py --data DATA --collection NAME --source BEIR_FOLDER
[--passes 3] [--k 100]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import console, median  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--collection", required=True)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--k", type=int, default=100)
    args = ap.parse_args(argv)
    import polyindex
    from polyindex.query.requests import make_queries
    coll = polyindex.open(args.data, readonly=True).collection(args.collection)
    qs = common.judged(common.read_queries(args.source), common.read_qrels(args.source))
    queries = make_queries([t for _, t in qs], None)
    coll.encoding.fill_queries(queries, False, True)
    snap = coll.view()
    kind = coll.kinds["multivector"]
    segs = [s.indexes["multivector"] for s in snap.segments]
    allow = [None] * len(segs)

    def search(batch):
        prep = kind.prepare(batch, segs, snap.live, {}, {})
        return kind.search_snapshot(prep, segs, snap.bases, args.k, {}, allow)
    got = {"batched": search(queries)[1],
           "one": np.concatenate([search([q])[1] for q in queries])}
    same = float(np.mean([set(a[a >= 0]) == set(b[b >= 0])
                          for a, b in zip(got["batched"], got["one"])]))

    def timed(fn):
        def run():
            t = time.perf_counter()
            fn()
            return len(queries) / (time.perf_counter() - t)
        return run
    qps = common.interleaved({"batched": timed(lambda: search(queries)),
                              "one at a time": timed(lambda: [search([q]) for q in queries])},
                             args.passes)
    qps = {k: median(v) for k, v in qps.items()}
    console.print(f"{args.collection}: {len(queries)} queries, search only (tokens encoded "
                  f"before): batched {qps['batched']:.1f} q/s, one at a time "
                  f"{qps['one at a time']:.1f} q/s ({qps['batched'] / qps['one at a time']:.2f}x);"
                  f" same top {args.k}: {same:.3f}")
    common.save_results("bench_mv_batch", {"collection": args.collection, "qps": qps,
                                           "same_top": same, "queries": len(queries)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
