"""Pseudo-relevance feedback and tuned BM25 (issue 21): what they gain over the defaults.

Per collection (qrels split ``test``, judged queries only, ir-measures on TREC runs through
``polyindex eval``, k=1000):

- **RM3**: ``polyindex eval --profile lexical --profile lexical-prf`` on a lexical-only
  collection (``bench/.work/lexical/<name>``, built by ``polyindex index --index lexical``);
- **tune-bm25**: ``polyindex tune-bm25 --folds 5 --no-store`` on the same collection: the
  default scorer's nDCG@10 against the 5-fold cross-validated one (each fold scored with the
  setting that is best on the other four; never train-on-test);
- **Rocchio** (``--dense``, small collections only: MiniLM encoding is slow on CPU):
  ``polyindex eval --profile dense --profile dense-prf --profile hybrid --profile hybrid-prf``
  on the lexical + dense collection of bench_quality (``bench/.work/engine/<name>``).

With ``--rm3-grid``, RM3's ``orig_weight`` {0.5, 0.7, 0.8} x Anserini's per-document cut
(``fb_doc_terms`` 0 or 10) on every collection, and the setting each collection gets when it is
chosen on the *other* collections (leave-one-collection-out: how the default was picked).

Usage: ``python bench/bench_prf.py [--collections cranfield,adi] [--no-tune] [--dense] [--rm3-grid]``
(default: the ten shared collections; ``--dense`` on cranfield, cisi, medline, adi, cacm,
nfcorpus unless ``--dense-collections`` says otherwise). Results: bench/results/bench_prf.json.
"""
from __future__ import annotations

import argparse
import shutil

from common import (DATA, WORK, collection_folder, console, ensure_collection, parse_list,
                    run_cli, save_results, table)

ALL = ("cranfield", "nfcorpus", "arguana", "cisi", "medline", "npl", "cacm", "lisa", "time",
       "adi")
SMALL = ("cranfield", "cisi", "medline", "adi", "cacm", "nfcorpus")
LEXICAL_DATA = WORK / "lexical"


def lexical_collection(name: str, fresh: bool) -> None:
    folder = LEXICAL_DATA / name
    if folder.exists() and not fresh:
        info, _ = run_cli(["info", "--data", LEXICAL_DATA, "--collection", name, "--json"])
        if (info.get("ingest") or {}).get("done"):
            return
    if folder.exists():
        shutil.rmtree(folder)
    run_cli(["index", DATA / name, "--data", LEXICAL_DATA, "--collection", name,
             "--index", "lexical", "--no-progress", "--json"])


