"""Where one query's time goes: a lexical, a dense and a hybrid query, stage by stage.

Each stage is the engine's own code called in the order a query calls it, timed with
``perf_counter_ns`` over every query of the collection, best of ``--rounds`` rounds (the
machine is shared: the best round is the least disturbed), in microseconds per query:

- lexical, the text lane (``index/lexical/lane``, what ``coll.query(text,
  profile="lexical")`` runs): analyze; document frequencies (the snapshot's df cache),
  weights and the terms encoded; the kernel (every segment: term lookup, scoring, top-k
  merge); ids (gathered in one kernel, ties in id order there); ``Hit`` objects;
- lexical, dense and hybrid through the general pipeline (``query/pipeline``): the
  ``Query``; query encoding (dense, hybrid: the model); per stage the kind's ``prepare``,
  the per-segment searches (one Python iteration each), the merge of the segments' lists
  and ties; fusion; hits (ids, ``Hit`` objects);
- the end-to-end ``coll.query`` of each, for comparison with the sum.

A collection with several segments shows the per-segment cost (``--segments N`` builds a
copy of the lexical collection in N segments under ``--work``).

Usage: ``python bench/bench_breakdown.py [--collection nfcorpus] [--k 10,100] [--rounds 5]
[--segments 1,100] [--dense-work DIR] [--work DIR]``
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
from common import console, table  # noqa: E402


class Clock:
    """Accumulated nanoseconds per stage; ``best`` keeps each stage's best round."""

    def __init__(self):
        self.round: dict[str, int] = {}
        self.best: dict[str, float] = {}

    def add(self, stage: str, t0: int) -> int:
        t = time.perf_counter_ns()
        self.round[stage] = self.round.get(stage, 0) + t - t0
        return t

    def end_round(self, n: int) -> None:
        for stage, ns in self.round.items():
            us = ns / n / 1e3
            self.best[stage] = min(self.best.get(stage, us), us)
        self.round = {}


def lexical_lane(coll, texts, k: int, rounds: int) -> dict[str, float]:
    from polyindex.types import Hit
    snap = coll.view()
    plan = coll._lane("lexical", "text", [texts[0]], None)[1]
    if plan is None:
        raise SystemExit("no text lane plan for this collection")
    clock = Clock()
    for _ in range(rounds):
        for text in texts:
            t = time.perf_counter_ns()
            counts: dict[str, int] = {}
            for term in plan.kind.analyzer.analyze(text):
                counts[term] = counts.get(term, 0) + 1
            t = clock.add("analyze", t)
            scorer = plan.kind.scorer
            weighed = plan._weights(scorer, counts)
            t = clock.add("df, weights, terms encoded", t)
            scores, keys = plan.top(scorer, *weighed, k)
            t = clock.add("kernel (all segments, top-k merged)", t)
            ids = plan.ids(snap, scores, keys)
            t = clock.add("ids (ties in id order)", t)
            list(map(Hit, ids, scores.tolist(), range(1, len(ids) + 1)))
            clock.add("hits", t)
        clock.end_round(len(texts))
    return clock.best


