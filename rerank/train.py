"""Training rankers: judged candidates and their features, LightGBM lambdarank.

The candidates come from ``polyindex.query.candidates.collect`` (the query pipeline up to the
rerank stage, so a model sees at training time what it will see when it serves). ``fit``
trains LightGBM ``lambdarank`` deterministically (fixed seed, ``deterministic=True``, few
threads) with early stopping on validation queries.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from polyindex.errors import InvalidArgument
from polyindex.rerank import schema
from polyindex.rerank.ltr import Ranker, new_meta
from polyindex.rerank.ltr import transform as apply_transform

PARAMS = {"objective": "lambdarank", "metric": "ndcg", "ndcg_eval_at": [10],
          "learning_rate": 0.1, "num_leaves": 15, "min_data_in_leaf": 50, "lambda_l2": 10.0,
          "feature_fraction": 0.8, "lambdarank_truncation_level": 10, "seed": 0,
          "deterministic": True, "force_row_wise": True, "num_threads": 1, "verbose": -1}
MAX_ROUNDS = 1000
PATIENCE = 50
# Boosting starts from PRIOR x the RRF score (LightGBM init_score), so the trees learn
# corrections to the fused order: with few training queries a model stays near hybrid
# instead of overfitting away from it (5-fold CV on cisi, medline, npl: better than 0).
PRIOR = 100.0


@dataclass
class Candidates:
    """Judged queries' candidate windows: features, labels, ids (rows grouped by query)."""

    qids: list[str]
    X: np.ndarray                    # (n, len(names)) float32
    qptr: np.ndarray                 # (nq + 1,) int64
    labels: np.ndarray               # (n,) float32, graded relevance (unjudged = 0)
    doc_ids: list[str]
    fused: np.ndarray                # (n,) the profile's fused score (its own order)
    meta: dict = field(default_factory=dict)
    names: tuple = schema.NAMES      # the columns of X (``schema.names_for`` the collection)

    def subset(self, keep: Sequence[int]) -> "Candidates":
        keep = list(keep)
        rows = np.concatenate([np.arange(self.qptr[i], self.qptr[i + 1]) for i in keep]) \
            if keep else np.zeros(0, np.int64)
        sizes = np.diff(self.qptr)[keep] if keep else np.zeros(0, np.int64)
        return Candidates([self.qids[i] for i in keep], self.X[rows],
                          np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                          self.labels[rows], [self.doc_ids[r] for r in rows.tolist()],
                          self.fused[rows], dict(self.meta), self.names)

    @staticmethod
    def concat(parts: Sequence["Candidates"]) -> "Candidates":
        names = {p.names for p in parts}
        if len(names) > 1:
            raise InvalidArgument("candidates of collections with different named vector fields "
                                  f"cannot train one ranker: {sorted(set().union(*names) - set(schema.NAMES))}")
        sizes = np.concatenate([np.diff(p.qptr) for p in parts])
        return Candidates([q for p in parts for q in p.qids], np.vstack([p.X for p in parts]),
                          np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                          np.concatenate([p.labels for p in parts]),
                          [d for p in parts for d in p.doc_ids],
                          np.concatenate([p.fused for p in parts]), {},
                          parts[0].names if parts else schema.NAMES)

    def run(self, scores: np.ndarray | None = None) -> dict[str, list[tuple[str, float]]]:
        """A run (qid -> [(doc id, score)] best first): by ``scores``, or the fused order."""
        out = {}
        for i, qid in enumerate(self.qids):
            lo, hi = self.qptr[i], self.qptr[i + 1]
            s = self.fused[lo:hi] if scores is None else scores[lo:hi]
            order = np.argsort(-s, kind="stable") + lo
            out[qid] = [(self.doc_ids[j], float(scores[j] if scores is not None
                                                else self.fused[j])) for j in order.tolist()]
        return out


def split_queries(n: int, frac: float = 0.2, seed: int = 0) -> tuple[list[int], list[int]]:
    """A deterministic query-level split: (train, valid) query indexes."""
    perm = np.random.default_rng(seed).permutation(n)
    n_valid = max(1, int(round(n * frac))) if n > 1 else 0
    return sorted(perm[n_valid:].tolist()), sorted(perm[:n_valid].tolist())


