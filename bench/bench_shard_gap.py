"""Which profiles a sharded collection does not yet answer as one node: per profile, how
many of a collection's queries get other top-10 ids from 2 in-process shards than from one
node holding the same documents (issue 43: kinds that train a collection-level artifact
train it per shard today).

``python bench/bench_shard_gap.py [--collection cacm] [--docs 400] [--queries 12]
[--out FILE.json]``

The model (float32) encodes the documents (the router encodes each batch once, one node
each batch: the same vectors) and the query texts; a named field ``ivf`` holds seeded
random vectors under ``IVF8,Flat`` at its default nprobe. Default search depths
everywhere (the parity tests use a documented deeper one for HNSW and IVF).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from polyindex.distributed.serving import ShardedEngine
from polyindex.engine import Engine

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
KINDS = ["lexical", "dense:HNSW16,Flat", "dense@ivf:dim=384,metric=cosine,IVF8,Flat",
         "sparse:UHD4096,k=16,epochs=1", "tree:branch=4,leaf=8",
         "multivector:KMeans16,residual=PQ4"]
PROFILES = ["lexical", "dense", "dense@ivf", "sparse", "tree", "multivector", "hybrid",
            "hybrid-mv", "ltr"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--collection", default="cacm")
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--queries", type=int, default=12)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    folder = SHARED / a.collection
    if not folder.is_dir():
        sys.exit(f"{folder} not found: the shared IR collections are not here")
    docs = []
    rng = np.random.default_rng(3)
    with open(folder / "corpus.jsonl") as f:
        for line in f:
            d = json.loads(line)
            v = rng.normal(size=384).astype(np.float32)
            docs.append({"id": str(d["_id"]), "title": d.get("title") or "", "text": d["text"],
                         "vectors": {"ivf": (v / np.linalg.norm(v)).tolist()}})
            if len(docs) == a.docs:
                break
    with open(folder / "queries.jsonl") as f:
        queries = [json.loads(line)["text"] for line in f][:a.queries]
    qv = rng.normal(size=(len(queries), 384)).astype(np.float32)
    qv = list(qv / np.linalg.norm(qv, axis=1, keepdims=True))
    tmp = Path(tempfile.mkdtemp(prefix="shard-gap-"))
    try:
        one = Engine(tmp / "one").create_collection("c", KINDS, dtype="float32")
        eng = ShardedEngine.in_process(tmp / "sharded", shards=2)
        routed = eng.create_collection("c", KINDS, dtype="float32")
        t = time.perf_counter()
        for lo in range(0, len(docs), 200):
            one.add(docs[lo:lo + 200])
            routed.add(docs[lo:lo + 200])
        print(f"built {len(docs)} documents twice in {time.perf_counter() - t:.0f} s",
              file=sys.stderr)
        rows = []
        for p in PROFILES:
            kw = {"vectors": qv, "using": "ivf"} if p == "dense@ivf" else {}
            texts = None if kw else queries
            x = one.query_batch(texts, k=10, profile=p, **kw)
            y = routed.query_batch(texts, k=10, profile=p, **kw)
            differ = sum([h.id for h in u] != [h.id for h in w] for u, w in zip(x, y))
            rows.append({"profile": p, "queries": len(queries), "differ": differ})
            print(f"{p:12s} {differ:3d} of {len(queries)} queries differ", flush=True)
        eng.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.out:
        a.out.write_text(json.dumps({"collection": a.collection, "docs": len(docs),
                                     "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