def general(coll, texts, k: int, rounds: int, profile: str, vectors=None) -> dict[str, float]:
    """The general pipeline's stages (``pipeline.run`` unrolled, one query at a time)."""
    from polyindex.index.protocol import empty_result
    from polyindex.index.ties import order_ties
    from polyindex.query import pipeline
    from polyindex.query.requests import make_queries
    snap = coll.view()
    prof = coll._profile(profile)
    single = len(prof.retrieve) == 1 and prof.rerank is None
    clock = Clock()
    for _ in range(rounds):
        for qi, text in enumerate(texts):
            t = time.perf_counter_ns()
            queries = make_queries([text], None)
            t = clock.add("Query", t)
            if vectors is not None and any(snap.kinds[st.index].needs_embeddings
                                           for st in prof.retrieve):
                queries[0].vector = vectors[qi]  # encoded beforehand: timed apart
            allow = pipeline.allow_masks(snap, None)
            t = clock.add("allow masks", t)
            results = []
            for st in prof.retrieve:
                kind = snap.kinds[st.index]
                segs = [s.indexes[st.index] for s in snap.segments]
                prepared = kind.prepare(queries, segs, snap.live, st.params,
                                        snap.cache[st.index])
                t = clock.add(f"{st.index}: prepare", t)
                kk = k if single else st.k
                outs = [seg.search(prepared, kk, st.params, mask) if seg.n_rows else
                        empty_result(1, kk) for seg, mask in zip(segs, allow)]
                t = clock.add(f"{st.index}: per-segment search ({len(segs)})", t)
                s = np.concatenate([o[0] for o in outs], axis=1)
                keys = np.concatenate([np.where(o[1] >= 0, o[1] + b, -1)
                                       for o, b in zip(outs, snap.bases)], axis=1)
                s = np.where(keys >= 0, s, -np.inf)
                top = np.argsort(-s, axis=1, kind="stable")[:, :kk]
                s, keys = np.take_along_axis(s, top, 1), np.take_along_axis(keys, top, 1)
                t = clock.add(f"{st.index}: merge", t)
                keys = order_ties(s, keys, snap.ids_of, snap.id_array)
                t = clock.add(f"{st.index}: ties", t)
                results.append((s, keys))
            lists = [(s[0], kk[0]) for s, kk in results]
            keys, scores = pipeline.fuse(prof, lists, k)
            t = clock.add("fusion", t)
            pipeline._hits(snap, keys[:k], scores[:k], prof, None, (False, False))
            clock.add("hits (ids, Hit objects)", t)
        clock.end_round(len(texts))
    return clock.best


def end_to_end(fn, n: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, (time.perf_counter_ns() - t0) / n / 1e3)
    return best


def segment_ratio(colls: dict, texts, k: int, rounds: int) -> dict:
    """p50 latency (us) of ``coll.query(text, profile="lexical")`` per collection, rounds
    interleaved (each collection's best round), and each one's ratio to the first."""
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, coll in colls.items():
            lat = []
            for t in texts:
                t0 = time.perf_counter_ns()
                coll.query(t, k=k, profile="lexical")
                lat.append(time.perf_counter_ns() - t0)
            p50 = float(np.median(lat)) / 1e3
            best[name] = min(best.get(name, p50), p50)
    first = next(iter(best.values()))
    return {name: {"p50_us": v, "ratio": v / first} for name, v in best.items()}


