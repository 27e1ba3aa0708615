"""Multivector at the cost of dense (issue 39 parts 1-2), on an indexed collection.

- **queries**: the collection's judged queries one at a time through ``Collection.query``
  (k=10, encoding included), profiles ``dense``, ``multivector``, ``hybrid-mv`` and ``hybrid``
  interleaved (ABBA passes, median): q/s of each by the process's CPU time (the machine is
  shared: wall time measures the neighbours), and the ratios multivector / dense (target
  >= 0.8) and hybrid-mv / hybrid in the same run; nDCG@10 of each profile (ir-measures, the
  same k=10 queries as timed: a single-stage profile's depths depend on k).
- **encode**: bulk encoding of ``--encode-docs`` corpus texts, the dense pass alone
  (``Encoder.encode``) against the one pass giving dense + tokens
  (``SentenceTokenEncoder.encode_documents``), interleaved (target <= 1.15x).

Usage: ``python bench/bench_mv_cost.py --data DATA --collection NAME --source BEIR_FOLDER
[--passes 3] [--queries 30] [--encode-docs 64 (0: none)] [--ndocs 1024,128]
[--torch-threads N] [--quality-queries N]``; the collection must have lexical, dense and
multivector (e.g. ``polyindex index BEIR --index lexical --index dense --index multivector
--dtype float32``).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import console, median, table, verdict  # noqa: E402

PROFILES = ("dense", "multivector", "hybrid-mv", "hybrid")


def with_ndocs(n: int) -> dict:
    """``multivector@N`` / ``hybrid-mv@N``: the built-in profiles with the search param
    ``ndocs=N`` (the final pass's size) on their multivector stage."""
    from polyindex.query.profiles import HYBRID_MV
    mv = {"index": "multivector", "k": 100, "params": f"ndocs={n}"}
    return {f"multivector@{n}": {"retrieve": [mv]},
            f"hybrid-mv@{n}": {**HYBRID_MV, "retrieve": HYBRID_MV["retrieve"][:2] + [mv]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--collection", required=True)
    ap.add_argument("--source", type=Path, required=True, help="the BEIR folder (queries, qrels)")
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--queries", type=int, default=30, help="queries per timed pass")
    ap.add_argument("--encode-docs", type=int, default=64)
    ap.add_argument("--quality-queries", type=int, default=0,
                    help="score nDCG@10 on the first N judged queries (0: all of them); "
                    "fewer leaves time for more timed passes on a shared machine")
    ap.add_argument("--ndocs", default="", help="also time and score multivector@N and "
                    "hybrid-mv@N for these comma-separated N (the search param ndocs)")
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch.set_num_threads(N) before timing (0: torch's default). With "
                    "its default threads on a busy machine the encoder's idle threads spin, "
                    "which CPU time counts: 1 shows the encoder's own cost")
    args = ap.parse_args(argv)
    profiles = {p: p for p in PROFILES}
    for n in common.parse_list(args.ndocs):
        profiles.update(with_ndocs(int(n)))
    import polyindex
    from polyindex.encode.tokens import token_encoder_for
    coll = polyindex.open(args.data, readonly=True).collection(args.collection)
    if args.torch_threads:
        import torch
        torch.set_num_threads(args.torch_threads)
    qrels = common.read_qrels(args.source)
    queries = common.judged(common.read_queries(args.source), qrels)
    timed = queries[:args.queries]
    for p in profiles.values():  # warm-up: model, numba, snapshot
        coll.query(timed[0][1], k=10, profile=p)

    def rate(profile):
        def run():
            t = time.process_time()
            for _, text in timed:
                coll.query(text, k=10, profile=profiles[profile])
            return len(timed) / (time.process_time() - t)
        return run
    qps = common.interleaved({p: rate(p) for p in profiles}, args.passes)
    qps = {p: median(v) for p, v in qps.items()}
    quality = {}
    scored = queries[:args.quality_queries] if args.quality_queries else queries
    judged = {qid: qrels[qid] for qid, _ in scored}  # the mean over the scored queries only
    for p in profiles:
        run = {qid: [(h.id, h.score) for h in coll.query(text, k=10, profile=profiles[p])]
               for qid, text in scored}
        path = common.WORK / "mv_cost" / f"{args.collection}.{p}.trec"
        common.write_trec(path, run, p)
        quality[p] = common.evaluate_trec(path, judged).get("nDCG@10")
    ratio = qps["multivector"] / qps["dense"]
    console.print(f"hybrid-mv q/s / hybrid q/s = {qps['hybrid-mv'] / qps['hybrid']:.2f}")
    console.print(table(f"{args.collection}: one query at a time ({len(timed)} queries x "
                        f"{args.passes} passes, interleaved, CPU time)",
                        ["profile", "q/s", "x dense", f"nDCG@10 ({len(scored)} q)"],
                        [(p, f"{qps[p]:.1f}", f"{qps[p] / qps['dense']:.2f}",
                          f"{quality[p]:.4f}") for p in profiles]))
    console.print(f"multivector q/s / dense q/s = {ratio:.2f} (target >= 0.8) "
                  f"{verdict(ratio >= 0.8)}")
    er, cost = {}, None
    if args.encode_docs:  # 0: queries only
        ids, titles, texts = common.read_corpus(args.source)
        docs = [common.doc_text(a, b) for a, b in zip(titles, texts)][:args.encode_docs]
        enc = coll.encoder
        te = token_encoder_for(enc)

        def enc_rate(fn):
            def run():
                t = time.process_time()
                fn(docs)
                return len(docs) / (time.process_time() - t)
            return run
        er = common.interleaved({"dense": enc_rate(enc.encode),
                                 "dense+tokens": enc_rate(te.encode_documents)}, args.passes)
        er = {k: median(v) for k, v in er.items()}
        cost = er["dense"] / er["dense+tokens"]
        console.print(f"encode {len(docs)} docs: dense {er['dense']:.1f} docs/s, dense+tokens "
                      f"{er['dense+tokens']:.1f} docs/s: {cost:.2f}x (target <= 1.15) "
                      f"{verdict(cost <= 1.15)}")
    common.save_results("bench_mv_cost", {"collection": args.collection, "qps": qps,
                                          "ndcg10": quality, "ndcg_queries": len(scored),
                                          "mv_over_dense": ratio,
                                          "hybrid_mv_over_hybrid":
                                              qps["hybrid-mv"] / qps["hybrid"],
                                          "encode_docs_per_s": er, "encode_cost": cost})
    return 0


if __name__ == "__main__":
    sys.exit(main())
