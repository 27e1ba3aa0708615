"""The default profile's floor: fusion shapes and selection rules that value the worst collection,
held out by leave-one-collection-out (issue 39 part 3, "on none below 0.995x hybrid").

``bench_loco.py`` picks, on the other nine collections, the candidate with the best mean
nDCG@10; its choice beats hybrid by 1.025x on the mean but falls to 0.983x (medline) and
0.989x (cranfield). This script asks whether another family of candidates or another rule for
choosing among them keeps the mean (>= 1.02x hybrid) and lifts the worst held-out collection
to >= 0.995x. Everything fitted is fitted on the other nine; a fold's numbers are the held-out
collection's.

Families (lexical top 1000 each; the two legs' runs are bench_loco's engine runs):

- ``cvx-a{A}-d{D}``: the convex fusion (``rerank.fusion.weighted``, min-max normalized),
  dense weight A, dense top D;
- ``z-a{A}-d{D}``: the same over z-scores shifted to 0 at each list's last score (absent = 0);
- ``rrf-k{K}-w{W}``: RRF (``rerank.fusion.rrf``), dense top 100 weighted W;
- ``rrf2-kl{KL}-kd{KD}-w{W}``: RRF with its own k per leg (lexical KL, dense KD);
- ``rank-a{A}-d{D}``: convex over ranks (a leg's score 1 - (rank - 1) / its depth);
- ``q{F}-a{A}-b{B}-d{D}`` (query-adaptive): the convex fusion with each query's dense weight
  ``clip(A + B * (f - c), 0.05, 0.95)``, f a feature of that query's own two lists or text:
  ``ov10`` overlap of the two top 10s, ``lpk``/``dpk`` the mean min-max normalized score of a
  leg's top 10 (how peaked it is), ``len`` words / 10; c a fixed centre;
- ``c{F}-a{A}-b{B}-d{D}`` (corpus-adaptive): one dense weight per collection,
  ``A + B * (F - median F)`` snapped to the ``cvx`` grid, from an unlabeled statistic F:
  ``ndocs``/``avgdl``/``vocab`` (log10 of the corpus's documents, mean words, distinct
  words), ``synth`` (mean top-10 overlap of lexical and dense on 100 synthetic queries, each
  the first 8 words of a sampled document), and ``tqov`` (mean top-10 overlap on the
  collection's own test queries: unlabeled but *transductive*: the engine cannot know a
  collection's queries before they come, so it is reported, never shipped).

Rules (a fold's choice over its nine): ``mean`` (bench_loco's), ``min`` (the worst ratio to
hybrid), ``q20`` (the 20% quantile of the ratios), ``mean+2min`` (mean ratio + 2 x worst) and
``floor`` (the best mean among candidates whose nine ratios are all >= 0.995; none: ``min``).

nDCG@10 per query by ir-measures over the runs, scores rounded to 6 decimals as a TREC file
holds them (``hybrid`` itself: the engine's TREC run). Per fold of the best trade-off: the
choice, nDCG@10, hybrid's, ratio, paired t-test p. Results: bench/results/bench_loco_floor.json.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loco as BL  # noqa: E402
import common  # noqa: E402
from common import console, table  # noqa: E402

A_GRID = (0.4, 0.45, 0.5, 0.55, 0.6)
D_GRID = (100, 300, 1000)
RRF_K = (20, 60)
RRF_W = (0.67, 0.8, 1.0, 1.1, 1.25)
RRF2_K = (10, 30, 60, 100)
Q_FEATS = {"ov10": 0.35, "lpk": 0.72, "dpk": 0.7, "len": 1.8}  # fixed centres (not fitted)
Q_A = (0.45, 0.5, 0.55)
Q_B = (-0.3, -0.15, 0.15, 0.3)
Q_D = (300, 1000)
C_B = {"ndocs": (-0.2, -0.1, 0.1, 0.2), "avgdl": (-0.2, -0.1, 0.1, 0.2),
       "vocab": (-0.2, -0.1, 0.1, 0.2), "synth": (-0.4, -0.2, 0.2, 0.4),
       "tqov": (-0.4, -0.2, 0.2, 0.4)}
TRANSDUCTIVE = {"ctqov"}
FLOOR = 0.995
TOP = BL.TOP


def minmax(s: np.ndarray) -> np.ndarray:
    if not len(s):
        return s
    lo, hi = s.min(), s.max()
    return (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)


def zshift(s: np.ndarray) -> np.ndarray:
    """z-score shifted so the list's last score is 0 (an absent document scores 0)."""
    if not len(s):
        return s
    sd = s.std()
    return (s - s.min()) / sd if sd > 0 else np.ones_like(s)