def segmented_copy(engine, name: str, folder: Path, n_segments: int):
    """The lexical collection ``name`` in ``n_segments`` segments (never compacted)."""
    cname = f"{name}_x{n_segments}"
    try:
        return engine.collection(cname)
    except Exception:  # noqa: BLE001 - not built yet
        pass
    ids, titles, texts = common.read_corpus(folder)
    coll = engine.create_collection(cname, ["lexical"], model=None)
    step = -(-len(ids) // n_segments)
    for a in range(0, len(ids), step):
        coll.add([{"id": i, "title": ti, "text": te}
                  for i, ti, te in zip(ids[a:a + step], titles[a:a + step], texts[a:a + step])])
    return coll


def show(title: str, stages: dict[str, float], e2e: float) -> None:
    total = sum(stages.values())
    rows = [(s, f"{us:.1f}", f"{100 * us / total:.0f}%") for s, us in stages.items()]
    rows.append(("sum of stages", f"{total:.1f}", ""))
    rows.append(("coll.query end to end", f"{e2e:.1f}", ""))
    console.print(table(title, ["stage", "us/query", "share"], rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collection", default="nfcorpus")
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-queries", type=int, default=300)
    ap.add_argument("--segments", default="1")
    ap.add_argument("--work", type=Path,
                    default=Path(f"/tmp/{os.environ.get('USER', 'polyindex')}-bench-peers"))
    ap.add_argument("--no-pin", action="store_true")
    args = ap.parse_args()
    if not args.no_pin:
        from bench_peers import pin_one_core
        pin_one_core()
    from bench_peers import _polyindex_lexical
    from polyindex.engine import Engine
    folder = common.collection_folder(args.collection)
    if folder is None:
        return
    texts = [t for _, t in common.read_queries(folder)][:args.max_queries]
    payload: dict = {"collection": args.collection, "rounds": args.rounds, "results": {}}
    engine = Engine(args.work / "lexical")
    colls = {}
    for n_seg in [int(x) for x in common.parse_list(args.segments)]:
        coll = _polyindex_lexical(engine, args.collection, folder) if n_seg == 1 else \
            segmented_copy(engine, args.collection, folder, n_seg)
        segs = len(coll.view().segments)
        colls[f"{segs} segment(s)"] = coll
        for k in [int(x) for x in common.parse_list(args.k)]:
            for t in texts:  # warm-up (JIT, df cache)
                coll.query(t, k=k, profile="lexical")
            lane_st = lexical_lane(coll, texts, k, args.rounds)
            e2e = end_to_end(lambda: [coll.query(t, k=k, profile="lexical") for t in texts],
                             len(texts), args.rounds)
            show(f"lexical, text lane, {args.collection}, {segs} segment(s), k={k}", lane_st, e2e)
            gen = general(coll, texts, k, args.rounds, "lexical")
            show(f"lexical, general pipeline, {segs} segment(s), k={k}", gen, e2e)
            payload["results"][f"lexical-lane@{segs}seg@{k}"] = {"stages": lane_st, "e2e": e2e}
            payload["results"][f"lexical-general@{segs}seg@{k}"] = {"stages": gen}
    if len(colls) > 1:
        for k in [int(x) for x in common.parse_list(args.k)]:
            got = segment_ratio(colls, texts, k, args.rounds)
            payload["results"][f"segments@{k}"] = got
            console.print(table(f"lexical p50 by segmentation, {args.collection}, k={k} "
                                f"(interleaved, best round)", ["collection", "p50 us", "ratio"],
                                [(n, f"{v['p50_us']:.1f}", f"{v['ratio']:.2f}x")
                                 for n, v in got.items()]))
    dense_root = args.work / "dense"
    if (dense_root / args.collection / "manifest.json").exists():
        from bench_peers import _model
        eng_d = Engine(dense_root, readonly=True)
        coll = eng_d.collection(args.collection)
        model = _model()
        t0 = time.perf_counter()
        vecs = common.st_encode(model, texts[:50])
        enc_us = (time.perf_counter() - t0) / 50 * 1e6
        vecs = np.asarray(common.st_encode(model, texts), np.float32)
        for k in [int(x) for x in common.parse_list(args.k)]:
            for profile in ("dense", "hybrid"):
                st = general(coll, texts, k, args.rounds, profile, vectors=vecs)
                st["query encoding (model, batch of 1)"] = coll_encode_us(coll, texts[:20])
                e2e = end_to_end(lambda: [coll.query(t, k=k, profile=profile)
                                          for t in texts[:50]], 50, 2)
                show(f"{profile}, general pipeline, {args.collection}, k={k}", st, e2e)
                payload["results"][f"{profile}@{k}"] = {"stages": st, "e2e": e2e,
                                                        "raw_encode_batch50_us": enc_us}
    else:
        console.print(f"[yellow]no dense collection at {dense_root / args.collection}: dense "
                      f"and hybrid left out (bench_peers.py --parts dense builds it)[/yellow]")
    common.save_results("bench_breakdown", payload)


def coll_encode_us(coll, texts) -> float:
    t0 = time.perf_counter()
    for t in texts:
        coll.encoder.encode([t], chunk=1)
    return (time.perf_counter() - t0) / len(texts) * 1e6


if __name__ == "__main__":
    main()