def _useful(c: Candidates) -> Candidates:
    """Queries with a relevant candidate (the others teach nothing, and inflate nDCG)."""
    return c.subset([i for i in range(len(c.qids))
                     if c.qptr[i + 1] - c.qptr[i] > 1 and c.labels[c.qptr[i]:c.qptr[i + 1]].any()])


def _dataset(parts: Sequence[Candidates], tf: str, prior: float, *, general: bool,
             reference=None, prior_feature: str = "rrf"):
    """A LightGBM dataset; ``general``: binary labels (collections grade differently) and
    every collection (part) weighing the same whatever its number of queries."""
    import lightgbm as lgb

    from polyindex.rerank.schema import INDEX
    parts = [_useful(p) for p in parts]
    if general:  # the general ranker sees no per-field feature: collections may differ there
        parts = [replace(p, X=p.X[:, :len(schema.NAMES)], names=schema.NAMES) for p in parts]
    c = Candidates.concat(parts)
    names = c.names
    weight = None
    if general:
        for n in schema.GENERAL_UNSEEN:  # all NaN: no tree splits on it (vstack made a copy)
            c.X[:, INDEX[n]] = np.nan
        weight = np.concatenate([np.full(len(p.labels), 1.0 / max(len(p.qids), 1)) for p in parts])
        weight *= len(weight) / weight.sum()
    labels = (c.labels > 0).astype(np.float32) if general else c.labels
    init = prior * c.X[:, INDEX[prior_feature]].astype(np.float64) if prior else None
    return lgb.Dataset(apply_transform(tf, c.X, c.qptr, names), labels, weight=weight,
                       group=np.diff(c.qptr), init_score=init, reference=reference,
                       free_raw_data=True), len(c.qids)


def fit(train: Candidates | Sequence[Candidates], valid, *, transform: str = "raw+query",
        params: dict | None = None, max_rounds: int = MAX_ROUNDS, prior: float | None = None,
        general: bool = False, prior_feature: str = "rrf", **summary) -> Ranker:
    """Train a lambdarank model; early stopping on ``valid`` (none: ``max_rounds`` rounds).

    ``train``/``valid`` are Candidates, or lists of them (one per collection) with
    ``general=True``: the general ranker's binary labels and equal collection weights.
    ``prior_feature``: the score boosting starts from (x ``prior``): ``rrf``, or
    ``fused_score`` (the candidates' profile's own fusion, weights included).
    """
    import lightgbm as lgb
    params = {**PARAMS, **(params or {})}
    prior = PRIOR if prior is None else prior
    as_list = (lambda x: list(x) if isinstance(x, (list, tuple)) else [x])
    dtrain, n_train = _dataset(as_list(train), transform, prior, general=general,
                               prior_feature=prior_feature)
    if n_train == 0:
        raise InvalidArgument("no training query has a relevant document among its candidates")
    callbacks, valid_sets = [], []
    n_valid = 0
    if valid is not None:
        dvalid, n_valid = _dataset(as_list(valid), transform, prior, general=general,
                                   reference=dtrain, prior_feature=prior_feature)
        if n_valid:
            valid_sets = [dvalid]
            callbacks = [lgb.early_stopping(PATIENCE, verbose=False)]
    booster = lgb.train(params, dtrain, num_boost_round=max_rounds, valid_sets=valid_sets,
                        callbacks=callbacks)
    best = booster.best_iteration or booster.current_iteration()
    valid_ndcg = (booster.best_score.get("valid_0") or {}).get("ndcg@10")
    booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=best))
    names = as_list(train)[0].names
    meta = new_meta(transform, prior, names, prior_feature=prior_feature, rounds=int(best),
                    train_queries=n_train, valid_queries=n_valid,
                    valid_ndcg10=None if valid_ndcg is None else float(valid_ndcg),
                    params={k: v for k, v in params.items() if k != "verbose"}, **summary)
    return Ranker(booster, meta)
