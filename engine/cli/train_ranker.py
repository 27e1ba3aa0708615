"""``polyindex train-ranker``: read queries and qrels, collect candidates, train, store.

One model can be trained over several collections (``--collection/--queries/--qrels`` given
once per collection, in the same order); it is stored in each of them with a rank profile of
its name. Without ``--valid`` qrels, 20% of each collection's training queries (a fixed,
query-level split) are held out for early stopping. ``--transform general`` trains like the
shipped general ranker (rank-normalized transferable features, binary labels, collections
weighing the same).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from polyindex.errors import InvalidArgument
from polyindex.query.candidates import collect, store
from polyindex.rerank import schema
from polyindex.rerank.ltr import TRANSFORMS
from polyindex.rerank.train import Candidates, fit, split_queries


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def train_command(eng, collections: Sequence[str], queries: Sequence[Path], qrels: Sequence[Path],
                  valid: Sequence[Path] | None, *, name: str, window: int, profile: str,
                  transform: str, log_features: Path | None, progress: bool = True,
                  say: Callable[[str], None] = _say) -> dict:
    from polyindex.config import validate_name
    from polyindex.ingest.sources import read_qrels, read_queries
    say = say if progress else (lambda _m: None)
    n = len(collections)
    if len(queries) != n or len(qrels) != n or (valid and len(valid) != n):
        raise InvalidArgument(f"give one --queries, one --qrels (and one --valid, if any) per "
                              f"--collection: got {n} collections, {len(queries)} queries, "
                              f"{len(qrels)} qrels, {len(valid or [])} valid")
    validate_name(name, "ranker")
    if not 1 <= window <= 10_000:
        raise InvalidArgument(f"--window must be in 1..10000, got {window}")
    if transform not in TRANSFORMS:
        raise InvalidArgument(f"--transform must be one of {', '.join(TRANSFORMS)}")
    colls = [eng.collection(c) for c in collections]
    trains, valids = [], []
    for i, coll in enumerate(colls):
        qs = read_queries(queries[i])
        tr = read_qrels(qrels[i])
        train_q = [(q, t) for q, t in qs if q in tr]
        if not train_q:
            raise InvalidArgument(f"no query in {queries[i]} has judgements in {qrels[i]}")
        say(f"{coll.name}: candidates and features of {len(train_q)} training queries ...")
        c_train = collect(coll, train_q, tr, profile=profile, window=window)
        if valid:
            va = read_qrels(valid[i])
            valid_q = [(q, t) for q, t in qs if q in va and q not in tr]
            if not valid_q:
                raise InvalidArgument(f"no query in {queries[i]} has judgements in {valid[i]} "
                                      f"(that are not training queries)")
            say(f"{coll.name}: ... and of {len(valid_q)} validation queries")
            c_valid = collect(coll, valid_q, va, profile=profile, window=window)
        else:
            keep, held = split_queries(len(c_train.qids))
            c_train, c_valid = c_train.subset(keep), c_train.subset(held)
        _check_judged(coll.name, c_train, "training", qrels[i], profile, window)
        _check_judged(coll.name, c_valid, "validation", valid[i] if valid else qrels[i],
                      profile, window)
        trains.append(c_train)
        valids.append(c_valid)
    retrieve = trains[0].meta["retrieve"]
    say(f"training LightGBM lambdarank ({transform} features, window {window}) ...")
    ranker = fit(trains, valids, transform=transform, general=transform == "general",
                 collections=list(collections), window=window, profile=profile)
    if log_features is not None:
        write_features(log_features, {"train": Candidates.concat(trains),
                                      "valid": Candidates.concat(valids)})
    for coll in colls:
        store(coll, name, ranker, window=window, retrieve=retrieve)
    return {"name": name, "collections": list(collections), "rounds": ranker.meta["rounds"],
            "train_queries": ranker.meta["train_queries"],
            "valid_queries": ranker.meta["valid_queries"],
            "valid_ndcg10": ranker.meta["valid_ndcg10"], "transform": transform,
            "features": len(ranker.meta["features"]), "schema_version": schema.VERSION}


def _check_judged(collection: str, c: Candidates, split: str, qrels: Path, profile: str,
                  window: int) -> None:
    """A split must hold a query with a judged-relevant candidate: without one in training
    there is nothing to learn, without one in validation no early stopping (LightGBM would
    run every round and report no score)."""
    if not c.qids:
        raise InvalidArgument(f"{collection}: no {split} queries (one judged training query "
                              "leaves none to hold out for early stopping): give --valid QRELS")
    useful = sum(1 for i in range(len(c.qids)) if c.labels[c.qptr[i]:c.qptr[i + 1]].any())
    if useful == 0:
        raise InvalidArgument(
            f"{collection}: none of the {len(c.qids)} {split} queries has a relevant document "
            f"(judged > 0 in {qrels}) among its top {window} {profile} candidates; check that "
            "the qrels are this collection's (query and document ids) or widen --window")


def write_features(path: Path, parts: dict[str, Candidates]) -> None:
    """Feature log: one row per (query, candidate) with qid, doc id, label, split, features."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    tables = []
    for split, c in parts.items():
        qids = np.repeat(np.array(c.qids, dtype=object), np.diff(c.qptr))
        cols = {"split": pa.array([split] * len(c.doc_ids)), "qid": pa.array(qids.tolist(), pa.string()),
                "doc_id": pa.array(c.doc_ids, pa.string()), "label": pa.array(c.labels),
                "fused_score": pa.array(c.fused)}
        cols.update({n: pa.array(c.X[:, i]) for i, n in enumerate(c.names)})
        tables.append(pa.table(cols))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.concat_tables(tables), str(path))
