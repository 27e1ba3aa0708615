"""Sharded serving: what the router adds per query, and bytes per document per index kind.

``python bench/bench_shards.py [--collections nfcorpus,npl] [--shards 1,2,4] [--queries 200]
[--ray] [--bytes]``

Per collection: one node and S shards built with the same writes (documents in two batches;
the same embeddings for both: seeded random unit vectors, so no model runs and a 2-core
machine can build npl in seconds; queries are the collection's own texts with random query
vectors), then ``lexical``, ``dense``, ``hybrid`` and ``ltr`` one query at a time, one node and
the router interleaved (ABAB) so both see the same machine: p50 per query and the router's
added latency (router p50 minus one-node p50), and whether every answer was equal (same ids,
order and scores). In-process shards (``LocalShards``) measure the router's own work (S
shards' searches run one after another in this process, as a single core would); ``--ray``
adds shards as Ray actors (2 CPUs here: actors and the router share them), which measures
the fan-out over Ray's object transport as well.

``--bytes``: a cranfield collection with all five kinds (embeddings from the model, float32)
and the bytes per document of each kind's files, for docs/SCALE.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

PROFILES = ("lexical", "dense", "hybrid", "ltr")
INDEXES = ["lexical", "dense"]


def _docs(name: str):
    folder = common.collection_folder(name)
    if folder is None:
        return None
    ids, titles, texts = common.read_corpus(folder)
    docs = [{"id": i, "title": t or "", "text": x} for i, t, x in zip(ids, titles, texts)]
    queries = [q for _, q in common.read_queries(folder)]
    return docs, queries


def _unit(rng, n):
    x = rng.normal(size=(n, 384)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _build(tmp: Path, docs, emb, n_shards: int, ray: bool):
    from polyindex.distributed.backends import LocalShards
    from polyindex.distributed.router import ShardedCollection
    from polyindex.distributed.shard import Shard
    if ray:
        from polyindex.distributed.serving import ShardedEngine
        eng = ShardedEngine(tmp / f"ray{n_shards}", shards=n_shards)
        eng.create_collection("c", INDEXES)
        routed, closer = eng.collection("c"), eng.close
    else:
        shards = [Shard(tmp / f"s{n_shards}-{s}") for s in range(n_shards)]
        for sh in shards:
            sh.create("c", INDEXES, {})
        routed = ShardedCollection("c", LocalShards(shards))
        closer = lambda: [sh.close() for sh in shards]  # noqa: E731
    half = len(docs) // 2
    for lo, hi in ((0, half), (half, len(docs))):
        routed.add(docs[lo:hi], embeddings=emb[lo:hi])
    routed.seal()
    return routed, closer


def _p50_ms(target, queries, qvecs, profile) -> tuple[float, list]:
    times, answers = [], []
    for q, v in zip(queries, qvecs):
        t = time.perf_counter()
        answers.append(target.query(q, vector=v, k=10, profile=profile))
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1000), answers


def _equal(a, b) -> bool:
    return all([h.id for h in x] == [h.id for h in y] and
               np.allclose([h.score for h in x], [h.score for h in y], rtol=1e-5)
               for x, y in zip(a, b))


def latency(args) -> list[dict]:
    from polyindex.engine import Engine
    rows = []
    for name in common.parse_list(args.collections):
        got = _docs(name)
        if got is None:
            continue
        docs, queries = got
        rng = np.random.default_rng(0)
        emb = _unit(rng, len(docs))
        queries = queries[:args.queries]
        qvecs = list(_unit(rng, len(queries)))
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-shards-{name}-"))
        one = Engine(tmp / "one").create_collection("c", INDEXES)
        half = len(docs) // 2
        one.add(docs[:half], embeddings=emb[:half])
        one.add(docs[half:], embeddings=emb[half:])
        for n_shards in common.parse_list(args.shards):
            for ray in ([False, True] if args.ray else [False]):
                routed, close = _build(tmp, docs, emb, int(n_shards), ray)
                for profile in PROFILES:
                    _p50_ms(one, queries[:10], qvecs[:10], profile)  # warm: stats, numba
                    _p50_ms(routed, queries[:10], qvecs[:10], profile)
                    a_ms, b_ms, equal = [], [], True
                    for _ in range(args.rounds):
                        ms, a = _p50_ms(one, queries, qvecs, profile)
                        a_ms.append(ms)
                        ms, b = _p50_ms(routed, queries, qvecs, profile)
                        b_ms.append(ms)
                        equal = equal and _equal(a, b)
                    one_p50, routed_p50 = float(np.median(a_ms)), float(np.median(b_ms))
                    rows.append({"collection": name, "docs": len(docs), "shards": int(n_shards),
                                 "backend": "ray" if ray else "in-process", "profile": profile,
                                 "one_node_p50_ms": round(one_p50, 3),
                                 "router_p50_ms": round(routed_p50, 3),
                                 "added_ms": round(routed_p50 - one_p50, 3),
                                 "ratio": round(routed_p50 / one_p50, 2), "equal": equal})
                    print(json.dumps(rows[-1]), flush=True)
                close()
    return rows


def kind_bytes() -> dict:
    """Bytes per document of each kind's files on the demo cranfield (all five kinds)."""
    from polyindex.engine import Engine
    src = common.REPO / "engine" / "cli" / "demo_data" / "cranfield"
    tmp = Path(tempfile.mkdtemp(prefix="bench-shards-bytes-"))
    coll = Engine(tmp).create_collection("c", ["lexical", "dense", "multivector", "sparse",
                                               "tree"], dtype="float32")
    coll.index(src)
    n = coll.count()
    seg_dirs = [p for p in (tmp / "c" / "segments").iterdir() if p.is_dir()]
    out: dict[str, float] = {}
    for seg in seg_dirs:
        for f in seg.iterdir():
            kind = f.name.split(".")[0]
            out[kind] = out.get(kind, 0) + f.stat().st_size
    return {"documents": n, "bytes_per_doc": {k: round(v / n, 1) for k, v in sorted(out.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", default="nfcorpus,npl")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ray", action="store_true")
    ap.add_argument("--bytes", action="store_true")
    args = ap.parse_args()
    payload = {"latency": latency(args)}
    if args.ray:
        from polyindex.distributed import cluster
        cluster.require_ray().shutdown()
    common.table("router latency (p50 per query, one at a time)",
                 ["collection", "S", "backend", "profile", "one node ms", "router ms", "added ms",
                  "equal"],
                 [[r["collection"], r["shards"], r["backend"], r["profile"], r["one_node_p50_ms"],
                   r["router_p50_ms"], r["added_ms"], r["equal"]] for r in payload["latency"]])
    if args.bytes:
        payload["bytes"] = kind_bytes()
        print(json.dumps(payload["bytes"]))
    print(common.save_results("bench_shards", payload))


if __name__ == "__main__":
    main()
