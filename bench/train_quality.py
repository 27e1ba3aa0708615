"""Train the document quality model of issue 21 part 4 (``rerank/doc_quality.py``).

Label: the document is judged relevant (grade > 0) to at least one query, in any qrels split
of its collection. Features: the cheap query-agnostic estimators the engine computes at
ingest (unique-term ratio, KL divergence from the collection language model, log length),
each collection's language model being its own corpus (as a bulk ingest computes it).
Every collection weighs the same (sample weight 1 / its documents), so npl's 11k documents
do not decide alone. A small LightGBM binary model: ROUNDS trees of LEAVES leaves.

    .venv/bin/python bench/train_quality.py                       # ships rerank/models/quality/
    .venv/bin/python bench/train_quality.py --exclude cisi --out /tmp/q-cisi.txt   # held out

Writes the LightGBM text model and, beside it, ``<model>.json``: how it was trained (the
collections, their documents and positives, parameters, training AUC per collection).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from polyindex.rerank.doc_quality import FEATURES, SHIPPED, LanguageModel, features  # noqa: E402

COLLECTIONS = ["adi", "arguana", "cacm", "cisi", "cranfield", "lisa", "medline", "nfcorpus",
               "npl", "time"]
PARAMS = {"objective": "binary", "num_leaves": 7, "learning_rate": 0.1, "min_data_in_leaf": 50,
          "feature_fraction": 1.0, "bagging_fraction": 1.0, "verbose": -1, "seed": 7,
          "num_threads": 2, "deterministic": True}
ROUNDS = 30


def collection_data(name: str):
    folder = common.data_dir() / name
    ids, titles, texts = common.read_corpus(folder)
    docs = [common.doc_text(t, x) for t, x in zip(titles, texts)]
    relevant = set()
    for split in sorted(p.stem for p in (folder / "qrels").glob("*.tsv")):
        for rels in common.read_qrels(folder, split).values():
            relevant.update(d for d, g in rels.items() if g > 0)
    lm = LanguageModel()
    lm.add(docs)
    X = features(docs, lm)
    y = np.array([i in relevant for i in ids], np.float32)
    return X, y


def train(names: list[str]):
    import lightgbm as lgb
    from sklearn.metrics import roc_auc_score
    parts = {n: collection_data(n) for n in names}
    X = np.concatenate([p[0] for p in parts.values()])
    y = np.concatenate([p[1] for p in parts.values()])
    w = np.concatenate([np.full(len(p[1]), 1.0 / len(p[1])) for p in parts.values()])
    booster = lgb.train(PARAMS, lgb.Dataset(X, y, weight=w * len(parts) * 1000,
                                            feature_name=list(FEATURES)), ROUNDS)
    info = {}
    for n, (Xc, yc) in parts.items():
        auc = roc_auc_score(yc, booster.predict(Xc)) if 0 < yc.sum() < len(yc) else None
        info[n] = {"docs": int(len(yc)), "positives": int(yc.sum()),
                   "train_auc": None if auc is None else round(float(auc), 4)}
    return booster, info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exclude", action="append", default=[], help="leave a collection out")
    ap.add_argument("--out", type=Path, default=SHIPPED)
    args = ap.parse_args()
    names = [n for n in COLLECTIONS if n not in args.exclude
             and common.corpus_file(common.data_dir() / n) is not None]
    booster, info = train(names)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(booster.model_to_string())
    meta = {"label": "judged relevant (grade > 0) in any qrels split", "features": list(FEATURES),
            "collections": info, "excluded": args.exclude, "params": PARAMS, "rounds": ROUNDS,
            "weighting": "each collection weighs the same (1 / its documents)",
            "script": "bench/train_quality.py"}
    args.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(info))


if __name__ == "__main__":
    main()
