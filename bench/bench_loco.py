"""The default profile chosen by leave-one-collection-out (LOCO) over the ten shared collections.

Every candidate profile's TREC run of each collection's judged test queries is saved once
(``bench/.work/loco/runs/<collection>/<profile>.trec``); then, for each held-out collection,
everything fitted (the fusion's method, weight, RRF k and candidate depths, the LightGBM
ranker, the profile itself) is chosen on the other nine and scored on the held-out one. The
reference is ``hybrid`` as shipped (RRF k 60, lexical 1000 + dense 100, dense weighted 1.1).

Candidates:

- ``lexical``, ``dense`` (top 1000 each, from the engine);
- ``rrf-k{K}-w{W}-l{L}-d{D}``: reciprocal rank fusion of lexical top L and dense top D, the
  dense leg weighted W, computed from the two legs' runs by ``polyindex.rerank.fusion.rrf``
  (the engine's own function; ``hybrid`` itself is checked against its offline twin);
- ``cvx-a{A}-l{L}-d{D}``: the convex (``weighted``) fusion, min-max normalized scores,
  dense weight A, lexical 1 - A (``polyindex.rerank.fusion.weighted``);
- ``ltr``: the general ranker (``bench_ltr``'s recipe: ``normalized`` transform, fused-score
  prior, tree weight 1, early stopping on 20% of each training collection's queries) over the
  window of plain RRF (k 60, equal weights, lexical 1000 + dense 100: no constant tuned on test
  queries), trained without the collection it is scored on. For a fold's choice its score on
  each of the nine comes from a ranker trained on the other eight (nested: 90 fits), so the
  held-out collection's qrels never decide anything.

A fold picks the candidate with the best mean nDCG@10 over its nine collections. What ships
is the choice made the same way on all ten. Per held-out collection: the choice, its nDCG@10,
hybrid's, the ratio and the paired t-test p-value (scipy ``ttest_rel`` over per-query nDCG@10,
ir-measures on the TREC runs). ``--speed``: the shipped choice's and hybrid's q/s one query at
a time (query encoding included), interleaved rounds, same process.

Collections: copied from ``$LOCO_CACHE`` when set (lexical + dense, the CLI's default
kinds; each folder with ``.done``) into bench/.work/loco/data, else indexed with
``polyindex index``. Results: bench/results/bench_loco.json.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import WORK, console, table  # noqa: E402

ALL = ["adi", "time", "medline", "cranfield", "cisi", "cacm", "nfcorpus", "lisa", "arguana", "npl"]
LOCO = WORK / "loco"
DATA_DIR = LOCO / "data"
RUNS = LOCO / "runs"
BUILD = LOCO / "build"  # `polyindex index ... --data bench/.work/loco/build` (not the cache)
# a folder of prebuilt collections (each with a ``.done`` file) to copy instead of indexing
CACHE_SRC = Path(os.environ["LOCO_CACHE"]) if os.environ.get("LOCO_CACHE") else None
DEPTH = 1000   # the legs' runs
TOP = 100      # fused runs (a run of the top 100, as bench_ltr)
RRF_K = (20, 60)
RRF_W = (0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0)
CVX_A = (0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.8)
LEX_DEPTH = (100, 1000)
DENSE_DEPTH = (100, 1000)
LTR_WINDOW = {"retrieve": [{"index": "lexical", "k": 1000}, {"index": "dense", "k": 100}],
              "fuse": {"method": "rrf", "k": 60}}
REFERENCE = "hybrid"


# ------------------------------------------------------------------------------ data

def open_collection(eng, name: str):
    """The collection in bench/.work/loco/data: copied from the shared cache when it is done
    there, else indexed with the CLI's defaults."""
    target = DATA_DIR / name
    if not target.exists():
        src = CACHE_SRC / name if CACHE_SRC is not None else BUILD / name
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        built = BUILD / name  # indexed here beforehand, while the shared cache was busy
        if not (src / ".done").exists() and _complete(built):
            src = built
        if (src / ".done").exists() or src == built:
            tmp = DATA_DIR / f".{name}.copy"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(src, tmp, ignore=shutil.ignore_patterns("LOCK", "buffer", ".done"))
            tmp.rename(target)
        else:
            folder = common.collection_folder(name)
            if folder is None:
                return None
            console.print(f"[dim]indexing {name} with `polyindex index` ...[/dim]")
            common.run_cli(["index", folder, "--data", BUILD, "--collection", name,
                            "--no-progress", "--json"])
            return open_collection(eng, name)
    return eng.collection(name)


