"""An embedded collection written in many ``add()`` calls, queried before its merge, after
its background merge (no ``compact()``), and beside the same documents as one segment.

Workload (issue 38): ``--adds`` calls of ``coll.add()`` with ``--batch`` generated documents
each (bench_living's corpus: Zipf text and a ``--dim``-d vector, ``lexical`` + ``dense``, no
model) into three embedded collections, each in its own data directory, in one process:

- (a) ``many``: written with the embedded merger off (``POLYINDEX_MERGE_EMBEDDED=0`` when it
  was opened): the ``--adds`` segments, as before any merge;
- (b) ``merged``: written with the merger on (the default); measured once its segment count
  has been still for ``--still`` s, at most ``--settle`` s after its last add, no
  ``compact()``;
- (c) ``one``: the same documents in one ``add()``: one segment;
- (d) ``flat``: dense only, the same vectors as one exact ``Flat`` segment: what (a)'s
  exact scans of small segments cost without a per-segment cost (from 10,000 rows on, (c)'s
  one segment is an HNSW graph, which no set of exact scans matches).

Then p50 latency of ``lexical`` (text, k=10) and ``dense`` (vector, k=10, the vector lane)
queries over (a), (b), (c), interleaved in ``--rounds`` rounds, so that the load from
anything else on the machine falls on all of them alike. Goals: (b) <= 1.3x (c) for both,
(a) <= 5x (c). Writes bench/results/bench_embedded_merge.json (one entry per ``--adds``;
``_bN`` added for a ``--batch`` other than 100).

    .venv/bin/python bench/bench_embedded_merge.py --adds 100 200 --batch 100
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
from bench_living import Corpus  # noqa: E402
from common import WORK, console, machine, save_results, table, verdict  # noqa: E402


def open_writer(path: Path, merging: bool):
    """An embedded engine whose writer merges in the background or not (the setting is read
    when a collection is opened)."""
    from polyindex.config import reload_settings
    import polyindex
    os.environ["POLYINDEX_MERGE_EMBEDDED"] = "1" if merging else "0"
    reload_settings()
    return polyindex.open(path)


def write(eng, batches: list[list[dict]]):
    coll = eng.create_collection("c", ["lexical", "dense"], model=None)
    for docs in batches:
        coll.add(docs)
    return coll


def settle(coll, still: float, limit: float) -> tuple[float, int]:
    """Wait until the segment count has not changed for ``still`` s (or ``limit`` s passed):
    (seconds waited, segments)."""
    t0 = time.monotonic()
    last, since = coll.info()["segments"], time.monotonic()
    while time.monotonic() - t0 < limit:
        time.sleep(0.1)
        n = coll.info()["segments"]
        if n != last:
            last, since = n, time.monotonic()
        elif time.monotonic() - since >= still and not coll.live.merger.busy():
            break
    return round(time.monotonic() - t0, 2), last


def one_query(coll, profile: str, text: str, vec: np.ndarray) -> float:
    t0 = time.perf_counter()
    if profile == "lexical":
        coll.query(text, k=10, profile="lexical")
    else:
        coll.query(vector=vec, k=10, profile="dense")
    return (time.perf_counter() - t0) * 1e6


def scenario(args, adds: int) -> dict:
    work = args.work / f"adds{adds}"
    shutil.rmtree(work, ignore_errors=True)
    corpus = Corpus(adds * args.batch, args.dim, seed=3)
    batches = [corpus.docs(list(range(b * args.batch, (b + 1) * args.batch)), 0)
               for b in range(adds)]
    colls = {}
    t0 = time.perf_counter()
    colls["many"] = write(open_writer(work / "many", False), batches)
    t_many = time.perf_counter() - t0
    t0 = time.perf_counter()
    colls["merged"] = write(open_writer(work / "merged", True), batches)
    t_merged = time.perf_counter() - t0
    waited, segs = settle(colls["merged"], args.still, args.settle)
    colls["one"] = write(open_writer(work / "one", False), [[d for b in batches for d in b]])
    info = {n: c.info() for n, c in colls.items()}
    # (d) dense only: the same rows as one exact (Flat) segment, the reference of (a)'s
    # per-segment cost (past 10,000 rows (c)'s segment is an HNSW graph, (a)'s are scans)
    flat = open_writer(work / "flat", False).create_collection("c", ["dense:Flat"], model=None)
    flat.add([d for b in batches for d in b])
    queries = corpus.queries(args.queries, seed=11)
    for c in colls.values():  # first queries load and compile
        for text, vec in queries[:20]:
            one_query(c, "lexical", text, vec)
            one_query(c, "dense", text, vec)
    for _, vec in queries[:20]:
        one_query(flat, "dense", "", vec)
    for c in colls.values():  # and once more, after the others' warm-up
        for text, vec in queries[:5]:
            one_query(c, "lexical", text, vec)
            one_query(c, "dense", text, vec)
    times = {(n, p): [] for n in colls for p in ("lexical", "dense")}
    times[("flat", "dense")] = []
    order = [*colls.items(), ("flat", flat)]
    for r in range(args.rounds):
        # rounds of one block per collection and profile, the order rotating: a query of
        # (a) (100 segments) evicts caches that the next collection's query would pay for
        for n, c in order[r % 4:] + order[:r % 4]:
            for p in ("lexical", "dense") if n != "flat" else ("dense",):
                times[(n, p)].extend(one_query(c, p, text, vec) for text, vec in queries)
    p50 = {f"{n}/{p}": round(statistics.median(v), 1) for (n, p), v in times.items()}
    # lexical: the same hits and scores however segmented; dense: past 10,000 rows a segment
    # is an HNSW graph (approximate), so (b) and (c) are compared with (a)'s exact scans
    lex = {n: [[(h.id, h.score) for h in c.query(t, k=10, profile="lexical")]
               for t, _ in queries] for n, c in colls.items()}
    dense = {n: [{h.id for h in c.query(vector=v, k=10, profile="dense")} for _, v in queries]
             for n, c in colls.items()}
    recall = {n: round(float(np.mean([len(a & b) / max(1, len(a)) for a, b in
                                      zip(dense["many"], dense[n])])), 4)
              for n in ("merged", "one")}
    for c in [*colls.values(), flat]:
        c.close()
    return {"adds": adds, "batch": args.batch, "docs": adds * args.batch,
            "segments": {n: i["segments"] for n, i in info.items()},
            "merges": info["merged"].get("merges", 0),
            "write_s": {"many": round(t_many, 2), "merged": round(t_merged, 2)},
            "settled_after_s": waited, "settled_segments": segs, "p50_us": p50,
            "ratios": {**{f"{n}/{p}": round(p50[f"{n}/{p}"] / p50[f"one/{p}"], 2)
                          for n in ("many", "merged") for p in ("lexical", "dense")},
                       "many/dense vs one Flat": round(p50["many/dense"] / p50["flat/dense"],
                                                       2)},
            "lexical_same_hits": lex["many"] == lex["merged"] == lex["one"],
            "dense_recall_at_10_vs_exact": recall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adds", type=int, nargs="+", default=[100, 200])
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--still", type=float, default=3.0)
    ap.add_argument("--settle", type=float, default=60.0)
    ap.add_argument("--work", type=Path, default=WORK / "embedded_merge")
    args = ap.parse_args()
    results = []
    for adds in args.adds:
        r = scenario(args, adds)
        results.append(r)
        rows = []
        for p in ("lexical", "dense"):
            rows.append([p, r["p50_us"][f"many/{p}"], r["p50_us"][f"merged/{p}"],
                         r["p50_us"][f"one/{p}"], f'{r["ratios"][f"many/{p}"]}x',
                         verdict(r["ratios"][f"many/{p}"] <= 5),
                         f'{r["ratios"][f"merged/{p}"]}x',
                         verdict(r["ratios"][f"merged/{p}"] <= 1.3)])
        rows.append(["dense, (d) one Flat segment", r["p50_us"]["many/dense"], "-",
                     r["p50_us"]["flat/dense"], f'{r["ratios"]["many/dense vs one Flat"]}x',
                     "-", "-", "-"])
        console.print(table(
            f"{adds} adds of {args.batch}: segments (a) {r['segments']['many']}, (b) "
            f"{r['segments']['merged']} after {r['settled_after_s']} s ({r['merges']} merges), "
            f"(c) {r['segments']['one']}; lexical hits the same: {r['lexical_same_hits']}, "
            f"dense recall@10 vs (a)'s exact: {r['dense_recall_at_10_vs_exact']}",
            ["profile", "(a) p50 us", "(b) p50 us", "(c) p50 us", "(a)/(c)", "<= 5x",
             "(b)/(c)", "<= 1.3x"], rows))
    save_results("bench_embedded_merge" + ("" if args.batch == 100 else f"_b{args.batch}"), {"args": {k: str(v) for k, v in vars(args).items()},
                                          "machine_now": machine(), "results": results})


if __name__ == "__main__":
    main()
