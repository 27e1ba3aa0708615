"""Fusion of per-retriever ranked lists (global, after the segment-local retrieve stages)."""
from __future__ import annotations

import numpy as np


def rrf(keys_per_list: list[np.ndarray], k: int = 60,
        weights: list[float] | None = None, rescale=None) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of ranked key lists (-1 padded): score = sum w / (k + rank),
    w = the list's weight (1 each by default; a weak leg weighted down cannot outvote a
    strong one). ``rescale``: (sorted keys, factor): those keys' sums times factor (the legs
    blind to them abstain: ``query.pruning``)."""
    all_keys, all_scores, all_ranks = [], [], []
    weights = [1.0] * len(keys_per_list) if weights is None else weights
    for keys, w in zip(keys_per_list, weights):
        valid = keys >= 0
        ranks = np.arange(1, len(keys) + 1, dtype=np.float64)
        all_keys.append(keys[valid])
        all_scores.append(w / (k + ranks[valid]))
        all_ranks.append(ranks[valid])
    return _sum_by_key(all_keys, all_scores, all_ranks, rescale)


def weighted(keys_per_list: list[np.ndarray], scores_per_list: list[np.ndarray],
             weights: list[float], rescale=None) -> tuple[np.ndarray, np.ndarray]:
    """Weighted sum of min-max normalized scores (a missing doc contributes 0 for that list;
    ``rescale`` as in ``rrf``)."""
    all_keys, all_scores = [], []
    for keys, scores, w in zip(keys_per_list, scores_per_list, weights):
        valid = keys >= 0
        s = scores[valid].astype(np.float64)
        if len(s):
            lo, hi = s.min(), s.max()
            s = (s - lo) / (hi - lo) if hi > lo else np.ones_like(s)
        all_keys.append(keys[valid])
        all_scores.append(w * s)
    return _sum_by_key(all_keys, all_scores, None, rescale)


def _sum_by_key(all_keys, all_scores, all_ranks=None,
                rescale=None) -> tuple[np.ndarray, np.ndarray]:
    """Unique keys and their summed scores, best first. Equal sums (common in RRF: rank r in
    one list only scores as rank r in another) are ordered by the keys' ranks in the lists, the
    first list first, and only then by key: which of them a window keeps then depends on the
    lists, not on how the rows fell into segments or shards."""
    keys = np.concatenate(all_keys) if all_keys else np.empty(0, np.int64)
    scores = np.concatenate(all_scores) if all_scores else np.empty(0)
    uniq, inverse = np.unique(keys, return_inverse=True)
    total = np.bincount(inverse, weights=scores, minlength=len(uniq))
    if rescale is not None and len(rescale[0]):
        at = np.minimum(np.searchsorted(rescale[0], uniq), len(rescale[0]) - 1)
        total[rescale[0][at] == uniq] *= rescale[1]
    by_rank = []
    if all_ranks is not None:
        at = 0
        for ranks in all_ranks:  # rank of each unique key in this list (absent: after all)
            r = np.full(len(uniq), np.inf)
            r[inverse[at:at + len(ranks)]] = ranks
            by_rank.append(r)
            at += len(ranks)
    order = np.lexsort((uniq, *reversed(by_rank), -total))
    return uniq[order], total[order]