def _complete(folder: Path) -> bool:
    """A collection whose bulk ingest finished (``polyindex index`` done, nothing writing)."""
    try:
        m = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return bool((m.get("ingest") or {}).get("done"))


def judged_queries(name: str):
    folder = common.DATA / name
    qrels = common.read_qrels(folder, "test")
    return common.judged(common.read_queries(folder), qrels), qrels


def nd10(path: Path, qrels: dict) -> dict[str, float]:
    """nDCG@10 of every judged query (ir-measures; a query absent from the run scores 0)."""
    import ir_measures
    from ir_measures import nDCG
    out = {q: 0.0 for q in qrels}
    run = [r for r in ir_measures.read_trec_run(str(path)) if r.query_id in qrels]
    for m in ir_measures.iter_calc([nDCG @ 10], qrels, run):
        out[m.query_id] = float(m.value)
    return out


# ------------------------------------------------------------------------------ runs

def engine_run(coll, qs, vectors, profile, k) -> dict:
    out = {}
    for start in range(0, len(qs), 64):
        chunk = qs[start:start + 64]
        hits = coll.query_batch([t for _, t in chunk], vectors=vectors[start:start + 64], k=k,
                                profile=profile)
        out.update({q: [(h.id, h.score) for h in hs] for (q, _), hs in zip(chunk, hits)})
    return out


def read_run(path: Path) -> dict:
    out: dict[str, list] = {}
    with open(path) as f:
        for line in f:
            q, _, d, _, s, _ = line.split()
            out.setdefault(q, []).append((d, float(s)))
    return out


def fused_runs(lex: dict, dense: dict) -> dict[str, dict]:
    """Every fusion candidate's run, from the two legs' runs (the engine's fusion functions)."""
    from polyindex.rerank.fusion import rrf, weighted
    names = {}
    for k in RRF_K:
        for w in RRF_W:
            for ld in LEX_DEPTH:
                for dd in DENSE_DEPTH:
                    names[f"rrf-k{k}-w{w}-l{ld}-d{dd}"] = ("rrf", k, w, ld, dd)
    for a in CVX_A:
        for ld in LEX_DEPTH:
            for dd in DENSE_DEPTH:
                names[f"cvx-a{a}-l{ld}-d{dd}"] = ("cvx", None, a, ld, dd)
    out = {n: {} for n in names}
    for q in lex.keys() | dense.keys():
        ids: dict[str, int] = {}
        legs = []
        for run in (lex.get(q, []), dense.get(q, [])):
            keys = np.array([ids.setdefault(d, len(ids)) for d, _ in run], np.int64)
            legs.append((keys, np.array([s for _, s in run], np.float64)))
        back = np.array(list(ids), dtype=object)
        for n, (method, k, w, ld, dd) in names.items():
            (lk, ls), (dk, ds) = legs
            if method == "rrf":
                keys, scores = rrf([lk[:ld], dk[:dd]], k=k, weights=[1.0, w])
            else:
                keys, scores = weighted([lk[:ld], dk[:dd]], [ls[:ld], ds[:dd]], [1 - w, w])
            out[n][q] = list(zip(back[keys[:TOP]].tolist(), scores[:TOP].tolist()))
    return out


def make_runs(eng, name: str) -> dict | None:
    """The collection's candidate runs in RUNS/<name>/ (the engine's legs and hybrid; the
    fusions from the legs). Returns {candidate: path}."""
    coll = open_collection(eng, name)
    if coll is None:
        return None
    folder = RUNS / name
    qs, _ = judged_queries(name)
    legs = {"lexical": folder / "lexical.trec", "dense": folder / "dense.trec",
            REFERENCE: folder / f"{REFERENCE}.trec"}
    if not all(p.exists() for p in legs.values()):
        t0 = time.perf_counter()
        vectors = coll.encoder.encode([t for _, t in qs], chunk=256)
        for prof, k in (("lexical", DEPTH), ("dense", DEPTH), (REFERENCE, TOP)):
            common.write_trec(legs[prof], engine_run(coll, qs, vectors, prof, k), prof)
        console.print(f"[dim]{name}: {len(qs)} queries, engine runs in "
                      f"{time.perf_counter() - t0:.1f}s[/dim]")
    paths = dict(legs)
    done = folder / ".fused"  # holds the grid the fused runs were made for
    grid = repr((RRF_K, RRF_W, CVX_A, LEX_DEPTH, DENSE_DEPTH, TOP))
    fused = None
    if not done.exists() or done.read_text() != grid:
        fused = fused_runs(read_run(legs["lexical"]), read_run(legs["dense"]))
    for cand in candidate_names():
        paths[cand] = folder / f"{cand}.trec"
        if fused is not None:
            common.write_trec(paths[cand], fused[cand], cand)
    done.write_text(grid)
    return paths


