"""What cutting a run of equal scores by id costs hybrid (issue 43), in one process:
``coll.query(text, vector=v, profile="hybrid")`` (lexical top 1000 and dense top 100, RRF)
with the query vectors encoded beforehand.

"before" is the old cut, put back for its rounds by patching: the lexical kind's
``completes_ties`` off, so each segment is asked for k rows and the merged lists are cut by
(score, row); "after" is the code as it is (each segment asked for k + 1, a run straddling
the k-th place completed and cut by id: ``pipeline._complete_runs``, ``ties.cut_ties``).
Rounds alternate (before, after, before, ...); each mode's best round counts, by process CPU
time (``q/s``) and wall p50. The process is pinned to one core. Also counted: the queries
whose lexical top 1000 ends inside a run (the 1,001st score equals the 1,000th), the only
ones the change can answer otherwise or search again, and how many answers differ.

Usage: ``python bench/bench_tie_cut.py --data DIR [--collections cacm,nfcorpus]
[--rounds 5] [--max-queries 200]`` where DIR holds collections with lexical and dense
indexes (copies of the shared cache's, e.g. ``cp -a /work/cache/base/cacm DIR/``).
"""
from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import console, table  # noqa: E402

K_LEXICAL = 1000  # hybrid's lexical depth


@contextmanager
def before():
    """The cut by rows, for the duration of a round."""
    from polyindex.index.lexical.kind import LexicalKind
    LexicalKind.completes_ties = False
    try:
        yield
    finally:
        LexicalKind.completes_ties = True


@contextmanager
def after():
    yield


def straddling(coll, texts) -> int:
    """Queries whose lexical top ``K_LEXICAL`` ends inside a run of equal scores."""
    from polyindex.query.pipeline import allow_masks, retrieve
    from polyindex.query.requests import make_queries
    snap = coll.view()
    scores, keys = retrieve(snap, make_queries(texts, None), "lexical", K_LEXICAL + 1, {},
                            allow_masks(snap, None))
    if scores.shape[1] <= K_LEXICAL:
        return 0
    return int(((keys[:, K_LEXICAL] >= 0)
                & (scores[:, K_LEXICAL] == scores[:, K_LEXICAL - 1])).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--collections", default="cacm,nfcorpus")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-queries", type=int, default=200)
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args()
    if not args.no_pin:
        from bench_peers import pin_one_core
        pin_one_core()
    import torch
    torch.set_num_threads(1)
    from polyindex.engine import Engine
    engine = Engine(args.data, readonly=True)
    payload: dict = {"rounds": args.rounds, "results": {}}
    rows = []
    for name in common.parse_list(args.collections):
        folder = common.collection_folder(name)
        coll = engine.collection(name)
        texts = [t for _, t in common.read_queries(folder)][:args.max_queries]
        vecs = np.ascontiguousarray(coll.encoding.encoder.encode(texts, chunk=len(texts)),
                                    dtype=np.float32)

        def once():
            return [[(h.id, h.score) for h in coll.query(t, vector=v, k=10, profile="hybrid")]
                    for t, v in zip(texts, vecs)]
        with before():
            old = once()
        new = once()  # also the warm-up (JIT, caches)
        differ = sum(a != b for a, b in zip(old, new))
        qps = {"before": 0.0, "after": 0.0}
        p50 = {"before": float("inf"), "after": float("inf")}
        for _ in range(args.rounds):
            for mode, ctx in (("before", before), ("after", after)):
                with ctx():
                    lat = []
                    c0 = time.process_time()
                    for t, v in zip(texts, vecs):
                        t0 = time.perf_counter_ns()
                        coll.query(t, vector=v, k=10, profile="hybrid")
                        lat.append(time.perf_counter_ns() - t0)
                    cpu = time.process_time() - c0
                qps[mode] = max(qps[mode], len(texts) / cpu)
                p50[mode] = min(p50[mode], float(np.median(lat)) / 1e3)
        row = {"queries": len(texts), "segments": len(coll.view().segments),
               "straddling": straddling(coll, texts), "top10_differ": differ, "qps": qps,
               "p50_us": p50, "ratio": qps["after"] / qps["before"]}
        payload["results"][name] = row
        rows.append((name, row["segments"], row["queries"], row["straddling"], differ,
                     f"{qps['before']:.0f}", f"{qps['after']:.0f}", f"{row['ratio']:.2f}x",
                     f"{p50['before']:.0f}", f"{p50['after']:.0f}"))
        console.print(f"{name}: {row['straddling']} of {len(texts)} queries straddle; before "
                      f"{qps['before']:.0f} q/s, after {qps['after']:.0f} q/s "
                      f"({row['ratio']:.2f}x); top 10 differ: {differ}")
    console.print(table("hybrid q/s by CPU time, ties cut by rows (before) vs by id (after)",
                        ["collection", "segments", "queries", "straddle k=1000",
                         "top 10 differ", "before", "after", "after/before",
                         "p50 us before", "after"], rows))
    common.save_results("bench_tie_cut", payload)


if __name__ == "__main__":
    main()
