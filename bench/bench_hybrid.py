"""Hybrid's fixed cost, before and after, in one process: ``coll.query(text, vector=v,
profile="hybrid")`` (lexical top 1000 and dense top 100, RRF) with the query vectors encoded
beforehand (the model is ~99% of an encoding query and the same either way).

"before" is the code as it was, put back for its rounds by patching: the lexical leg's ties
put in id order by their ids as strings (``Snapshot.id_ranks`` answering None) and fusion by
numpy's sorts over every fused key (``fusion.rrf`` without ``keep``); "after" is the code as
it is (integer id ranks, ``fusion._rrf_top``). Rounds alternate (before, after, before, ...);
each mode's best round counts, by process CPU time (``q/s``) and wall p50. The process is
pinned to one core. The answers of both modes are compared (ids and fused scores).

Usage: ``python bench/bench_hybrid.py --data DIR [--collections medline,cisi] [--k 10,100]
[--rounds 5] [--max-queries 200]`` where DIR holds collections with lexical and dense
indexes (copies of the shared cache's, e.g. ``cp -a /work/cache/base/medline DIR/``).
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


@contextmanager
def before():
    """The code before this change, for the duration of a round."""
    from polyindex.rerank import fusion
    from polyindex.storage.snapshot import Snapshot
    real_ranks, real_rrf = Snapshot.id_ranks, fusion.rrf
    Snapshot.id_ranks = lambda self, keys: None
    fusion.rrf = lambda lists, k=60, weights=None, rescale=None, keep=None: \
        real_rrf(lists, k, weights, rescale)
    try:
        yield
    finally:
        Snapshot.id_ranks, fusion.rrf = real_ranks, real_rrf


@contextmanager
def after():
    yield


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--collections", default="medline")
    ap.add_argument("--k", default="10,100")
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
        for k in [int(x) for x in common.parse_list(args.k)]:
            def once(k=k):
                return [[(h.id, h.score) for h in coll.query(t, vector=v, k=k,
                                                             profile="hybrid")]
                        for t, v in zip(texts, vecs)]
            with before():
                old = once()
            new = once()  # also the warm-up (JIT, caches)
            same = old == new
            qps = {"before": 0.0, "after": 0.0}
            p50 = {"before": float("inf"), "after": float("inf")}
            for _ in range(args.rounds):
                for mode, ctx in (("before", before), ("after", after)):
                    with ctx():
                        lat = []
                        c0 = time.process_time()
                        for t, v in zip(texts, vecs):
                            t0 = time.perf_counter_ns()
                            coll.query(t, vector=v, k=k, profile="hybrid")
                            lat.append(time.perf_counter_ns() - t0)
                        cpu = time.process_time() - c0
                    qps[mode] = max(qps[mode], len(texts) / cpu)
                    p50[mode] = min(p50[mode], float(np.median(lat)) / 1e3)
            row = {"queries": len(texts), "segments": len(coll.view().segments), "qps": qps,
                   "p50_us": p50, "speedup": qps["after"] / qps["before"], "same": same}
            payload["results"][f"{name}@{k}"] = row
            rows.append((f"{name}@{k}", row["segments"], f"{qps['before']:.0f}",
                         f"{qps['after']:.0f}", f"{row['speedup']:.2f}x",
                         f"{p50['before']:.0f}", f"{p50['after']:.0f}", str(same)))
            console.print(f"{name} k={k}: before {qps['before']:.0f} q/s, after "
                          f"{qps['after']:.0f} q/s ({row['speedup']:.2f}x), same: {same}")
    console.print(table("hybrid q/s by CPU time (vectors given; best round, interleaved)",
                        ["collection@k", "segments", "before", "after", "after/before",
                         "p50 us before", "after", "same answers"], rows))
    common.save_results("bench_hybrid", payload)


if __name__ == "__main__":
    main()