def candidate_names() -> list[str]:
    out = []
    for k in RRF_K:
        for w in RRF_W:
            for ld in LEX_DEPTH:
                for dd in DENSE_DEPTH:
                    out.append(f"rrf-k{k}-w{w}-l{ld}-d{dd}")
    for a in CVX_A:
        for ld in LEX_DEPTH:
            for dd in DENSE_DEPTH:
                out.append(f"cvx-a{a}-l{ld}-d{dd}")
    return out


# ------------------------------------------------------------------------------ ltr

def ltr_candidates(eng, name: str):
    """Judged test queries' windows (plain RRF's top 100) with features and labels (cached)."""
    from polyindex.query.candidates import collect
    from polyindex.rerank import schema
    from polyindex.rerank.train import Candidates
    coll = open_collection(eng, name)
    qs, qrels = judged_queries(name)
    segs = [(s.id, s.n_rows) for s in coll.table.sealed_snapshot().manifest.segments]
    key = hashlib.sha1(repr((segs, schema.VERSION, schema.NAMES, LTR_WINDOW,
                             [q for q, _ in qs])).encode()).hexdigest()
    path = LOCO / "ltr" / f"{name}.npz"
    if path.exists():
        z = np.load(path, allow_pickle=False)
        if str(z["key"]) == key:
            return Candidates(z["qids"].tolist(), z["X"], z["qptr"], z["labels"],
                              z["doc_ids"].tolist(), z["fused"]), qrels
    t0 = time.perf_counter()
    vectors = coll.encoder.encode([t for _, t in qs], chunk=256)
    c = collect(coll, qs, qrels, profile=LTR_WINDOW, window=TOP, vectors=vectors)
    console.print(f"[dim]{name}: ltr windows + features in {time.perf_counter() - t0:.1f}s[/dim]")
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, key=key, qids=np.array(c.qids), X=c.X, qptr=c.qptr, labels=c.labels,
             doc_ids=np.array(c.doc_ids), fused=c.fused)
    return c, qrels


def ltr_sets(eng, names):
    from polyindex.rerank.train import split_queries
    cap = 600  # training queries per collection (bench_ltr.GENERAL_CAP: no collection dominates)
    sets = {}
    for name in names:
        test, qrels = ltr_candidates(eng, name)
        keep, held = split_queries(len(test.qids), seed=1)
        train, valid = test.subset(keep), test.subset(held)
        if len(train.qids) > cap:
            pick = sorted(np.random.default_rng(2).permutation(len(train.qids))[:cap])
            train = train.subset(pick)
        sets[name] = (train, valid, test, qrels)
    return sets


def ltr_run(sets, train_on: list[str], score_on: str) -> Path:
    """The run of ``score_on`` by the general ranker trained on ``train_on`` (cached, named by
    the training collections)."""
    from polyindex.rerank.train import fit
    tag = hashlib.sha1(",".join(sorted(train_on)).encode()).hexdigest()[:12]
    path = RUNS / score_on / "ltr" / f"{tag}.trec"
    if path.exists():
        return path
    ranker = fit([sets[n][0] for n in train_on], [sets[n][1] for n in train_on],
                 transform="normalized", params={"num_leaves": 15, "learning_rate": 0.1},
                 max_rounds=100, general=True, prior_feature="fused_score",
                 collections=list(train_on), window=TOP)
    test = sets[score_on][2]
    common.write_trec(path, test.run(ranker.predict(test.X, test.qptr)), "ltr")
    return path


# ------------------------------------------------------------------------------ LOCO

def choose(scores: dict[str, dict[str, float]], names: list[str]) -> str:
    """The candidate with the best mean nDCG@10 over ``names`` (ties: the earlier one)."""
    best, best_m = None, -1.0
    for cand, per in scores.items():
        m = round(float(np.mean([per[n] for n in names])), 6)
        if m > best_m:
            best, best_m = cand, m
    return best