def query_features(lk, ls, dk, ds, text: str) -> dict[str, float]:
    nl, nd = minmax(ls), minmax(ds[:100])
    return {"ov10": len(set(lk[:10].tolist()) & set(dk[:10].tolist())) / 10,
            "lpk": float(nl[:10].mean()) if len(nl) else 0.0,
            "dpk": float(nd[:10].mean()) if len(nd) else 0.0,
            "len": min(len(text.split()), 30) / 10}


def adaptive_weight(a: float, b: float, f: float, centre: float) -> float:
    return float(np.clip(a + b * (f - centre), 0.05, 0.95))


def snap(a: float) -> float:
    return min(A_GRID, key=lambda g: (abs(g - a), g))


def criterion(name: str, ratios: list[float], values: list[float]) -> float:
    """A candidate's score over a fold's training collections (higher is better)."""
    if name == "mean":
        return float(np.mean(values))
    if name == "min":
        return min(ratios)
    if name == "q20":
        return float(np.quantile(ratios, 0.2))
    if name == "mean+2min":
        return float(np.mean(ratios)) + 2 * min(ratios)
    if name == "floor":  # the mean among those above the floor everywhere, then the rest by min
        return (1.0 + float(np.mean(values))) if min(ratios) >= FLOOR else min(ratios) - 1.0
    raise ValueError(name)


RULES = ("mean", "min", "q20", "mean+2min", "floor")


def fold_choice(rule: str, pool: list[str], score, hybrid, inner: list[str]) -> str:
    best, best_v = None, -math.inf
    for c in pool:
        vals = [score(c, n) for n in inner]
        v = round(criterion(rule, [x / hybrid[n] for x, n in zip(vals, inner)], vals), 9)
        if v > best_v:
            best, best_v = c, v
    return best


# ------------------------------------------------------------------------------ runs

def collection_runs(name: str, stats: dict) -> dict[str, dict[str, float]]:
    """Per-query nDCG@10 of every per-query candidate (cvx, z, rrf, query-adaptive) on one
    collection, plus ``hybrid`` (the engine's run)."""
    from polyindex.rerank.fusion import _sum_by_key, rrf, weighted
    folder = BL.RUNS / name
    lex, dense = BL.read_run(folder / "lexical.trec"), BL.read_run(folder / "dense.trec")
    qs, qrels = BL.judged_queries(name)
    text = dict(qs)
    cands: dict[str, dict] = {}
    prepared = []
    for q in qrels:
        ids: dict[str, int] = {}
        legs = []
        for run in (lex.get(q, []), dense.get(q, [])):
            keys = np.array([ids.setdefault(d, len(ids)) for d, _ in run], np.int64)
            legs.append((keys, np.array([s for _, s in run], np.float64)))
        (lk, ls), (dk, ds) = legs
        prepared.append((q, np.array(list(ids), dtype=object), lk, ls, dk, ds,
                         query_features(lk, ls, dk, ds, text.get(q, ""))))
    stats["tqov"] = float(np.mean([p[6]["ov10"] for p in prepared]))

    def add(cand, q, back, keys, scores):
        cands.setdefault(cand, {})[q] = dict(zip(back[keys[:TOP]].tolist(),
                                                 np.round(scores[:TOP], 6).tolist()))

    for q, back, lk, ls, dk, ds, f in prepared:
        for d in D_GRID:
            for a in A_GRID:
                add(f"cvx-a{a}-d{d}", q, back, *weighted([lk, dk[:d]], [ls, ds[:d]], [1 - a, a]))
                add(f"z-a{a}-d{d}", q, back,
                    *_sum_by_key([lk, dk[:d]], [(1 - a) * zshift(ls), a * zshift(ds[:d])]))
        for k in RRF_K:
            for w in RRF_W:
                add(f"rrf-k{k}-w{w}", q, back, *rrf([lk, dk[:100]], k, [1.0, w]))
        for kl in RRF2_K:  # RRF with its own k per leg
            for kd in RRF2_K:
                for w in (1.0, 1.1):
                    add(f"rrf2-kl{kl}-kd{kd}-w{w}", q, back, *_sum_by_key(
                        [lk, dk[:100]], [1.0 / (kl + np.arange(1, len(lk) + 1)),
                                         w / (kd + np.arange(1, len(dk[:100]) + 1))]))
        for d in D_GRID:  # convex over ranks: a leg's score 1 - (rank - 1) / its depth
            for a in A_GRID:
                add(f"rank-a{a}-d{d}", q, back, *_sum_by_key(
                    [lk, dk[:d]], [(1 - a) * (1 - np.arange(len(lk)) / 1000),
                                   a * (1 - np.arange(len(dk[:d])) / d)]))
        for feat, centre in Q_FEATS.items():
            for a in Q_A:
                for b in Q_B:
                    wd = adaptive_weight(a, b, f[feat], centre)
                    for d in Q_D:
                        add(f"q{feat}-a{a}-b{b}-d{d}", q, back,
                            *weighted([lk, dk[:d]], [ls, ds[:d]], [1 - wd, wd]))
    out = {c: ndcg(run, qrels) for c, run in cands.items()}
    out[BL.REFERENCE] = BL.nd10(folder / f"{BL.REFERENCE}.trec", qrels)
    return out


