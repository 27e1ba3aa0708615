"""A collection that lives: writes through the online path, then merged, against the same
final corpus indexed fresh.

Workload (issue 17): ``--docs`` generated documents (text from a Zipf vocabulary and a
``--dim``-d vector each, a vectors-only collection with ``lexical`` + ``dense``: nothing to
encode) upserted through the online path (WAL, buffer, background seals and merges) in
batches of ``--batch``; then ``--update`` of them rewritten and ``--delete`` deleted, in the
same batches. The final corpus is bulk-indexed first (the reference); every
``--probe-every`` batches a few queries of each profile are timed on the living collection
and on the reference, interleaved, so the p99 during the workload is compared with the
reference's p99 at the same moments (the same load from anything else on the machine).
Then the background merging is let settle (``--settle`` s at
most; with ``--compact``, ``compact()`` after it), and p50 latency of ``lexical``, ``dense``
and ``hybrid``, bytes on disk and deleted rows are compared with the final live corpus
bulk-indexed fresh (``add()`` in ``segment_size`` chunks, as ``polyindex index`` makes
segments), measured interleaved in the same process.

Goals: p50 within 1.3x of fresh, bytes within 1.2x, deleted rows reclaimed, p99 during the
workload at most 3x the fresh collection's p99. Writes bench/results/bench_living.json.
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
from common import WORK, console, machine, save_results, synthetic_vectors, table  # noqa: E402

PROFILES = ("lexical", "dense", "hybrid")


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class Corpus:
    """Deterministic documents: id -> (text, vector) for a version of each id."""

    def __init__(self, n: int, dim: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.vocab = np.array([f"w{i}" for i in range(20_000)])
        p = 1.0 / np.arange(1, len(self.vocab) + 1) ** 1.07
        self.p = p / p.sum()
        self.centres = rng.standard_normal((200, dim)).astype(np.float32)
        self.n, self.dim, self.rng = n, dim, rng

    def docs(self, ids: list[int], version: int) -> list[dict]:
        words = self.rng.choice(len(self.vocab), size=(len(ids), 40), p=self.p)
        vecs = synthetic_vectors(self.centres, len(ids), 0.35, int(self.rng.integers(1 << 31)))
        return [{"id": f"d{i}", "text": " ".join(self.vocab[w]) + f" v{version}",
                 "vector": v} for i, w, v in zip(ids, words, vecs)]

    def queries(self, n: int, seed: int = 7) -> list[tuple[str, np.ndarray]]:
        rng = np.random.default_rng(seed)
        words = rng.choice(2000, size=(n, 3))  # frequent-ish words: real work per query
        vecs = synthetic_vectors(self.centres, n, 0.35, seed)
        return [(" ".join(self.vocab[w]), v) for w, v in zip(words, vecs)]


def time_queries(coll, queries, profile: str) -> list[float]:
    out = []
    for text, vec in queries:
        t0 = time.perf_counter()
        if profile == "lexical":
            coll.query(text, k=10, profile="lexical")
        elif profile == "dense":
            coll.query(vector=vec, k=10, profile="dense")
        else:
            coll.query(text, vector=vec, k=10, profile="hybrid")
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def warm(work: Path, corpus: "Corpus") -> None:
    """Compile numba kernels and load what a first query loads (with tombstones, a buffer and
    sealed segments), so the workload's p99 measures the engine, not one-off JIT."""
    import polyindex
    with polyindex.open(work / "warm", online=True) as eng:
        coll = eng.create_collection("w", ["lexical", "dense"], model=None)
        for b in range(3):
            coll.add(corpus.docs(list(range(b * 50, b * 50 + 50)), 0))
            coll.delete([f"d{b}"])
            coll.seal()
            for p in PROFILES:
                time_queries(coll, corpus.queries(3, seed=99), p)
        # block-max pruning compiles on the first query long enough to prune (16,384
        # postings, blockmax.MIN_POSTINGS): the commonest word over 17,000 documents
        coll.add(corpus.docs(list(range(1_000, 18_000)), 0))
        for p in ("lexical", "hybrid"):
            time_queries(coll, [(str(corpus.vocab[0]), corpus.queries(1, seed=98)[0][1])], p)
    shutil.rmtree(work / "warm", ignore_errors=True)


def pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--update", type=float, default=0.2)
    ap.add_argument("--delete", type=float, default=0.1)
    # 10, not 50: 50 batches of 100 are exactly one seal (5,000 docs), so every probe fell at
    # the same point of the seal cycle; 10 samples the whole cycle (5x the probes)
    ap.add_argument("--probe-every", type=int, default=10)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--settle", type=float, default=600.0)
    ap.add_argument("--compact", action="store_true", help="compact() after the settle")
    ap.add_argument("--work", type=Path, default=WORK / "living")
    ap.add_argument("--gc-freeze", action="store_true",
                    help="gc.freeze() after the warm-up: the start-up heap out of Python's full "
                         "collections (an A/B; the engine does not do it)")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval for this run (an A/B of the GIL hand-over)")
    args = ap.parse_args()
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    os.environ.setdefault("POLYINDEX_SEAL_DOCS", "5000")
    from polyindex.config import reload_settings
    reload_settings()  # settings are read once: again, with the line above
    import polyindex

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    warm(args.work, Corpus(args.docs, args.dim, seed=5))
    if args.gc_freeze:
        import gc
        gc.collect()
        gc.freeze()
    rng = np.random.default_rng(1)
    upd = rng.choice(args.docs, size=int(args.update * args.docs), replace=False)
    dele = rng.choice(args.docs, size=int(args.delete * args.docs), replace=False)
    final = sorted(set(range(args.docs)) - set(dele.tolist()))
    # The reference first, so that the p99 during the workload is compared with the fresh
    # collection's p99 at the same moments (same load from anything else on the machine).
    build_fresh(args, upd, final)
    reference = polyindex.open(args.work / "fresh", readonly=True).collection("c")
    corpus = Corpus(args.docs, args.dim)
    probes = corpus.queries(5, seed=11)
    for p in PROFILES:
        time_queries(reference, probes, p)
    during: dict[str, list[float]] = {p: [] for p in PROFILES}
    during_fresh: dict[str, list[float]] = {p: [] for p in PROFILES}
    moments: list[dict] = []  # every probe round: when, how big, how many segments, the times
    live_ids = set()
    n_batches = 0
    t_start = time.perf_counter()

    eng = polyindex.open(args.work / "living", online=True)
    coll = eng.create_collection("c", ["lexical", "dense"], model=None)

    def step(ids, version):
        nonlocal n_batches
        coll.add(corpus.docs(ids, version))
        n_batches += 1
        if n_batches % args.probe_every == 0:
            first = n_batches // args.probe_every % 2  # alternate which goes first
            snap = coll.view()
            moment = {"batch": n_batches, "rows": int(snap.bases[-1]),
                      "sealed_rows": int(coll.table.sealed_snapshot().bases[-1]),
                      "segments": len(snap.segments)}
            for p in PROFILES:
                for which in ((0, 1) if first else (1, 0)):
                    if which == 0:
                        moment[p] = time_queries(coll, probes, p)
                        during[p].extend(moment[p])
                    else:
                        moment[p + "_fresh"] = time_queries(reference, probes, p)
                        during_fresh[p].extend(moment[p + "_fresh"])
            moments.append(moment)
        if n_batches % 200 == 0:
            el = time.perf_counter() - t_start
            console.print(f"  {n_batches:,} batches, {len(live_ids):,} live, "
                          f"{n_batches * args.batch / el:,.0f} docs/s, segments "
                          f"{coll.info()['segments']}", highlight=False)

    console.print(f"writing {args.docs:,} docs in batches of {args.batch} ...")
    for s in range(0, args.docs, args.batch):
        ids = list(range(s, min(args.docs, s + args.batch)))
        step(ids, 0)
        live_ids.update(ids)
    for s in range(0, len(upd), args.batch):
        step(upd[s:s + args.batch].tolist(), 1)
    for s in range(0, len(dele), args.batch):
        coll.delete([f"d{i}" for i in dele[s:s + args.batch]])
        live_ids.difference_update(dele[s:s + args.batch].tolist())
    write_s = time.perf_counter() - t_start
    coll.seal()
    t0 = time.perf_counter()
    from polyindex.storage.merge_policy import TieredPolicy
    policy = TieredPolicy.from_settings()
    while time.perf_counter() - t0 < args.settle:
        if policy.plan(coll.table.sealed_snapshot().manifest.segments) is None:
            break
        time.sleep(1.0)
    settle_s = time.perf_counter() - t0
    info_settled = coll.info()
    eng.close()
    assert sorted(live_ids) == final
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine(),
              "write_seconds": write_s, "settle_seconds": settle_s,
              "docs_per_s": n_batches * args.batch / write_s,
              "settled": {k: info_settled.get(k) for k in ("segments", "deleted_rows", "merges",
                                                           "rows_merged", "rows_reclaimed",
                                                           "merge_failures")}}
    queries = corpus.queries(args.queries)
    result["during"] = {p: {"living_p99_ms": pct(during[p], 99),
                            "fresh_p99_same_moments_ms": pct(during_fresh[p], 99),
                            "ratio_p99": pct(during[p], 99) / pct(during_fresh[p], 99),
                            "living_p50_ms": pct(during[p], 50),
                            "fresh_p50_same_moments_ms": pct(during_fresh[p], 50)}
                        for p in PROFILES}
    result["moments"] = moments
    result["during_by_size"] = by_size(moments)
    console.print(table("p99 during the workload: living vs fresh, timed at the same moments",
                        ["profile", "living p99 ms", "fresh p99 ms", "ratio (<=3)",
                         "living p50 ms", "fresh p50 ms"],
                        [[p, f"{r['living_p99_ms']:.2f}", f"{r['fresh_p99_same_moments_ms']:.2f}",
                          f"{r['ratio_p99']:.2f}x", f"{r['living_p50_ms']:.2f}",
                          f"{r['fresh_p50_same_moments_ms']:.2f}"]
                         for p, r in result["during"].items()]))
    console.print(table("p99 during the workload by the collection's size at the probe",
                        ["stored rows", "rounds"] + [f"{p} ratio" for p in PROFILES],
                        [[f"{name} ({'<' if name == 'small' else '>='} dense auto HNSW)",
                          str(r["rounds"])] + [f"{r[p]['ratio_p99']:.2f}x" for p in PROFILES]
                         for name, r in result["during_by_size"].items()]))
    result["after_settle"] = compare(args, "after the background merges settled", final,
                                     queries, during)
    if args.compact:
        with polyindex.open(args.work / "living") as eng:
            result["compact"] = eng.collection("c").compact()
        result["after_compact"] = compare(args, "after compact()", final, queries, during)
    save_results("bench_living", result)