def loco(eng, names: list[str], with_ltr: bool, nested: bool) -> dict:
    paths = {n: make_runs(eng, n) for n in names}
    names = [n for n in names if paths[n] is not None]
    qrels = {n: judged_queries(n)[1] for n in names}
    t0 = time.perf_counter()
    per_q = {n: {c: nd10(p, qrels[n]) for c, p in paths[n].items()} for n in names}
    console.print(f"[dim]scored {sum(map(len, paths.values()))} runs in "
                  f"{time.perf_counter() - t0:.0f}s[/dim]")
    if with_ltr:
        sets = ltr_sets(eng, names)
        for f in names:  # held-out runs: trained on the other nine
            p = ltr_run(sets, [n for n in names if n != f], f)
            per_q[f]["ltr"] = nd10(p, qrels[f])
    mean = {n: {c: float(np.mean(list(v.values()))) for c, v in per_q[n].items()} for n in names}
    cands = [c for c in mean[names[0]] if c != REFERENCE]
    folds = {}
    for f in names:
        inner = [n for n in names if n != f]
        scores = {c: {n: mean[n][c] for n in inner} for c in cands if c != "ltr"}
        if with_ltr:
            if nested:  # ltr on each inner collection, trained on the other eight
                scores["ltr"] = {j: float(np.mean(list(nd10(
                    ltr_run(sets, [n for n in inner if n != j], j),
                    qrels[j]).values()))) for j in inner}
            else:
                scores["ltr"] = {n: mean[n]["ltr"] for n in inner}
        pick = choose(scores, inner)
        test = common.paired(per_q[f][REFERENCE], per_q[f][pick])
        folds[f] = {"queries": len(qrels[f]), "chosen": pick,
                    "inner_mean": float(np.mean([scores[pick][n] for n in inner])),
                    "ndcg10": mean[f][pick], "hybrid": mean[f][REFERENCE],
                    "ratio": mean[f][pick] / mean[f][REFERENCE], "t_p": test["t_p"],
                    "wins": test["wins"], "losses": test["losses"]}
    all_scores = {c: {n: mean[n][c] for n in names} for c in cands}
    ship = choose(all_scores, names)
    # the shipped candidate's own held-out-free reading: its plain score on each collection
    top = sorted(all_scores, key=lambda c: -np.mean(list(all_scores[c].values())))[:10]
    engine = engine_check(eng, names, ship, mean, qrels)
    return {"folds": folds, "shipped": ship, "means": mean, "top10_on_all": top,
            "engine_check": engine,
            "mean_chosen": float(np.mean([folds[f]["ndcg10"] for f in names])),
            "mean_hybrid": float(np.mean([folds[f]["hybrid"] for f in names])),
            "hybrid_offline_check": {n: (mean[n][REFERENCE], mean[n]["rrf-k60-w1.1-l1000-d100"])
                                     for n in names}}


def engine_check(eng, names, cand: str, mean: dict, qrels: dict) -> dict:
    """The shipped candidate run through the engine as a profile (``profile_of``): its nDCG@10
    against the offline fusion's (the same but for ties and 6-decimal scores)."""
    out = {}
    for n in names:
        coll = eng.collection(n)
        qs, _ = judged_queries(n)
        vectors = coll.encoder.encode([t for _, t in qs], chunk=256)
        path = RUNS / n / "engine" / f"{cand}.trec"
        common.write_trec(path, engine_run(coll, qs, vectors, profile_of(cand), TOP), cand)
        got = float(np.mean(list(nd10(path, qrels[n]).values())))
        out[n] = {"engine": got, "offline": mean[n][cand]}
    worst = max(abs(v["engine"] - v["offline"]) for v in out.values())
    console.print(f"engine check of {cand}: largest |engine - offline| nDCG@10 {worst:.4f}")
    return out


def report(res: dict) -> None:
    rows = []
    for f, r in res["folds"].items():
        rows.append([f, r["queries"], r["chosen"], f"{r['ndcg10']:.4f}", f"{r['hybrid']:.4f}",
                     f"{r['ratio']:.3f}", f"{r['t_p']:.2g}", f"{r['wins']}/{r['losses']}"])
    console.print(table("leave-one-collection-out: the default chosen on the other nine, "
                        "held-out nDCG@10 vs hybrid",
                        ["held out", "queries", "chosen on the nine", "nDCG@10", "hybrid",
                         "ratio", "t-test p", "wins/losses"], rows))
    ratios = [r["ratio"] for r in res["folds"].values()]
    console.print(f"mean held-out nDCG@10 {res['mean_chosen']:.4f} vs hybrid "
                  f"{res['mean_hybrid']:.4f}: {res['mean_chosen'] / res['mean_hybrid']:.4f}x "
                  f"(target >= 1.02x); worst ratio {min(ratios):.4f} (target >= 0.995)")
    console.print(f"chosen on all ten (what ships): {res['shipped']}")