def ndcg(run: dict, qrels: dict) -> dict[str, float]:
    """nDCG@10 of every judged query by ir-measures (a query absent from the run scores 0)."""
    import ir_measures
    from ir_measures import nDCG
    out = {q: 0.0 for q in qrels}
    for m in ir_measures.iter_calc([nDCG @ 10], qrels, run):
        out[m.query_id] = float(m.value)
    return out


def corpus_stats(eng, name: str) -> dict[str, float]:
    """Unlabeled statistics of a collection: log10 documents, mean words, distinct words, and
    the lexical/dense top-10 overlap on 100 synthetic queries (a sampled document's first 8
    words, seed 0), run by the engine."""
    ids, titles, texts = common.read_corpus(common.DATA / name)
    words = [(t + " " + x).split() for t, x in zip(titles, texts)]
    vocab = set()
    for t, x in zip(titles, texts):
        vocab.update(re.findall(r"\w+", (t + " " + x).lower()))
    pick = np.random.default_rng(0).choice(len(ids), size=min(100, len(ids)), replace=False)
    qs = [" ".join(words[i][:8]) or "empty" for i in pick]
    coll = BL.open_collection(eng, name)
    lex = coll.query_batch(qs, k=10, profile="lexical")
    den = coll.query_batch(qs, k=10, profile="dense")
    synth = float(np.mean([len({h.id for h in a} & {h.id for h in b}) / 10
                           for a, b in zip(lex, den)]))
    return {"ndocs": math.log10(len(ids)), "avgdl": math.log10(np.mean([len(w) for w in words])),
            "vocab": math.log10(len(vocab)), "synth": synth}


# ------------------------------------------------------------------------------ LOCO

