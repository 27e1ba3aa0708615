"""Pruning by document quality (issue 21 part 4): nDCG@10 of ``hybrid`` and ``ltr`` at
P = 0, 0.25, 0.30 (``Collection.index(..., prune_quality=P)``), with paired tests over
queries against P = 0, and the encode time and index bytes saved.

Per collection (test qrels), the quality model is trained WITHOUT that collection
(leave-one-collection-out: ``bench/train_quality.py``'s ``train`` on the others), then three
fresh lexical + dense collections are indexed (float32, one segment), one per P. Queries are
encoded once and the same vectors sent to every run. Runs of the top 100 are written as TREC
files and scored with ir-measures (per query, for ``scipy.stats.ttest_rel`` and
``wilcoxon``; a query with no run scores 0). Encode time: seconds inside the collection's
document encoder during the P = 0 ingest (the machine's 2 cores are shared: encoding the
same 82 adi documents took 11 to 49 s from run to run), so the P > 0 runs reuse P = 0's
embeddings and report what the writer asked to encode: documents and characters (the cost
of a MiniLM forward pass grows with the text), with the P = 0 seconds scaled by the
characters' share as the estimate. Embeddings already computed for a corpus (a complete
float32 collection in ``--reuse``, default bench/.work/engine, or this script's
bench/.work/prune/emb/) are reused, and then no encode seconds are reported for it; index bytes: the dense files of the segments (faiss index
and presence mask) and the whole collection folder.

    .venv/bin/python bench/bench_prune.py [--collections adi,time,medline,cranfield,cisi]
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import numpy as np

import polyindex

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import train_quality  # noqa: E402
from common import WORK, console, table  # noqa: E402

PS = (0.0, 0.25, 0.30)
PROFILES = ("hybrid", "ltr")
K = 100
OUT = WORK / "prune"
EMB_CACHE: dict[str, np.ndarray] = {}  # document text -> embedding, across the P runs


def loco_model(name: str) -> Path:
    path = OUT / "models" / f"quality-without-{name}.txt"
    if not path.exists():
        others = [n for n in train_quality.COLLECTIONS if n != name
                  and common.corpus_file(common.data_dir() / n) is not None]
        booster, _ = train_quality.train(others)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(booster.model_to_string())
    return path


def prefill(name: str, reuse: Path | None) -> int:
    """Embeddings of ``name``'s documents from a complete float32 lexical + dense collection
    of the same model in ``reuse`` (bench_quality's engine folder), or from this script's
    own earlier run (``OUT/emb``), so the shared CPUs encode each corpus at most once;
    returns how many were found."""
    from polyindex.types import document_text
    saved = OUT / "emb" / f"{name}.npz"
    if saved.exists():
        with np.load(saved, allow_pickle=False) as z:
            EMB_CACHE.update(zip(z["texts"].tolist(), z["emb"]))
        return len(EMB_CACHE)
    if reuse is None or not (reuse / name / "manifest.json").exists():
        return 0
    src = polyindex.open(reuse, readonly=True).collection(name)
    if src.config.dtype != "float32" or src.config.model != "all-MiniLM-L6-v2":
        return 0
    for seg in src.table.sealed_snapshot().segments:
        rows = np.arange(seg.docs.n_rows)
        texts = [document_text(t, x) for t, x in zip(seg.docs.column("title"),
                                                     seg.docs.column("text"))]
        EMB_CACHE.update(zip(texts, np.asarray(seg.indexes["dense"].vectors(rows), np.float32)))
    return len(EMB_CACHE)


def save_embeddings(name: str) -> None:
    (OUT / "emb").mkdir(parents=True, exist_ok=True)
    texts = list(EMB_CACHE)
    np.savez(OUT / "emb" / f"{name}.npz", texts=np.array(texts, dtype=str),
             emb=np.stack([EMB_CACHE[t] for t in texts]))


def heldout_auc(name: str, model: Path) -> float | None:
    """ROC AUC of the held-out model's quality on ``name`` (label: judged relevant)."""
    from sklearn.metrics import roc_auc_score
    from polyindex.rerank.doc_quality import QualityModel
    X, y = train_quality.collection_data(name)
    if not 0 < y.sum() < len(y):
        return None
    return float(roc_auc_score(y, QualityModel.load(model).predict(X)))


def folder_bytes(folder: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern) if p.is_file())


def build(eng, name: str, p: float, model: Path) -> tuple:
    cname = f"{name}-p{int(round(p * 100)):02d}"
    if cname in eng.list_collections():
        eng.drop_collection(cname)
    coll = eng.create_collection(cname, ["lexical", "dense"], dtype="float32")
    timer = {"s": 0.0, "docs": 0, "chars": 0}
    inner = coll.encoding._encode_docs

    def timed(texts, on_batch=None):
        # What the writer asks to encode is counted (documents, characters); the model runs
        # only for texts not encoded before in this process (P = 0 encodes everything first)
        timer["docs"] += len(texts)
        timer["chars"] += sum(len(t) for t in texts)
        missing = [t for t in dict.fromkeys(texts) if t not in EMB_CACHE]
        if missing:
            t0 = time.perf_counter()
            EMB_CACHE.update(zip(missing, inner(missing, None)))
            timer["s"] += time.perf_counter() - t0
        if on_batch is not None:
            on_batch(len(texts))
        return np.stack([EMB_CACHE[t] for t in texts]) if texts else np.zeros((0, 384), np.float32)

    coll.encoding._encode_docs = timed  # what the writer's encode calls (``document_encoder``)
    t0 = time.perf_counter()
    coll.index(common.data_dir() / name, prune_quality=p or None, quality_model=model)
    index_s = time.perf_counter() - t0
    folder = eng.path / cname
    pruned = sum(0 if s.docs.pruned() is None else int(s.docs.pruned().sum())
                 for s in coll.table.sealed_snapshot().segments)
    return coll, {"index_s": index_s, "encode_s": timer["s"], "encoded": timer["docs"],
                  "encoded_chars": timer["chars"],
                  "pruned": pruned, "docs": coll.count(),
                  "dense_bytes": folder_bytes(folder / "segments", "dense*"),
                  "bytes": folder_bytes(folder)}


