"""The text lane's kernel alone, per scoring mode, on the shared collections (one segment).

For each collection and k: CPU us a query (``time.process_time``, best of ``--rounds``
rounds, modes interleaved) of ``Plan.top`` (the kernel call over every segment, no ids, no
hits) with ``use_blockmax`` set to each of ``--modes``: 0 term-at-a-time with seen flags, 1
the default choice (block-max MaxScore where ``blockmax.pays``, dense where
``postings.dense_pays``), 2 block-max MaxScore always, 3 ``longquery``'s term-at-a-time
MaxScore always, 4 dense always. Every mode's top k (keys and float32 scores) is checked
against mode 0's: ``mismatch`` counts the queries that differ (must be 0). With ``--rule``,
per collection the queries ``dense_pays`` picks, and modes 0 and 4 on those only.

The collections are the lexical-only ones ``bench_peers.py`` builds under ``--work``
(``<work>/lexical``; built here if absent). Pinned to one core. Writes
``bench/results/bench_lexical_kernels.json``.

Usage: ``python bench/bench_lexical_kernels.py [--collections arguana,cisi] [--k 10,100]
[--modes 0,1,3] [--rounds 3] [--rule] [--work DIR]``
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
from bench_peers import COLLECTIONS, _polyindex_lexical, pin_one_core  # noqa: E402
from common import console  # noqa: E402


def _plan(engine, name):
    folder = common.collection_folder(name)
    if folder is None:
        return None, None
    coll = _polyindex_lexical(engine, name, folder)
    texts = [t for _, t in common.read_queries(folder)][:500]
    plan = coll._lane("lexical", "text", [texts[0]], None)[1]
    weighed = [w for w in (plan.weigh(t) for t in texts) if w is not None and len(w[2])]
    return plan, weighed


def _timed(plan, weighed, modes, k, rounds):
    best = {m: float("inf") for m in modes}
    ref = None
    mismatch = {}
    for mode in modes:  # the answers, checked against the first mode's
        plan.blockmax = mode
        outs = [plan.top(*w, k) for w in weighed]
        if ref is None:
            ref = outs
        else:
            mismatch[mode] = sum(not (np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]))
                                 for a, b in zip(ref, outs))
    for _ in range(rounds):
        for mode in modes:
            plan.blockmax = mode
            c = time.process_time()
            for w in weighed:
                plan.top(*w, k)
            best[mode] = min(best[mode], (time.process_time() - c) / len(weighed) * 1e6)
    plan.blockmax = 1
    return best, mismatch


def main() -> None:
    from polyindex.engine import Engine
    from polyindex.index.postings import dense_pays
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", default=",".join(COLLECTIONS))
    ap.add_argument("--k", default="10,100")
    ap.add_argument("--modes", default="0,1,3")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rule", action="store_true")
    ap.add_argument("--work", type=Path,
                    default=Path(f"/tmp/{os.environ.get('USER', 'polyindex')}-bench-peers"))
    args = ap.parse_args()
    pin_one_core()
    engine = Engine(args.work / "lexical")
    ks = [int(x) for x in common.parse_list(args.k)]
    modes = [int(x) for x in common.parse_list(args.modes)]
    out = {}
    for name in common.parse_list(args.collections):
        plan, weighed = _plan(engine, name)
        if plan is None:
            continue
        if args.rule:
            seg = plan.segs[0]

            def picks(w):
                t = w[1][:, 0].astype(np.int64)
                ok = t >= 0
                return dense_pays(seg[3], t[ok], w[2][ok], len(seg[6]))
            weighed = [w for w in weighed if picks(w)] if len(plan.segs) == 1 else []
            modes = [0, 4]
        row = {"queries": len(weighed)}
        for k in ks if weighed else []:
            best, mismatch = _timed(plan, weighed, modes, k, args.rounds)
            row[f"k{k}"] = {"us": {str(m): round(v, 1) for m, v in best.items()},
                            "mismatch": {str(m): v for m, v in mismatch.items()}}
        out[name] = row
        console.print(f"{name:10s} {row}")
    common.save_results("bench_lexical_kernels", {"modes": modes, "rule": args.rule,
                                                  "collections": out})


if __name__ == "__main__":
    main()