def study(per_q: dict, stats: dict, names: list[str]) -> dict:
    mean = {n: {c: float(np.mean(list(v.values()))) for c, v in per_q[n].items()} for n in names}
    hybrid = {n: mean[n][BL.REFERENCE] for n in names}
    base = [c for c in mean[names[0]] if c != BL.REFERENCE]
    families = {"cvx": [c for c in base if c.startswith("cvx-")],
                "z": [c for c in base if c.startswith("z-")],
                "rrf": [c for c in base if c.startswith("rrf-")],
                "rrf2": [c for c in base if c.startswith("rrf2-")],
                "rank": [c for c in base if c.startswith("rank-")],
                "all per-query-fixed": [c for c in base if not c.startswith("q")]}
    for feat in Q_FEATS:
        families[f"q{feat}"] = [c for c in base if c.startswith(f"q{feat}-")] + families["cvx"]
    # corpus-adaptive: a candidate's score on collection n is its snapped cvx's there
    corpus: dict[str, dict[str, str]] = {}
    for feat, bs in C_B.items():
        centre = float(np.median([stats[n][feat] for n in names]))
        for a in A_GRID:
            for b in bs:
                for d in D_GRID:
                    corpus[f"c{feat}-a{a}-b{b}-d{d}"] = {
                        n: f"cvx-a{snap(a + b * (stats[n][feat] - centre))}-d{d}" for n in names}
        families[f"c{feat}"] = [c for c in corpus if c.startswith(f"c{feat}-")] + families["cvx"]

    def score(c, n):
        return mean[n][corpus[c][n]] if c in corpus else mean[n][c]

    def per_query(c, n):
        return per_q[n][corpus[c][n]] if c in corpus else per_q[n][c]

    grid, detail = [], {}
    for fam, pool in families.items():
        for rule in RULES:
            folds = {}
            for f in names:
                inner = [n for n in names if n != f]
                pick = fold_choice(rule, pool, score, hybrid, inner)
                folds[f] = {"chosen": pick, "ndcg10": score(pick, f), "hybrid": hybrid[f],
                            "ratio": score(pick, f) / hybrid[f]}
            m = float(np.mean([folds[f]["ndcg10"] for f in names]))
            h = float(np.mean([hybrid[f] for f in names]))
            worst = min(folds, key=lambda f: folds[f]["ratio"])
            row = {"family": fam, "rule": rule, "mean": m, "hybrid": h, "mean_ratio": m / h,
                   "worst": folds[worst]["ratio"], "worst_at": worst,
                   "meets": m / h >= 1.02 and folds[worst]["ratio"] >= FLOOR,
                   "transductive": fam in TRANSDUCTIVE}
            grid.append(row)
            detail[f"{fam}/{rule}"] = folds
    for key, folds in detail.items():  # paired t-tests of every fold's choice against hybrid
        for f, r in folds.items():
            t = common.paired(per_q[f][BL.REFERENCE], per_query(r["chosen"], f))
            r.update(t_p=t["t_p"], wins=t["wins"], losses=t["losses"],
                     queries=len(per_q[f][BL.REFERENCE]))
    return {"grid": grid, "folds": detail, "means": mean, "stats": stats,
            "corpus_candidates": corpus}


def best_tradeoff(grid: list[dict], shippable: bool) -> dict:
    rows = [r for r in grid if not (shippable and r["transductive"])]
    meets = [r for r in rows if r["meets"]]
    if meets:
        return max(meets, key=lambda r: (r["worst"], r["mean_ratio"]))
    ok_mean = [r for r in rows if r["mean_ratio"] >= 1.02] or rows
    return max(ok_mean, key=lambda r: (r["worst"], r["mean_ratio"]))


def report(res: dict) -> None:
    rows = [[r["family"] + (" (transductive)" if r["transductive"] else ""), r["rule"],
             f"{r['mean']:.4f}", f"{r['mean_ratio']:.4f}", f"{r['worst']:.4f} ({r['worst_at']})",
             "yes" if r["meets"] else "no"] for r in res["grid"]]
    console.print(table("held out (LOCO): every family x rule, against hybrid",
                        ["family", "rule", "mean nDCG@10", "x hybrid (>= 1.02)",
                         "worst ratio (>= 0.995)", "both"], rows))
    for label, r in (("best trade-off, shippable", res["best"]),
                     ("best trade-off, any (incl. transductive)", res["best_any"])):
        folds = res["folds"][f"{r['family']}/{r['rule']}"]
        console.print(table(f"{label}: {r['family']} / {r['rule']}: mean {r['mean_ratio']:.4f}x, "
                            f"worst {r['worst']:.4f}",
                            ["held out", "queries", "chosen on the other nine", "nDCG@10",
                             "hybrid", "ratio", "t-test p", "wins/losses"],
                            [[f, v["queries"], v["chosen"], f"{v['ndcg10']:.4f}",
                              f"{v['hybrid']:.4f}", f"{v['ratio']:.3f}", f"{v['t_p']:.2g}",
                              f"{v['wins']}/{v['losses']}"] for f, v in folds.items()]))


SHIPPED = "hybrid-adaptive"  # the engine's profile of the best shippable trade-off
TWIN = "qdpk-a0.55-b0.15-d1000"  # its offline twin here


