"""Where a dense query's time goes in the vector lane, layer by layer, beside raw FAISS.

``coll.query_ids(vector=v, k=k, profile="dense")`` is timed together with each layer it
calls, every layer a complete call of its own (so a layer's cost is its time less the one
it calls), and FAISS ``IndexFlatIP.search`` on the same stored vectors (``bench_peers``'s
reference), in one process pinned to one core, rounds interleaved, CPU time of the process,
best round of ``--rounds``, microseconds a query:

- ``faiss search``: ``flat.search(row, k)`` (the peer: its Python wrapper allocates the
  outputs, checks the array and calls ``search_c``);
- ``faiss search_c``: ``flat.search_c`` into outputs made once (faiss without its wrapper);
- ``kernel``: the lane's small flat part, ``SmallFlat.rank`` (scan, top k, ids; one
  compacted flat inner-product segment: ``index/dense/small_flat``), where the plan has one;
- ``plan._ranked``: the vector's checks around it (or faiss's search and the ties);
- ``plan.rank``: the ``Ranking``;
- ``answer``: ``query/vector_lane.answer`` (the plain-call check, the snapshot, the plan's
  lookup);
- ``query_ids``: the public call; ``query``: the same answer as ``Hit`` objects.

The query vectors are the collection's queries encoded by its own model. Collections are read
from ``--data`` (an engine data directory, opened read-only).

Usage: ``python bench/bench_dense_lane.py --data DIR [--collections adi,time,nfcorpus]
[--k 10,100] [--rounds 20] [--max-queries 100]``
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from bench_peers import pin_one_core, stored_vectors  # noqa: E402
from common import console, table  # noqa: E402

LAYERS = ("faiss search", "faiss search_c", "kernel", "plan._ranked", "plan.rank", "answer",
          "query_ids", "query")


def layers(coll, flat, vecs, k: int) -> dict:
    """Each layer's call over every query vector (a callable running them all)."""
    import faiss
    from polyindex.query import vector_lane
    coll.query_ids(vector=vecs[0], k=k, profile="dense")  # the plan, made once
    snap = coll.view()
    plan = snap.cache[vector_lane.LANE_CACHE]["dense"]
    rows = [v.reshape(1, -1) for v in vecs]
    ptr = faiss.swig_ptr
    dist, keys = np.empty((1, k), np.float32), np.empty((1, k), np.int64)
    from polyindex.index.dense.lane import _MAX_SQ
    out = {
        "faiss search": lambda: [flat.search(r, k) for r in rows],
        # the outputs' pointers taken in the call: the lambda keeps the arrays alive
        "faiss search_c": lambda: [flat.search_c(1, ptr(r), k, ptr(dist), ptr(keys), None)
                                   for r in rows],
        "plan._ranked": lambda: [plan._ranked(snap, v, k) for v in vecs],
        "plan.rank": lambda: [plan.rank(snap, v, k) for v in vecs],
        "answer": lambda: [vector_lane.answer(coll, "rank", None, [v], None, None, k, "dense",
                                              None, False, False, False, None) for v in vecs],
        "query_ids": lambda: [coll.query_ids(vector=v, k=k, profile="dense") for v in vecs],
        "query": lambda: [coll.query(vector=v, k=k, profile="dense") for v in vecs],
    }
    if plan.small is not None:
        small = plan.small
        out["kernel"] = lambda: [small.rank(v, k, _MAX_SQ) for v in vecs]
    return out


def measure(fns: dict, n: int, rounds: int) -> dict[str, float]:
    """CPU microseconds a query of each layer: its best round, rounds interleaved."""
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            c0 = time.process_time()
            fn()
            best[name] = min(best[name], (time.process_time() - c0) / n * 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True,
                    help="an engine data directory holding the collections (read only)")
    ap.add_argument("--collections", default="adi,time,nfcorpus")
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--max-queries", type=int, default=100)
    args = ap.parse_args()
    core = pin_one_core()
    import faiss
    import torch
    torch.set_num_threads(1)
    from polyindex.engine import Engine
    engine = Engine(args.data, readonly=True)
    results, rows = {}, []
    for name in common.parse_list(args.collections):
        folder = common.collection_folder(name)
        if folder is None:
            continue
        coll = engine.collection(name)
        _ids, emb = stored_vectors(coll)
        flat = faiss.IndexFlatIP(emb.shape[1])
        flat.add(emb)
        texts = [t for _, t in common.read_queries(folder)][:args.max_queries]
        qv = coll.encoding.encoder.encode(texts)
        vecs = [np.ascontiguousarray(qv[i]) for i in range(len(qv))]
        for k in (int(x) for x in common.parse_list(args.k)):
            kk = min(k, len(emb))
            fns = layers(coll, flat, vecs, kk)
            for fn in fns.values():
                fn()
            got = measure(fns, len(vecs), args.rounds)
            results[f"{name}@{k}"] = {"docs": len(emb), "queries": len(vecs), "us": got}
            rows.append((f"{name}@{k}", len(emb)) + tuple(
                f"{got[layer]:.2f}" if layer in got else "-" for layer in LAYERS) +
                (f"{got['faiss search'] / got['query_ids']:.2f}x",))
    console.print(table(f"dense lane, CPU us a query (best of {args.rounds} rounds, core {core})",
                        ["collection@k", "docs", *LAYERS, "faiss/query_ids"], rows))
    common.save_results("bench_dense_lane", {"core": core, "rounds": args.rounds,
                                             "results": results})


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
