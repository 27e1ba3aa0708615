"""The rerank stage of a rank profile: features of the fused top window, ordered by a ranker.

Called by ``polyindex.query.pipeline.run`` when a profile has a ``rerank`` section
(``{"model": NAME, "window": W}``); see ``registry`` for how NAME is found.
"""
from __future__ import annotations

import math

import numpy as np

from polyindex.rerank import features, registry


def rerank(snapshot, queries, candidates, stage_lists, stage_names, spec, explain, blind=None):
    """Per query: (keys best first, model scores, details or None).

    ``candidates`` are per query (keys, fused scores) already cut to the window; details (with
    ``explain``) give each returned key its fused score, model score, features and the model's
    per-feature contributions (LightGBM pred_contrib; ``bias``: the trees' expected value;
    ``prior``: the weighted RRF score boosting started from), which sum to the model score.
    """
    ranker = registry.resolve(snapshot, spec["model"])
    if ranker.falls_back() and not explain:
        # the guard weighs the trees 0: the score is the prior, the fused score itself
        # (ties keep the fused order), so no feature is computed
        return [(np.asarray(keys), ranker.prior_weight * np.asarray(fused, np.float64), None)
                for keys, fused in candidates]
    names = features.names(snapshot)
    ranker.check_names(names)
    X, qptr = features.compute(snapshot, queries, candidates, stage_lists, stage_names, blind)
    return order(ranker, X, qptr, candidates, names, explain)


def order(ranker, X, qptr, candidates, names, explain):
    """Each query's candidates ordered by the ranker's scores of their feature rows."""
    scores = ranker.predict(X, qptr) if len(X) else np.zeros(0)
    cnames, contrib = ranker.contributions(X, qptr) if explain and len(X) else ([], None)
    out = []
    for qi, (keys, fused) in enumerate(candidates):
        lo, hi = int(qptr[qi]), int(qptr[qi + 1])
        s = scores[lo:hi]
        order = np.argsort(-s, kind="stable")  # ties keep the fused order
        details = None
        if explain:
            details = [_detail(float(fused[i]), float(s[i]), X[lo + i],
                               None if contrib is None else contrib[lo + i], cnames, names)
                       for i in order.tolist()]
        out.append((np.asarray(keys)[order], s[order], details))
    return out


def _detail(fused: float, score: float, x: np.ndarray, contrib, cnames, names) -> dict:
    values = x.tolist()
    return {"fused_score": fused, "model_score": score,
            "features": {n: (None if math.isnan(v) else v) for n, v in zip(names, values)},
            "contributions": {} if contrib is None else dict(zip(cnames, contrib.tolist()))}