def speed(eng, name: str, profiles: dict, rounds: int) -> dict:
    """q/s one query at a time (query encoding included), interleaved, same process."""
    coll = open_collection(eng, name)
    qs = [t for _, t in judged_queries(name)[0]]
    for p in profiles.values():
        coll.query_batch(qs[:8], k=10, profile=p)
    times = {n: 0.0 for n in profiles}
    count = 0
    for rep in range(rounds):
        for i, text in enumerate(qs):
            order = list(profiles)
            shift = (i + rep) % len(order)
            for n in order[shift:] + order[:shift]:
                t0 = time.perf_counter()
                coll.query(text, k=10, profile=profiles[n])
                times[n] += time.perf_counter() - t0
            count += 1
    qps = {n: count / t for n, t in times.items()}
    ref = next(iter(profiles))
    rows = [[n, f"{q:.1f}", f"{q / qps[ref]:.3f}"] for n, q in qps.items()]
    console.print(table(f"{name}: q/s one query at a time ({count} queries each, interleaved)",
                        ["profile", "q/s", f"vs {ref}"], rows))
    return {"collection": name, "queries": count, "qps": qps,
            "ratio": {n: q / qps[ref] for n, q in qps.items()}}


def profile_of(cand: str) -> dict | str:
    """The engine profile of a candidate name."""
    if not cand.startswith(("rrf-", "cvx-")):  # a built-in profile's name (hybrid-convex)
        return cand
    method, *parts = cand.split("-")
    p = {x[0]: x[1:] for x in parts}
    stages = [{"index": "lexical", "k": int(p["l"])}, {"index": "dense", "k": int(p["d"])}]
    if method == "rrf":
        return {"retrieve": stages, "fuse": {"method": "rrf", "k": int(p["k"]),
                                             "weights": {"dense": float(p["w"])}}}
    a = float(p["a"])
    return {"retrieve": stages, "fuse": {"method": "weighted",
                                         "weights": {"lexical": round(1 - a, 6), "dense": a}}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default=",".join(ALL),
                    help="the LOCO collections; '-' with --speed and --speed-profile: only the "
                         "q/s check")
    ap.add_argument("--no-ltr", action="store_true", help="fusions and single kinds only")
    ap.add_argument("--flat-ltr", action="store_true",
                    help="a fold's choice reads ltr's LOCO-of-ten scores on the nine (their "
                         "rankers saw the held-out collection: not honest, faster)")
    ap.add_argument("--speed", default="", help="collection for the q/s check (e.g. npl)")
    ap.add_argument("--speed-profile", default="", help="candidate to time against hybrid "
                                                        "(default: the shipped choice)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prepare", action="store_true",
                    help="only the runs and the ranker's windows (e.g. while the cache fills)")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    import polyindex
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    eng = polyindex.open(DATA_DIR, readonly=True)  # collections are copied in, never written
    if args.speed and args.speed_profile and args.collections == "-":  # the q/s check alone
        res = speed(eng, args.speed, {REFERENCE: REFERENCE,
                                      args.speed_profile: profile_of(args.speed_profile)},
                    args.rounds)
        common.save_results("bench_loco_speed", res)
        return 0
    if args.prepare:
        for name in common.parse_list(args.collections):
            if make_runs(eng, name) is not None and not args.no_ltr:
                ltr_candidates(eng, name)
        return 0
    res = loco(eng, common.parse_list(args.collections), not args.no_ltr, not args.flat_ltr)
    report(res)
    payload = {"loco": res, "grid": {"rrf_k": RRF_K, "rrf_w": RRF_W, "cvx_a": CVX_A,
                                     "lex_depth": LEX_DEPTH, "dense_depth": DENSE_DEPTH},
               "ltr": None if args.no_ltr else {"window": LTR_WINDOW, "nested": not args.flat_ltr}}
    if args.speed:
        cand = args.speed_profile or res["shipped"]
        payload["speed"] = speed(eng, args.speed, {REFERENCE: REFERENCE, cand: profile_of(cand)},
                                 args.rounds)
    common.save_results("bench_loco", payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
