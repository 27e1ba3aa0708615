"""Pure sparse through the engine: the ``recon`` sparse index against dense flat (issue 23 b).

Per collection an engine collection (``bench/.work/sparse/recon/<name>``) gets the stored
float32 document embeddings of ``bench/.work/engine/<name>`` (``Collection.add(...,
embeddings=)``, no re-encoding) with ``dense:Flat`` and the sparse factory string under test
(default ``sparse:UHD4096,k=256,rescore=0,recon``); the judged test queries' stored vectors
are sent as query vectors (the text encoding both would share is excluded). Reports per
collection: nDCG@10 (ir-measures) of profiles ``dense`` and ``sparse``, their ratio, the
sparse index's bytes per document (its segment files over the documents) against dense
flat's, and ms per query one at a time (interleaved passes, medians) with the postings read.

Usage: ``python bench/bench_sparse_recon.py [--collections nfcorpus,npl] [--factory ...]
[--passes 3]``; JSON to ``bench/results/bench_sparse_recon.json``.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_sparse_levers as levers  # noqa: E402
import common  # noqa: E402
from common import WORK, console, median, table  # noqa: E402

FACTORY = "sparse:UHD4096,k=256,rescore=0,recon"
BATCH = 50_000  # one segment: the projector trains on every document, as the levers bench


def build(name: str, factory: str, ids, x):
    import polyindex
    folder = WORK / "sparse" / "recon"
    shutil.rmtree(folder / name, ignore_errors=True)
    eng = polyindex.open(folder)
    coll = eng.create_collection(name, ["dense:Flat", factory], dtype="float32")
    t = time.time()
    for s in range(0, len(ids), BATCH):
        coll.add([{"_id": i, "text": ""} for i in ids[s:s + BATCH]], embeddings=x[s:s + BATCH])
    return coll, time.time() - t, folder / name


def index_bytes(coll_dir: Path, prefix: str) -> int:
    """The segments' index files of a kind (not its collection artifact: the projector)."""
    return sum(f.stat().st_size for f in (coll_dir / "segments").rglob(f"{prefix}*")
               if f.is_file())


def run(name: str, factory: str, passes: int) -> dict:
    ids, x, qids, q, qrels = levers.load(name)
    coll, seconds, coll_dir = build(name, factory, ids, x)
    out = {"docs": len(ids), "queries": len(qids), "build_s": round(seconds, 1)}
    pos = {d: i for i, d in enumerate(ids)}
    for profile in ("dense", "sparse"):
        hits = [coll.query(vector=v, k=100, profile=profile) for v in q]
        S = np.full((len(qids), len(ids)), -np.inf, np.float32)
        for qi, hs in enumerate(hits):
            for rank, h in enumerate(hs):
                S[qi, pos[h.id]] = -rank  # the engine's order
        out[f"ndcg_{profile}"] = levers.ndcg(S, ids, qids, qrels)
    out["ratio"] = out["ndcg_sparse"] / out["ndcg_dense"]
    n = len(ids)
    out["bytes_per_doc"] = {"sparse": index_bytes(coll_dir, "sparse.") / n,
                            "dense": index_bytes(coll_dir, "dense.") / n}

    def timed(profile):
        def once():
            t = time.perf_counter()
            for v in q:
                coll.query(vector=v, k=10, profile=profile)
            return (time.perf_counter() - t) * 1000 / len(q)
        return once
    coll.query(vector=q[0], k=10, profile="sparse")  # compile outside the timing
    times = common.interleaved({"dense": timed("dense"), "sparse": timed("sparse")}, passes)
    out["ms_per_query"] = {p: median(v) for p, v in times.items()}
    out["time_ratio"] = out["ms_per_query"]["sparse"] / out["ms_per_query"]["dense"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", default="cranfield,nfcorpus,arguana,cisi,medline,npl")
    ap.add_argument("--factory", default=FACTORY)
    ap.add_argument("--passes", type=int, default=3)
    a = ap.parse_args()
    res = {}
    for name in common.parse_list(a.collections):
        if common.collection_folder(name) is None:
            console.print(f"SKIP {name}: not in {common.DATA}")
            continue
        res[name] = run(name, a.factory, a.passes)
        r = res[name]
        console.print(f"{name}: dense {r['ndcg_dense']:.4f} sparse {r['ndcg_sparse']:.4f} "
                      f"({r['ratio']:.3f}x), {r['bytes_per_doc']['sparse']:.0f} vs "
                      f"{r['bytes_per_doc']['dense']:.0f} bytes/doc, "
                      f"{r['ms_per_query']['sparse']:.2f} vs {r['ms_per_query']['dense']:.2f} "
                      f"ms/query")
    console.print(table(f"pure sparse {a.factory} vs dense flat (engine, nDCG@10)",
                        ["collection", "dense", "sparse", "x dense", "bytes/doc sparse",
                         "bytes/doc dense", "ms/q sparse", "ms/q dense", "time x dense"],
                        [[n, f"{r['ndcg_dense']:.4f}", f"{r['ndcg_sparse']:.4f}",
                          f"{r['ratio']:.3f}", f"{r['bytes_per_doc']['sparse']:.0f}",
                          f"{r['bytes_per_doc']['dense']:.0f}",
                          f"{r['ms_per_query']['sparse']:.2f}",
                          f"{r['ms_per_query']['dense']:.2f}", f"{r['time_ratio']:.2f}"]
                         for n, r in res.items()]))
    common.save_results("bench_sparse_recon", {"factory": a.factory, "collections": res})


if __name__ == "__main__":
    main()