def per_query(coll, qs, vectors, qrels, profile: str, tag: str) -> dict[str, float]:
    run = {}
    for start in range(0, len(qs), 64):
        part = qs[start:start + 64]
        hits = coll.query_batch([t for _, t in part], vectors=vectors[start:start + 64], k=K,
                                profile=profile)
        run.update({q: [(h.id, h.score) for h in hs] for (q, _), hs in zip(part, hits)})
    path = OUT / "runs" / f"{tag}.trec"
    common.write_trec(path, run, tag)
    return common.per_query_trec(path, qrels)["nDCG@10"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collections", default="adi,cranfield,cisi,time,medline")
    ap.add_argument("--reuse", type=Path, default=common.ENGINE_DATA,
                    help="engine folder whose float32 collections' embeddings are reused")
    ap.add_argument("--control", choices=["model", "random"], default="model",
                    help="random: a control whose 'quality' is a hash of the text (uniform, "
                         "deterministic), to see what the learned estimate adds")
    args = ap.parse_args()
    if args.control == "random":
        import hashlib
        from polyindex.rerank import doc_quality

        def random_quality(self, texts):
            return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=4).digest(),
                                            "little") / 2 ** 32 for t in texts], np.float32)
        doc_quality.Gate.quality = random_quality
        global OUT
        OUT = WORK / "prune-random"
        if not OUT.exists():
            OUT.mkdir(parents=True)
            shutil.copytree(WORK / "prune" / "emb", OUT / "emb")
            shutil.copytree(WORK / "prune" / "models", OUT / "models")
    import torch
    torch.set_num_threads(2)
    data = OUT / "data"
    shutil.rmtree(data, ignore_errors=True)
    eng = polyindex.open(data)
    from polyindex.encode.text import get_encoder
    get_encoder("all-MiniLM-L6-v2", "float32").encode(["warm up the model"] * 8)  # not timed
    results, rows = {}, []
    for name in common.parse_list(args.collections):
        folder = common.collection_folder(name)
        if folder is None:
            continue
        model = loco_model(name)
        qrels = common.read_qrels(folder, "test")
        qs = common.judged(common.read_queries(folder), qrels)
        res = results[name] = {"queries": len(qs), "model": str(model.relative_to(WORK)), "P": {},
                               "heldout_auc": heldout_auc(name, model)}
        vectors = None
        base = {}
        res["embeddings_reused"] = prefill(name, args.reuse)
        for p in PS:
            coll, info = build(eng, name, p, model)
            if vectors is None:
                save_embeddings(name)
                vectors = coll.encoder.encode([t for _, t in qs], chunk=256)
            info["ndcg10"], info["tests"] = {}, {}
            for prof in PROFILES:
                s = per_query(coll, qs, vectors, qrels, prof, f"{name}.p{p:.2f}.{prof}")
                info["ndcg10"][prof] = float(np.mean(list(s.values())))
                if p == 0:
                    base[prof] = s
                else:
                    info["tests"][prof] = common.paired(base[prof], s)
            res["P"][f"{p:.2f}"] = info
            b0 = res["P"]["0.00"]
            console.print(f"[dim]{name} P={p:.2f}: {info}[/dim]")
            rows.append([name, f"{p:.2f}", info["pruned"], *(
                f"{info['ndcg10'][pr]:.4f}" + ("" if p == 0 else
                                                f" (t p={info['tests'][pr]['t_p']:.3f}, "
                                                f"W p={info['tests'][pr]['wilcoxon_p']:.3f})")
                for pr in PROFILES),
                f"{info['encoded']} docs, {info['encoded_chars'] / b0['encoded_chars']:.0%} of "
                f"the text (~{info['encoded_chars'] / b0['encoded_chars'] * b0['encode_s']:.0f}s)"
                if p else f"{info['encoded']} docs, " + (
                    f"{info['encode_s']:.0f}s" if not res["embeddings_reused"] else "reused"),
                f"{info['dense_bytes'] / 1e6:.2f} MB ({info['dense_bytes'] / b0['dense_bytes'] - 1:+.0%})"
                if p else f"{info['dense_bytes'] / 1e6:.2f} MB"])
            eng.drop_collection(coll.name)
        EMB_CACHE.clear()
        common.save_results("bench_prune" + ("" if args.control == "model" else "_random"),
                            {"profiles": PROFILES, "P": PS, "k": K, "control": args.control,
                             "collections": results, "partial": True})
    console.print(table("Pruning by quality: nDCG@10 (test qrels; paired tests vs P=0), encode "
                        "time and dense bytes (saved)",
                        ["collection", "P", "pruned", "hybrid", "ltr", "encode", "dense index"],
                        rows))
    common.save_results("bench_prune" + ("" if args.control == "model" else "_random"),
                        {"profiles": PROFILES, "P": PS, "k": K, "control": args.control,
                         "collections": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
