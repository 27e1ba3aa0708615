"""Where a multivector query's time goes, and the final pass's kernel (issue 39 part 2), on an
indexed collection.

- **stages**: the judged queries one at a time, tokens encoded first (``fill_queries``, one
  query a call: the encoder's cost), then ``MultivectorKind.prepare`` (the query's tables:
  centroid scores, PQ tables, probes) and ``search_snapshot``, split by stage (candidates, the
  pruned and full centroid passes, the final residual pass, the cuts and glue): CPU ms a
  query by ``time.process_time``, median over interleaved passes.
- **final pass**: the final-pass calls those queries made (their real candidates), replayed
  through ``kernels.final_pass_pq_batch`` (a query of at most ``REGISTER_COLUMNS`` tokens in
  registers, a longer one ``WIDE`` columns at a time) against the column loop every query
  used before (``_columns_doc`` here), on the calling thread as the engine runs them,
  interleaved: us per document, the speed-up, and the largest score difference (float
  rounding only).

Usage: ``python bench/bench_mv_final.py --data DATA --collection NAME --source BEIR_FOLDER
[--queries 30] [--passes 5]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numba
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import console, median, table  # noqa: E402

from polyindex.index.multivector import kernels as mk  # noqa: E402


@numba.njit(nogil=True, fastmath=True)
def _columns_doc(lut, pq, n, offsets, codes, res, scale, half, r, best, acc):
    """The loop over columns, its sums in memory: the final pass of every query before the
    register paths, and of queries over 8 tokens before the WIDE path."""
    s, e = offsets[r], offsets[r + 1]
    if e <= s or n == 0:
        return np.float32(0.0)
    for t in range(n):
        best[t] = -np.inf
    for p in range(s, e):
        row = lut[codes[p]]
        for t in range(n):
            acc[t] = row[t]
        for m in range(pq.shape[0]):
            tab = pq[m, res[p, m]]
            for t in range(n):
                acc[t] += tab[t]
        f = half[scale[p]] if len(scale) > 0 else np.float32(1.0)
        for t in range(n):
            best[t] = max(best[t], acc[t] * f)
    tot = np.float32(0.0)
    for t in range(n):
        tot += best[t]
    return tot


@numba.njit(nogil=True)
def _columns_batch(luts, pqs, nqt, qid, offsets, codes, res, scale, half, cand, out):
    best = np.empty(max(luts.shape[2], 1), np.float32)
    acc = np.empty(max(luts.shape[2], 1), np.float32)
    for i in range(len(cand)):
        q = qid[i]
        out[i] = _columns_doc(luts[q], pqs[q], nqt[q], offsets, codes, res, scale, half,
                              cand[i], best, acc)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--collection", required=True)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args(argv)
    import polyindex
    from polyindex.index.multivector.segment import MultivectorSegment, _HALF
    from polyindex.query.requests import make_queries
    coll = polyindex.open(args.data, readonly=True).collection(args.collection)
    qs = common.judged(common.read_queries(args.source), common.read_qrels(args.source))
    texts = [t for _, t in qs][:args.queries]
    snap = coll.view()
    kind = coll.kinds["multivector"]
    segs = [s.indexes["multivector"] for s in snap.segments]
    allow = [None] * len(segs)
    stage_t: dict[str, float] = {}
    calls: list = []  # (segment, tables, which, cands) of every final pass
    inner = MultivectorSegment._batch_pass

    def batch_pass(seg, tables, which, cands, stage):
        t = time.process_time()
        out = inner(seg, tables, which, cands, stage)
        stage_t[stage] = stage_t.get(stage, 0.0) + time.process_time() - t
        if stage == "final" and record[0]:
            calls.append((seg, tables, list(which), [c.copy() for c in cands]))
        return out
    MultivectorSegment._batch_pass = batch_pass
    inner_cand = MultivectorSegment._candidates

    def candidates(seg, q, prepared, allow):
        t = time.process_time()
        out = inner_cand(seg, q, prepared, allow)
        stage_t["candidates"] = stage_t.get("candidates", 0.0) + time.process_time() - t
        return out
    MultivectorSegment._candidates = candidates
    record = [True]

    def one_pass() -> dict[str, float]:
        stage_t.clear()
        tot = {"encode": 0.0, "prepare": 0.0, "search": 0.0}
        for text in texts:
            q = make_queries([text], None)
            t0 = time.process_time()
            coll.encoding.fill_queries(q, False, True)
            t1 = time.process_time()
            prep = kind.prepare(q, segs, snap.live, {}, {})
            t2 = time.process_time()
            kind.search_snapshot(prep, segs, snap.bases, 10, {}, allow)
            t3 = time.process_time()
            tot["encode"] += t1 - t0
            tot["prepare"] += t2 - t1
            tot["search"] += t3 - t2
        out = {k: v / len(texts) * 1e3 for k, v in tot.items()}
        out.update({k: v / len(texts) * 1e3 for k, v in stage_t.items()})
        out["cuts and glue"] = out["search"] - sum(stage_t.values()) / len(texts) * 1e3
        return out
    one_pass()  # warm-up (model, numba) and the final-pass calls recorded
    record[0] = False
    runs = [one_pass() for _ in range(args.passes)]
    stages = {k: median(r[k] for r in runs) for k in runs[0]}
    nqt = [len(c[1].queries[0].tokens) for c in calls]
    docs = sum(sum(len(x) for x in c[3]) for c in calls)
    tokens = sum(int((c[0].offsets[x + 1] - c[0].offsets[x]).sum()) for c in calls for x in c[3])

    def replay(fn):
        def run():
            t = time.process_time()
            for seg, tables, which, cands in calls:
                cand = np.concatenate(cands)
                qid = np.repeat(np.asarray(which, np.int64), [len(x) for x in cands])
                out = np.empty(len(cand), np.float32)
                with mk.threads_for(len(cand)):
                    fn(tables.luts, tables.pqs(), tables.nqt, qid, seg.offsets, seg.codes,
                       seg.res, seg.scale, _HALF, cand, out)
            return (time.process_time() - t) / docs * 1e6
        return run
    kern = {"engine (registers, WIDE chunks)": mk.final_pass_pq_batch,
            "column loop (before)": _columns_batch}
    for fn in kern.values():
        replay(fn)()
    us = common.interleaved({k: replay(f) for k, f in kern.items()}, args.passes)
    us = {k: median(v) for k, v in us.items()}
    diff = 0.0
    for seg, tables, which, cands in calls:
        cand = np.concatenate(cands)
        qid = np.repeat(np.asarray(which, np.int64), [len(x) for x in cands])
        a, b = np.empty(len(cand), np.float32), np.empty(len(cand), np.float32)
        for fn, o in ((mk.final_pass_pq_batch, a), (_columns_batch, b)):
            fn(tables.luts, tables.pqs(), tables.nqt, qid, seg.offsets, seg.codes, seg.res,
               seg.scale, _HALF, cand, o)
        diff = max(diff, float(np.abs(a - b).max()) if len(a) else 0.0)
    n = len(texts)
    console.print(f"{args.collection}: {n} queries one at a time x {args.passes} passes "
                  f"(median); query tokens mean {np.mean(nqt):.1f}, median "
                  f"{np.median(nqt):.0f}; final pass {docs / n:.0f} documents a query, "
                  f"{tokens / docs:.0f} tokens each")
    console.print(table("a multivector query's CPU ms", ["stage", "ms a query"],
                        [(k, f"{v:.2f}") for k, v in stages.items()]))
    base = us["column loop (before)"]
    console.print(table("the final pass replayed on its candidates, CPU us a document",
                        ["kernel", "us/doc", "speed-up"],
                        [(k, f"{v:.2f}", f"{base / v:.2f}x") for k, v in us.items()]))
    console.print(f"largest score difference: {diff:.2e}")
    common.save_results("bench_mv_final", {"collection": args.collection, "stages_ms": stages,
                                           "final_us_per_doc": us, "max_diff": diff,
                                           "query_tokens_mean": float(np.mean(nqt)),
                                           "final_docs_per_query": docs / n,
                                           "tokens_per_doc": tokens / docs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