def engine_check(eng, names: list[str], offline: dict) -> dict:
    """``hybrid-adaptive`` run by the engine (a TREC run, ir-measures) against its offline twin."""
    out = {}
    for n in names:
        coll = BL.open_collection(eng, n)
        qs, qrels = BL.judged_queries(n)
        vectors = coll.encoder.encode([t for _, t in qs], chunk=256)
        path = BL.RUNS / n / "engine" / f"{SHIPPED}.trec"
        common.write_trec(path, BL.engine_run(coll, qs, vectors, SHIPPED, TOP), SHIPPED)
        out[n] = {"engine": float(np.mean(list(BL.nd10(path, qrels).values()))),
                  "offline": offline[n]}
    worst = max(abs(v["engine"] - v["offline"]) for v in out.values())
    console.print(f"engine check of {SHIPPED} (offline twin {TWIN}): largest |engine - offline| "
                  f"nDCG@10 {worst:.4f}")
    return out


def speed(eng, name: str, profiles: list[str], rounds: int) -> dict:
    """q/s one query at a time (query encoding included), interleaved rounds in one process,
    by wall time and by this process's CPU time (the machine is shared)."""
    coll = BL.open_collection(eng, name)
    qs = [t for _, t in BL.judged_queries(name)[0]]
    for p in profiles:
        coll.query_batch(qs[:8], k=10, profile=p)
    wall = {p: 0.0 for p in profiles}
    cpu = {p: 0.0 for p in profiles}
    count = 0
    for rep in range(rounds):
        for i, text in enumerate(qs):
            shift = (i + rep) % len(profiles)
            for p in profiles[shift:] + profiles[:shift]:
                t0, c0 = time.perf_counter(), time.process_time()
                coll.query(text, k=10, profile=p)
                wall[p] += time.perf_counter() - t0
                cpu[p] += time.process_time() - c0
            count += 1
    ref = profiles[0]
    out = {"collection": name, "queries": count,
           "qps_wall": {p: count / wall[p] for p in profiles},
           "qps_cpu": {p: count / cpu[p] for p in profiles},
           "ratio_wall": {p: wall[ref] / wall[p] for p in profiles},
           "ratio_cpu": {p: cpu[ref] / cpu[p] for p in profiles}}
    console.print(table(f"{name}: q/s one query at a time ({count} queries each, interleaved)",
                        ["profile", "q/s (wall)", "q/s (CPU)", f"vs {ref} (wall)",
                         f"vs {ref} (CPU)"],
                        [[p, f"{out['qps_wall'][p]:.1f}", f"{out['qps_cpu'][p]:.1f}",
                          f"{out['ratio_wall'][p]:.3f}", f"{out['ratio_cpu'][p]:.3f}"]
                         for p in profiles]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default=",".join(BL.ALL))
    ap.add_argument("--engine-check", action="store_true",
                    help=f"run {SHIPPED} through the engine and compare with {TWIN}")
    ap.add_argument("--speed", default="", help=f"collection for the q/s check of {SHIPPED} "
                                                f"against hybrid (e.g. npl)")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    import polyindex
    BL.DATA_DIR.mkdir(parents=True, exist_ok=True)
    eng = polyindex.open(BL.DATA_DIR, readonly=True)
    names = [n for n in common.parse_list(args.collections) if BL.make_runs(eng, n) is not None]
    per_q, stats = {}, {}
    for n in names:
        t0 = time.perf_counter()
        stats[n] = corpus_stats(eng, n)
        per_q[n] = collection_runs(n, stats[n])
        console.print(f"[dim]{n}: {len(per_q[n])} candidates scored in "
                      f"{time.perf_counter() - t0:.0f}s; stats "
                      f"{ {k: round(v, 3) for k, v in stats[n].items()} }[/dim]")
    res = study(per_q, stats, names)
    res["best"] = best_tradeoff(res["grid"], shippable=True)
    res["best_any"] = best_tradeoff(res["grid"], shippable=False)
    report(res)
    if args.engine_check:
        res["engine_check"] = engine_check(eng, names, {n: res["means"][n][TWIN] for n in names})
    if args.speed:
        res["speed"] = speed(eng, args.speed, [BL.REFERENCE, SHIPPED], args.rounds)
    res.pop("means")
    common.save_results("bench_loco_floor", {"collections": names, **res,
                                             "grid_params": {"a": A_GRID, "d": D_GRID,
                                                             "q_feats": Q_FEATS, "q_a": Q_A,
                                                             "q_b": Q_B, "q_d": Q_D, "c_b": C_B,
                                                             "floor": FLOOR}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