def by_size(moments: list[dict]) -> dict:
    """p99 during the workload split by the living collection's stored rows at the probe
    (under or past dense.AUTO_HNSW_ROWS: below it every segment is scanned exactly)."""
    from polyindex.index.dense.kind import AUTO_HNSW_ROWS
    out = {}
    for name, keep in (("small", lambda m: m["sealed_rows"] < AUTO_HNSW_ROWS),
                       ("past", lambda m: m["sealed_rows"] >= AUTO_HNSW_ROWS)):
        ms = [m for m in moments if keep(m)]
        out[name] = {"rounds": len(ms)}
        for p in PROFILES:
            liv = [x for m in ms for x in m[p]]
            fr = [x for m in ms for x in m[p + "_fresh"]]
            out[name][p] = {"living_p99_ms": pct(liv, 99), "fresh_p99_ms": pct(fr, 99),
                            "ratio_p99": pct(liv, 99) / pct(fr, 99) if fr else float("nan")}
    return out


def build_fresh(args, upd: np.ndarray, final: list[int]) -> None:
    """The final corpus bulk-indexed (``add()`` in ``segment_size`` chunks): the generator
    replayed in the workload's order gives the same texts and vectors."""
    import polyindex
    console.print(f"indexing the final {len(final):,} docs fresh ...")
    gen = Corpus(args.docs, args.dim)
    docs_by_id = {}
    for s in range(0, args.docs, args.batch):
        for d in gen.docs(list(range(s, min(args.docs, s + args.batch))), 0):
            docs_by_id[int(d["id"][1:])] = d
    for s in range(0, len(upd), args.batch):
        for d in gen.docs(upd[s:s + args.batch].tolist(), 1):
            docs_by_id[int(d["id"][1:])] = d
    final_docs = [docs_by_id[i] for i in final]
    with polyindex.open(args.work / "fresh") as eng:
        fresh = eng.create_collection("c", ["lexical", "dense"], model=None)
        size = fresh.config.segment_size
        for s in range(0, len(final_docs), size):
            fresh.add(final_docs[s:s + size])


