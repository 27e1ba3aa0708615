"""What a write costs the next query's rerank features (issue 17 part 3, the rerank statistics).

For each ``--sizes`` N: a lexical collection of N generated documents (bench_living's Zipf
text, no vectors) in ``--segments`` equal segments is built once into
``bench/.work/rerank_stats/``. In one process, per round: a query's rerank features
(``rerank.features.compute_local``, one query text, ``--candidates`` random live rows) are
timed on a known snapshot (the reference, median of 20 calls), then one document is deleted
(a new snapshot whose live mask changed in one segment) and the first features of the new
snapshot are timed. Reported per N: both medians over ``--rounds`` and their ratio, and
the first-after-write time of the largest N over the smallest's (1.0x: it does not grow
with the collection's rows). Writes ``bench/results/bench_rerank_stats.json``.

Usage: ``python bench/bench_rerank_stats.py [--sizes 20000,200000] [--segments 10]
[--candidates 100] [--rounds 15]``.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench_living import Corpus  # noqa: E402
from common import WORK, console, save_results, table  # noqa: E402


def build(folder: Path, n: int, segments: int) -> None:
    import polyindex
    corpus = Corpus(n, 8, seed=3)
    with polyindex.open(folder) as eng:
        coll = eng.create_collection("c", ["lexical"], model=None, segment_size=n // segments)
        step = n // segments
        for s in range(0, n, step):
            docs = corpus.docs(list(range(s, min(n, s + step))), 0)
            coll.add([{"id": d["id"], "title": d["text"][:12], "text": d["text"]} for d in docs])


def measure(folder: Path, candidates: int, rounds: int) -> dict:
    import polyindex
    from polyindex.index.protocol import Query
    from polyindex.rerank import features
    rng = np.random.default_rng(5)
    queries = [Query(text="w1 w5 w300 w7 w2000")]
    steady, first = [], []
    with polyindex.open(folder) as eng:
        coll = eng.collection("c")
        n = coll.count()
        for r in range(rounds + 1):
            snap = coll.view()
            keys = np.flatnonzero(np.concatenate([m if m is not None else
                                                  np.ones(s.docs.n_rows, bool)
                                                  for s, m in zip(snap.segments, snap.live)]))
            keys = [np.sort(rng.choice(keys, candidates, replace=False)).astype(np.int64)]
            t = time.perf_counter()
            features.compute_local(snap, queries, keys)
            took_first = time.perf_counter() - t
            times = []
            for _ in range(20):
                t = time.perf_counter()
                features.compute_local(snap, queries, keys)
                times.append(time.perf_counter() - t)
            if r:  # round 0 warms the kernels up
                first.append(took_first * 1e3)
                steady.append(statistics.median(times) * 1e3)
            coll.delete([f"d{int(rng.integers(n))}"])
    return {"docs": n, "segments": len(snap.segments), "steady_ms": statistics.median(steady),
            "first_after_write_ms": statistics.median(first),
            "ratio": statistics.median(first) / statistics.median(steady)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="20000,200000")
    ap.add_argument("--segments", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    results = []
    for n in (int(x) for x in args.sizes.split(",")):
        folder = WORK / "rerank_stats" / f"n{n}-s{args.segments}"
        if not (folder / "c").exists():
            console.print(f"building {n:,} documents in {args.segments} segments ...")
            build(folder, n, args.segments)
        results.append(measure(folder, args.candidates, args.rounds))
    growth = results[-1]["first_after_write_ms"] / results[0]["first_after_write_ms"]
    console.print(table("rerank features: a known snapshot vs the first after a write",
                        ["docs", "segments", "known (ms)", "first after a write (ms)", "ratio"],
                        [(f"{r['docs']:,}", r["segments"], f"{r['steady_ms']:.2f}",
                          f"{r['first_after_write_ms']:.2f}", f"{r['ratio']:.1f}x")
                         for r in results]))
    console.print(f"first after a write, {results[-1]['docs']:,} docs / {results[0]['docs']:,}: "
                  f"{growth:.2f}x")
    save_results("bench_rerank_stats", {"args": vars(args), "results": results,
                                        "growth": growth})


if __name__ == "__main__":
    main()
