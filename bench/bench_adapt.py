"""Adapted vs unadapted encoder on the shared collections (issue 40).

For each collection: copy its lexical + dense collection from the shared cache (never written),
run ``polyindex.adapt.learn`` in a child process (its own wall, CPU time and peak RSS) with the
collection's hybrid profile as teacher, encode the corpus and the judged test queries with the
student, and score (ir-measures, test qrels, judged queries):

- dense nDCG@10: the stored (unadapted) vectors vs the student's, exact inner product;
- hybrid nDCG@10: RRF (k=60, dense weighted 1.1: the shipped ``hybrid``) of BM25 top 1000 and
  dense top 100, unadapted vs adapted; the engine's own ``hybrid`` profile is scored too, as a
  check of the reimplemented fusion;
- the default profile's nDCG@10 (``hybrid-convex``: min-max normalized BM25 top 1000 x 0.6 +
  dense top 100 x 0.4), unadapted vs adapted, and the engine's own ``hybrid-convex`` as its
  check;
- both encoders kept: ``dense_both`` (the sum of the base's and the student's cosines) and
  ``convex_both`` (lexical + base dense + adapted dense, ``--both-weights``), against the
  unadapted dense and default;
- the guard's verdict (``adapt.guard``: held-back synthetic queries, MRR of the source
  document, current encoder vs student) beside the real nDCG, to see whether it tracks it;
- paired t-tests per collection (scipy ttest_rel), means over collections, the collections used
  to choose the recipe (``--dev``) reported apart. adapt never reads qrels; only this script does.

``--recipe K=V,...`` learns with a variant of the recipe; with ``--from-students DIR`` a
variant's ``average`` is applied to students learnt before (no second training).

``--dtype-check`` instead times training steps in float32 vs bf16 autocast (interleaved rounds,
CPU seconds: the machine is shared) on one collection.

    .venv/bin/python bench/bench_adapt.py --collections time,medline,cranfield
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ORDER = ["adi", "time", "medline", "cranfield", "cisi", "cacm", "nfcorpus", "lisa", "arguana", "npl"]
# The collections the recipe was chosen on (at most three; reported apart). None so far: the
# recipe was fixed before any nDCG was measured (docs/notes/adapt.md); a retune names its own.
DEV: list[str] = []
RUN_TAG = "default"  # the recipe's name in run files (main() sets it from --recipe)
NEURAL_WEIGHT = 1.1  # polyindex.query.profiles.NEURAL_WEIGHT, the shipped hybrid's dense weight


class Progress:
    """A line every ``every`` seconds: phase, done/total, rate, ETA."""

    def __init__(self, label: str, every: float = 15.0):
        self.label, self.every, self.last, self.start = label, every, 0.0, {}

    def __call__(self, phase: str, done: int, total: int) -> None:
        now = time.perf_counter()
        t0 = self.start.setdefault(phase, now)
        if now - self.last < self.every and done != total:
            return
        self.last = now
        if now > t0 and done:
            rate = done / (now - t0)
            pace = f"{rate:.2f}/s  ETA {(total - done) / rate:.0f}s"
        else:  # the phase's first report: no rate yet
            pace = "rate -  ETA -"
        print(f"  {self.label} {phase}: {done}/{total}  {pace}", flush=True)


def collection_copy(name: str, work: Path, cache: Path) -> Path | None:
    src, dst = cache / name, work / "data" / name
    if (dst / ".copied").exists():
        return dst
    if not (src / ".done").exists():
        common.console.print(f"[yellow]SKIP {name}: {src} is not finished (.done absent)[/yellow]")
        return None
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, dst, symlinks=True)
    (dst / ".copied").touch()
    return dst


def stored(coll_dir: Path):
    """(ids, stored dense vectors) of the live rows, in segment order."""
    import faiss

    from polyindex.storage.manifest import load_manifest
    from polyindex.storage.segment import Segment, read_tombstones
    m = load_manifest(coll_dir)
    ids, embs = [], []
    for e in m.segments:
        seg = Segment(coll_dir / "segments" / e.id, e.id, e.n_rows)
        live = read_tombstones(coll_dir / e.tombstones, e.n_rows) if e.tombstones else \
            np.ones(e.n_rows, bool)
        keep = np.flatnonzero(live)
        ids += seg.ids_at(keep)
        emb = seg.embeddings()
        if emb is None:
            index = faiss.read_index(str(coll_dir / "segments" / e.id / "dense.faiss"))
            emb = index.reconstruct_n(0, index.ntotal)
        embs.append(emb[keep])
    return ids, np.ascontiguousarray(np.concatenate(embs), np.float32)


def top(q: np.ndarray, d: np.ndarray, k: int) -> np.ndarray:
    k = min(k, len(d))
    sims = q @ d.T
    part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(sims, part, 1).argsort(1, kind="stable")[:, ::-1]
    return np.take_along_axis(part, order, 1)


def hybrid(lex: list[np.ndarray], dense: np.ndarray) -> list[np.ndarray]:
    from polyindex.rerank.fusion import rrf
    return [rrf([lx, dn[:100]], k=60, weights=[1.0, NEURAL_WEIGHT])[0][:100]
            for lx, dn in zip(lex, dense)]


def convex(lex: list[np.ndarray], lex_s: list[np.ndarray], q: np.ndarray, docs: np.ndarray,
           dense: np.ndarray) -> list[np.ndarray]:
    """The default profile's fusion (``hybrid-convex``): min-max normalized lexical top 1000
    and dense top 100 scores, weighted as ``query.profiles.CONVEX_WEIGHTS``."""
    from polyindex.query.profiles import CONVEX_WEIGHTS
    return convex_both(lex, lex_s, [(q, docs, dense)],
                       [CONVEX_WEIGHTS["lexical"], CONVEX_WEIGHTS["dense"]])


def convex_both(lex: list[np.ndarray], lex_s: list[np.ndarray], legs, weights) -> list[np.ndarray]:
    """The convex fusion of lexical top 1000 and each of ``legs``' dense top 100 ((queries,
    docs, top rows) each), min-max normalized and weighted: with two legs (the base encoder
    and its student, ``--both-weights``) it keeps the base encoder beside its student."""
    from polyindex.query.profiles import CONVEX_DEPTHS
    from polyindex.rerank.fusion import weighted
    nl, nd = CONVEX_DEPTHS["lexical"], CONVEX_DEPTHS["dense"]
    out = []
    for i, (lx, ls) in enumerate(zip(lex, lex_s)):
        keys, scores = [lx[:nl]], [ls[:nl]]
        for q, docs, rows in legs:
            keys.append(rows[i][:nd])
            scores.append(docs[rows[i][:nd]] @ q[i])
        out.append(weighted(keys, scores, weights)[0][:100])
    return out


def score(name: str, tag: str, qids, rows, ids, qrels, work: Path) -> dict[str, float]:
    run = {q: [(ids[r], float(len(rr) - i)) for i, r in enumerate(rr[:100])]
           for q, rr in zip(qids, rows)}
    path = work / "runs" / f"{name}.{tag}.{RUN_TAG}.trec"
    common.write_trec(path, run, tag)
    return common.per_query_trec(path, qrels)["nDCG@10"]


def recipe_arg(args):
    """The recipe: DEFAULT with ``--recipe K=V,...`` replaced (a milder variant), or DEFAULT."""
    import dataclasses

    from polyindex.adapt.recipe import DEFAULT
    if not args.recipe:
        return DEFAULT
    values = {}
    for item in re.split(r",(?![^\[]*\])", args.recipe):  # commas inside [..] are a list's
        k, _, v = item.partition("=")
        try:
            values[k] = json.loads(v)
        except ValueError:
            values[k] = v  # a bare word: neg_source=lexical
    return dataclasses.replace(DEFAULT, **values)


def learn_child(args) -> None:
    """In a child process: learn() on one copied collection; its report as JSON on stdout."""
    from polyindex.adapt.learn import learn
    from polyindex.adapt.teacher import collection_teacher
    from polyindex.engine import Engine
    coll_dir = Path(args.learn_child)
    eng = Engine(coll_dir.parent, create=False)
    coll = eng.collection(coll_dir.name)
    folder = common.collection_folder(coll_dir.name)
    ids, titles, texts = common.read_corpus(folder)
    if args.from_student:
        return reuse_child(args, coll, ids, titles, texts, eng)
    report = learn([common.doc_text(t, x) for t, x in zip(titles, texts)],
                   collection_teacher(coll, ids, "hybrid"), coll.config.model,
                   Path(args.out), recipe=recipe_arg(args), progress=Progress(coll_dir.name),
                   seed=args.seed, titles=titles,
                   lexical=collection_teacher(coll, ids, "lexical"))
    eng.close()
    print("REPORT " + json.dumps(report), flush=True)


def reuse_child(args, coll, ids, titles, texts, eng) -> None:
    """A student already learnt (``--from-students``) made into this recipe's (its
    ``average`` with the base) and judged by the guard on the same held-back queries learn
    held back: a variant that needs no second training."""
    import resource

    from polyindex.adapt import guard, student as st
    from polyindex.adapt.learn import judge
    from polyindex.adapt.synth import make_queries
    from polyindex.adapt.teacher import collection_teacher
    from polyindex.encode.text import resolve_model
    c0 = time.process_time()
    recipe = recipe_arg(args)
    docs = [common.doc_text(t, x) for t, x in zip(titles, texts)]
    _, held, _ = guard.hold_back(make_queries(docs, recipe, seed=args.seed, titles=titles),
                                 recipe, args.seed)
    model = st.load(args.from_student, "cpu")
    old = st.load(resolve_model(coll.config.model), "cpu")
    old.max_seq_length = model.max_seq_length
    if recipe.average:
        st.average(model, old, recipe.average)
    st.save(model, Path(args.out))
    verdict = judge(old, model, docs, held, recipe, args.seed,
                    collection_teacher(coll, ids, "lexical"), "cpu")
    eng.close()
    print("REPORT " + json.dumps({
        "reused_from": args.from_student, "guard": verdict,
        "cpu_seconds": round(time.process_time() - c0, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}),
        flush=True)


def one(name: str, args, work: Path) -> dict | None:
    from polyindex.encode.text import get_encoder
    from polyindex.engine import Engine
    folder = common.collection_folder(name)
    coll_dir = collection_copy(name, work, Path(args.cache)) if folder else None
    if coll_dir is None:
        return None
    ids, titles, texts = common.read_corpus(folder)
    if len(ids) < 200 and not args.force_small:
        return {"collection": name, "documents": len(ids), "refused": True,
                "note": "below the recipe's min_docs: refused, the collection keeps its encoder "
                        "(adapted = unadapted)"}
    student = work / "students" / (name + (f".{args.recipe}" if args.recipe else ""))
    print(f"{name}: learn on {len(ids)} documents", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--learn-child", str(coll_dir), "--out",
                             str(student), "--seed", str(args.seed)]
                            + (["--recipe", args.recipe] if args.recipe else [])
                            + (["--from-student", str(Path(args.from_students) / name)]
                               if args.from_students else []),
                            stdout=subprocess.PIPE, text=True)
    line = []
    for out in proc.stdout:  # the child's progress lines as they come
        if out.startswith("REPORT "):
            line.append(out)
        else:
            print(out, end="", flush=True)
    proc.wait()
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not line:
        return {"collection": name, "documents": len(ids), "error": f"learn exited {proc.returncode}"}
    learned = json.loads(line[0][7:])
    learned.pop("recipe", None)

    eng = Engine(work / "data", create=False)
    coll = eng.collection(name)
    sids, base_docs = stored(coll_dir)
    row = {d: i for i, d in enumerate(sids)}
    qrels = common.read_qrels(folder)
    queries = common.judged(common.read_queries(folder), qrels)
    qids, qtexts = [q for q, _ in queries], [t for _, t in queries]
    base = get_encoder(coll.config.model, coll.config.dtype)
    adapted = get_encoder(str(student), coll.config.dtype)
    by_id = dict(zip(ids, (common.doc_text(t, x) for t, x in zip(titles, texts))))
    t1 = time.perf_counter()
    prog = Progress(name)
    doc_texts = [by_id[d] for d in sids]
    new_docs = adapted.encode(doc_texts, on_batch=lambda n, c=[0]: (
        c.__setitem__(0, c[0] + n), prog("encode", c[0], len(doc_texts))))
    encode_s = time.perf_counter() - t1
    q_base, q_new = base.encode(qtexts), adapted.encode(qtexts)
    lex_hits = coll.query_batch(qtexts, k=1000, profile="lexical")
    lex = [np.array([row[h.id] for h in hits], np.int64) for hits in lex_hits]
    lex_s = [np.array([h.score for h in hits], np.float64) for hits in lex_hits]
    engine_hybrid = [np.array([row[h.id] for h in hits], np.int64) for hits in
                     coll.query_batch(qtexts, k=100, profile="hybrid")]
    engine_convex = [np.array([row[h.id] for h in hits], np.int64) for hits in
                     coll.query_batch(qtexts, k=100, profile="hybrid-convex")]
    eng.close()
    d0, d1 = top(q_base, base_docs, 1000), top(q_new, new_docs, 1000)
    # both encoders at once: the sum of their cosines (one vector of both halves), and the
    # default's fusion with the two dense legs side by side
    q_both = np.concatenate([q_base, q_new], 1)
    docs_both = np.concatenate([base_docs, new_docs], 1)
    d2 = top(q_both, docs_both, 100)
    runs = {"dense_both": d2,
            "convex_both": convex_both(lex, lex_s, [(q_base, base_docs, d0), (q_new, new_docs, d1)],
                                       args.both_weights),
            "dense": d0, "dense_adapted": d1, "hybrid": hybrid(lex, d0),
            "hybrid_adapted": hybrid(lex, d1), "hybrid_engine": engine_hybrid,
            "convex": convex(lex, lex_s, q_base, base_docs, d0),
            "convex_adapted": convex(lex, lex_s, q_new, new_docs, d1),
            "convex_engine": engine_convex}
    per = {tag: score(name, tag, qids, rows, sids, qrels, work) for tag, rows in runs.items()}
    mean = {tag: float(np.mean(list(v.values()))) for tag, v in per.items()}
    res = {"collection": name, "documents": len(ids), "judged_queries": len(qids),
           "used_to_choose": name in args.dev, "ndcg10": mean,
           "dense_ratio": mean["dense_adapted"] / mean["dense"] if mean["dense"] else None,
           "hybrid_ratio": mean["hybrid_adapted"] / mean["hybrid"] if mean["hybrid"] else None,
           "dense_test": common.paired(per["dense"], per["dense_adapted"]),
           "hybrid_test": common.paired(per["hybrid"], per["hybrid_adapted"]),
           "convex_ratio": mean["convex_adapted"] / mean["convex"] if mean["convex"] else None,
           "convex_test": common.paired(per["convex"], per["convex_adapted"]),
           "dense_both_ratio": mean["dense_both"] / mean["dense"] if mean["dense"] else None,
           "dense_both_test": common.paired(per["dense"], per["dense_both"]),
           "convex_both_ratio": mean["convex_both"] / mean["convex"] if mean["convex"] else None,
           "convex_both_test": common.paired(per["convex"], per["convex_both"]),
           "recipe": args.recipe or "default", "guard": learned.get("guard"),
           "learn": learned, "learn_wall_s": round(wall, 1),
           "learn_wall_s_per_10k": round(wall * 10_000 / len(ids), 1),
           "learn_cpu_s_per_10k": round(learned["cpu_seconds"] * 10_000 / len(ids), 1),
           "encode_corpus_s": round(encode_s, 1)}
    g = res["guard"] or {}
    print(json.dumps({**{k: res[k] for k in ("collection", "ndcg10", "dense_ratio",
                                             "hybrid_ratio", "convex_ratio", "convex_test",
                                             "dense_both_ratio", "convex_both_ratio",
                                             "convex_both_test")},
                      "guard": {k: g.get(k) for k in ("passed", "reason", "dense", "fused")}},
                     default=float), flush=True)
    return res


def guard_cell(g: dict | None) -> str:
    if not g:
        return "-"
    ratios = " / ".join(f"{g[s]['ratio']:.3f}" if g.get(s) and g[s]["ratio"] else "-"
                        for s in ("dense", "fused"))
    return f"{ratios}: {'commit' if g['passed'] else 'refuse'}"


def dtype_check(args) -> None:
    """CPU seconds per training step, float32 vs bf16 autocast, interleaved rounds."""
    import dataclasses

    from polyindex.adapt import student as st
    from polyindex.adapt.recipe import DEFAULT
    from polyindex.adapt.synth import make_queries
    from polyindex.adapt.teacher import Pair
    from polyindex.encode.text import resolve_model
    folder = common.collection_folder(args.collections.split(",")[0])
    ids, titles, texts = common.read_corpus(folder)
    texts = [common.doc_text(t, x) for t, x in zip(titles, texts)]
    qs = make_queries(texts, DEFAULT, seed=0)
    rng = np.random.default_rng(0)
    pairs = [Pair(q.text, q.positive, q.doc, int(rng.integers(0, len(texts))), q.kind) for q in qs]
    model = st.load(resolve_model("all-MiniLM-L6-v2"), "cpu")
    times: dict[str, list[float]] = {"float32": [], "bf16": []}
    for r in range(args.rounds):
        for name in ("float32", "bf16"):
            recipe = dataclasses.replace(DEFAULT, max_steps=2, bf16=name == "bf16")
            c0 = time.process_time()
            st.train(model, texts, pairs[r * 64:], recipe, "cpu", r)
            times[name].append((time.process_time() - c0) / 2)
            print(f"round {r}: {name} {times[name][-1]:.2f} CPU s/step", flush=True)
    med = {k: common.median(v) for k, v in times.items()}
    res = {"cpu_s_per_step": med, "bf16_speedup": med["float32"] / med["bf16"],
           "rounds": times, "batch_size": DEFAULT.batch_size,
           "max_seq_length": DEFAULT.max_seq_length}
    print(json.dumps(res, indent=1))
    common.save_results("bench_adapt_dtype", res)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--collections", default=",".join(ORDER))
    ap.add_argument("--dev", default=",".join(DEV), help="collections used to choose the recipe")
    ap.add_argument("--cache", default=str(common.WORK / "base"),
                    help="prebuilt lexical + dense collections (polyindex index --data DIR -c NAME "
                         "SOURCE), each with a .done file once finished")
    ap.add_argument("--work", default=str(common.WORK / "adapt"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force-small", action="store_true", help="learn below min_docs too")
    ap.add_argument("--dtype-check", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--recipe", default="", help="K=V[,K=V]: the recipe's fields replaced "
                    "(a variant tried on the --dev collections)")
    ap.add_argument("--from-students", default="", help="DIR of students already learnt "
                    "(DIR/NAME): apply --recipe's average to them instead of learning again")
    ap.add_argument("--both-weights", default="0.5,0.25,0.25", help="lexical, base dense, "
                    "adapted dense: the weights of the three-leg fusion scored as convex_both")
    ap.add_argument("--from-student", help=argparse.SUPPRESS)
    ap.add_argument("--learn-child", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.learn_child:
        return learn_child(args)
    if args.dtype_check:
        return dtype_check(args)
    args.dev = common.parse_list(args.dev)
    args.both_weights = [float(w) for w in common.parse_list(args.both_weights)]
    if len(args.both_weights) != 3:
        ap.error(f"--both-weights takes three weights (lexical, base dense, adapted dense), "
                 f"got {len(args.both_weights)}")
    global RUN_TAG
    RUN_TAG = args.recipe.replace("=", "").replace(",", "_") or "default"
    work = Path(args.work)
    results = []
    for name in common.parse_list(args.collections):
        res = one(name, args, work)
        if res is not None:
            results.append(res)
            (work / "partial.json").write_text(json.dumps(results, indent=1, default=float))
    done = [r for r in results if "ndcg10" in r]
    groups = {"used_to_choose": [r for r in done if r["used_to_choose"]],
              "others": [r for r in done if not r["used_to_choose"]]}
    summary = {g: {"collections": [r["collection"] for r in rs],
                   "dense_ratio_mean": float(np.mean([r["dense_ratio"] for r in rs])) if rs else None,
                   "hybrid_ratio_mean": float(np.mean([r["hybrid_ratio"] for r in rs])) if rs else None,
                   "dense_ratio_min": min((r["dense_ratio"] for r in rs), default=None),
                   "hybrid_ratio_min": min((r["hybrid_ratio"] for r in rs), default=None)}
               for g, rs in groups.items()}
    rows = []
    for r in results:
        if "ndcg10" not in r:
            rows.append([r["collection"], r["documents"], r.get("note") or r.get("error"), "", "",
                         "", "", "", "", "", "", ""])
            continue
        n, learned = r["ndcg10"], r["learn"]
        rows.append([r["collection"] + (" (dev)" if r["used_to_choose"] else ""), r["documents"],
                     f"{n['dense']:.4f}", f"{n['dense_adapted']:.4f}", f"{r['dense_ratio']:.3f}",
                     f"{r['dense_test']['t_p']:.3g}", f"{n['hybrid']:.4f} ({n['hybrid_engine']:.4f})",
                     f"{n['hybrid_adapted']:.4f}", f"{r['hybrid_ratio']:.3f}",
                     f"{r['hybrid_test']['t_p']:.3g}", guard_cell(r["guard"]),
                     f"{r['learn_wall_s_per_10k'] / 60:.1f} / {r['learn_cpu_s_per_10k'] / 60:.1f} / "
                     f"{learned['peak_rss_mb']:.0f}"])
    common.console.print(common.table(
        "adapt: nDCG@10 unadapted vs adapted (hybrid: RRF as shipped; engine's own in brackets)",
        ["collection", "docs", "dense", "dense ad.", "ratio", "t p", "hybrid", "hybrid ad.",
         "ratio", "t p", "guard MRR ratio dense / fused: decision",
         "learn min/10k wall / CPU / peak MB"], rows))
    common.console.print(json.dumps(summary, indent=1))
    common.save_results("bench_adapt" + (f"_{RUN_TAG}" if args.recipe else ""),
                        {"results": results, "summary": summary,
                                        "recipe": recipe_arg(args).to_json()})


if __name__ == "__main__":
    main()