def compare(args, state: str, final: list[int], queries, during) -> dict:
    """The living collection against the fresh one, read-only, interleaved (ABBA)."""
    import polyindex
    # Closed on the way out: a reader left open in this process pins the files it reads, and
    # the compact() that follows could not remove the segments it merged away.
    living_eng = polyindex.open(args.work / "living", readonly=True)
    fresh_eng = polyindex.open(args.work / "fresh", readonly=True)
    living, fresh = living_eng.collection("c"), fresh_eng.collection("c")
    assert living.count() == fresh.count() == len(final), (living.count(), fresh.count())
    for c in (living, fresh):  # warm: first queries open files and fill caches
        for p in PROFILES:
            time_queries(c, queries[:10], p)
    lat = {(w, p): [] for w in ("living", "fresh") for p in PROFILES}
    for rnd in range(4):
        order = [("living", living), ("fresh", fresh)]
        for w, c in (order if rnd % 2 == 0 else order[::-1]):
            for p in PROFILES:
                lat[(w, p)].extend(time_queries(c, queries, p))
    out = {"profiles": {}, "bytes_living": folder_bytes(args.work / "living" / "c"),
           "bytes_fresh": folder_bytes(args.work / "fresh" / "c"),
           "living_segments": len(living.view().segments),
           "fresh_segments": len(fresh.view().segments),
           "living_deleted_rows": living.info()["deleted_rows"]}
    out["bytes_ratio"] = out["bytes_living"] / out["bytes_fresh"]
    living_eng.close()
    fresh_eng.close()
    rows = []
    for p in PROFILES:
        lp50, fp50 = statistics.median(lat[("living", p)]), statistics.median(lat[("fresh", p)])
        fp99, dp99 = pct(lat[("fresh", p)], 99), pct(during[p], 99)
        out["profiles"][p] = {"living_p50_ms": lp50, "fresh_p50_ms": fp50,
                              "ratio_p50": lp50 / fp50, "during_p99_ms": dp99,
                              "fresh_p99_ms": fp99, "ratio_p99_during": dp99 / fp99}
        rows.append([p, f"{lp50:.2f}", f"{fp50:.2f}", f"{lp50 / fp50:.2f}x", f"{dp99:.2f}",
                     f"{fp99:.2f}", f"{dp99 / fp99:.2f}x"])
    console.print(table(
        f"living {state} vs fresh ({len(final):,} docs; living {out['living_segments']} "
        f"segments, {out['living_deleted_rows']:,} deleted rows left; fresh "
        f"{out['fresh_segments']})",
        ["profile", "living p50 ms", "fresh p50 ms", "ratio (<=1.3)", "during p99 ms",
         "fresh p99 ms", "ratio (<=3)"], rows))
    console.print(f"bytes on disk: living {out['bytes_living'] / 1e6:,.1f} MB, fresh "
                  f"{out['bytes_fresh'] / 1e6:,.1f} MB, ratio {out['bytes_ratio']:.2f} (<=1.2)",
                  highlight=False)
    return out


if __name__ == "__main__":
    main()