def evaluate(data, name: str, profiles) -> dict:
    args = ["eval", "--data", data, "--collection", name, "--queries", DATA / name,
            "--qrels", DATA / name / "qrels" / "test.tsv", "--json"]
    for p in profiles:
        args += ["--profile", p]
    payload, wall = run_cli(args)
    return {"queries": payload["queries"], "results": payload["results"], "seconds": round(wall, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default=",".join(ALL))
    ap.add_argument("--no-tune", action="store_true")
    ap.add_argument("--dense", action="store_true", help="also Rocchio / hybrid-prf")
    ap.add_argument("--dense-collections", default=",".join(SMALL))
    ap.add_argument("--fresh", action="store_true")
    ap.add_argument("--rm3-grid", action="store_true", help="RM3 settings, leave-one-collection-out")
    args = ap.parse_args()
    names = [n for n in parse_list(args.collections) if collection_folder(n) is not None]
    out: dict = {"rm3": {}, "tune": {}, "dense": {}}
    for name in names:
        lexical_collection(name, args.fresh)
        out["rm3"][name] = evaluate(LEXICAL_DATA, name, ["lexical", "lexical-prf"])
        if not args.no_tune:
            report, wall = run_cli(["tune-bm25", "--data", LEXICAL_DATA, "--collection", name,
                                    "--queries", DATA / name, "--qrels",
                                    DATA / name / "qrels" / "test.tsv", "--folds", "5",
                                    "--no-store", "--json"])
            out["tune"][name] = {**report, "seconds": round(wall, 1)}
        console.print(f"[dim]{name} done[/dim]")
    rows = []
    for name in names:
        r = out["rm3"][name]["results"]
        t = out["tune"].get(name, {}).get("cross_validation")
        rows.append([name, out["rm3"][name]["queries"], f"{r['lexical']['nDCG@10']:.4f}",
                     f"{r['lexical-prf']['nDCG@10']:.4f}",
                     f"{r['lexical-prf']['nDCG@10'] - r['lexical']['nDCG@10']:+.4f}",
                     f"{r['lexical']['MAP']:.4f}", f"{r['lexical-prf']['MAP']:.4f}",
                     "-" if t is None else f"{t['default']:.4f}",
                     "-" if t is None else f"{t['tuned']:.4f}",
                     "-" if t is None else f"{t['tuned'] - t['default']:+.4f}",
                     "-" if t is None else out["tune"][name]["tuned"]["params"]])
    console.print(table("lexical vs RM3 (lexical-prf) and default vs tuned BM25 (5-fold CV "
                        "held-out nDCG@10)",
                        ["collection", "queries", "lexical", "lexical-prf", "delta",
                         "MAP lex", "MAP prf", "bm25 default", "tuned (CV)", "delta",
                         "stored setting (all queries)"], rows))
    if args.rm3_grid:
        out["rm3_grid"] = rm3_grid(names, {n: out["rm3"][n]["results"]["lexical"]["nDCG@10"]
                                           for n in names})
    if args.dense:
        dense_names = [n for n in parse_list(args.dense_collections) if n in names
                       or collection_folder(n) is not None]
        profiles = ["dense", "dense-prf", "hybrid", "hybrid-prf"]
        for name in dense_names:
            n_docs = sum(1 for _ in _lines(DATA / name))
            ensure_collection(name, DATA / name, n_docs)
            from common import ENGINE_DATA
            out["dense"][name] = evaluate(ENGINE_DATA, name, profiles)
        rows = [[name, *(f"{out['dense'][name]['results'][p]['nDCG@10']:.4f}" for p in profiles)]
                for name in dense_names]
        console.print(table("Rocchio (dense-prf) and hybrid-prf, nDCG@10", ["collection",
                            *profiles], rows))
    save_results("bench_prf", out)


RM3_GRID = [f"prf=rm3,orig_weight={w},fb_doc_terms={c}" for c in (0, 10) for w in (0.5, 0.7, 0.8)]


def rm3_grid(names, lexical: dict[str, float]) -> dict:
    """nDCG@10 of each RM3 setting (TREC runs of the engine scored with ir-measures, as
    ``polyindex eval``), then leave-one-collection-out: the setting with the best mean gain
    over lexical on the other collections, scored on the one left out."""
    import tempfile
    from pathlib import Path

    import polyindex
    from polyindex.cli.evaluate import evaluate_run, run_queries, write_trec
    from polyindex.ingest.sources import read_qrels, read_queries
    scores: dict[str, dict[str, float]] = {}
    for name in names:
        coll = polyindex.open(LEXICAL_DATA).collection(name)
        qrels = read_qrels(DATA / name / "qrels" / "test.tsv")
        qs = [(q, t) for q, t in read_queries(DATA / name) if q in qrels]
        scores[name] = {}
        for params in RM3_GRID:
            profile = {"retrieve": [{"index": "lexical", "k": 1000, "params": params}]}
            run = run_queries(coll, qs, profile=profile, k=1000)
            with tempfile.TemporaryDirectory() as tmp:
                write_trec(Path(tmp) / "run.trec", run, "rm3")
                scores[name][params] = evaluate_run(Path(tmp) / "run.trec", qrels)["nDCG@10"]
    loco = {}
    for name in names:
        others = [n for n in names if n != name]
        pick = max(RM3_GRID, key=lambda p: sum(scores[n][p] - lexical[n] for n in others))
        loco[name] = {"setting": pick, "nDCG@10": scores[name][pick], "lexical": lexical[name]}
    rows = [[n, f"{lexical[n]:.4f}", *(f"{scores[n][p]:.4f}" for p in RM3_GRID),
             loco[n]["setting"].replace("prf=rm3,", ""), f"{loco[n]['nDCG@10']:.4f}"]
            for n in names]
    console.print(table("RM3 settings, nDCG@10 (w = orig_weight, cut = fb_doc_terms), and the "
                        "leave-one-collection-out pick",
                        ["collection", "lexical",
                         *(p.replace("prf=rm3,orig_weight=", "w=").replace(",fb_doc_terms=", " cut=")
                           for p in RM3_GRID), "LOCO pick", "LOCO nDCG@10"], rows))
    return {"scores": scores, "loco": loco}


def _lines(folder):
    from common import corpus_file, _open_text
    with _open_text(corpus_file(folder)) as f:
        for line in f:
            if line.strip():
                yield line


if __name__ == "__main__":
    main()
