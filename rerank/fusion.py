"""Fusion of per-retriever ranked lists (global, after the segment-local retrieve stages)."""
from __future__ import annotations

import numba
import numpy as np


def rrf(keys_per_list: list[np.ndarray], k: int = 60,
        weights: list[float] | None = None, rescale=None,
        keep: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Reciprocal rank fusion of ranked key lists (-1 padded): score = sum w / (k + rank),
    w = the list's weight (1 each by default; a weak leg weighted down cannot outvote a
    strong one). ``rescale``: (sorted keys, factor): those keys' sums times factor (the legs
    blind to them abstain: ``query.pruning``). ``keep``: only the best ``keep`` are wanted
    (the answer is the full one's first ``keep``): without ``rescale``, and ``keep`` small
    beside the keys, one kernel call (``_rrf_top``) instead of numpy's sorts."""
    weights = [1.0] * len(keys_per_list) if weights is None else weights
    if keep is not None and (rescale is None or not len(rescale[0])) and keys_per_list:
        total = sum(len(kk) for kk in keys_per_list)
        if keep * 4 <= total:  # else the insertion into the kept places costs more
            starts = np.cumsum([0] + [len(kk) for kk in keys_per_list])
            return _rrf_top(np.concatenate(keys_per_list).astype(np.int64, copy=False),
                            starts, np.asarray(weights, np.float64), float(k), keep)
    all_keys, all_scores, all_ranks = [], [], []
    for keys, w in zip(keys_per_list, weights):
        valid = keys >= 0
        ranks = np.arange(1, len(keys) + 1, dtype=np.float64)
        all_keys.append(keys[valid])
        all_scores.append(w / (k + ranks[valid]))
        all_ranks.append(ranks[valid])
    keys, sums = _sum_by_key(all_keys, all_scores, all_ranks, rescale)
    return (keys, sums) if keep is None else (keys[:keep], sums[:keep])


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


def adapted_weights(weights: list[float], at: int, scores: np.ndarray, slope: float,
                    centre: float) -> list[float]:
    """One query's weights of a convex fusion, moved by how peaked list ``at`` is (``scores``:
    its valid scores, best first): its weight becomes ``w + slope * (peak(scores) - centre)``,
    clipped to [0.05, 0.95] of the total, and the other lists share the rest in their
    proportions (the total is kept). A dense list whose top stands out from the rest earns
    it more say (bench/bench_loco_floor.py, docs/notes/default-profile.md)."""
    total = float(sum(weights))
    if total <= 0:
        return list(weights)
    w_at = float(np.clip(weights[at] + slope * (peak(scores) - centre),
                         0.05 * total, 0.95 * total))
    rest = total - weights[at]
    scale = (total - w_at) / rest if rest > 0 else 0.0
    return [w_at if i == at else float(w) * scale for i, w in enumerate(weights)]


PEAK_TOP, PEAK_OVER = 10, 100


def peak(scores: np.ndarray) -> float:
    """The mean of a ranked list's top ``PEAK_TOP`` scores, min-max normalized over its first
    ``PEAK_OVER`` (1: the top stands far above the rest; an empty list: 0)."""
    s = np.asarray(scores, np.float64)[:PEAK_OVER]
    if not len(s):
        return 0.0
    lo, hi = s.min(), s.max()
    return float(((s[:PEAK_TOP] - lo) / (hi - lo)).mean()) if hi > lo else 1.0


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


@numba.njit(cache=True, nogil=True)
def _rrf_top(keys, starts, weights, k, keep):
    """``rrf``'s best ``keep`` (keys, sums), with its arithmetic and order: list ``l`` is
    ``keys[starts[l]:starts[l + 1]]``; a key's sum adds w / (k + rank) in list order from
    0.0, as ``np.bincount`` does (the same float64 bits); the order is ``_sum_by_key``'s
    (sum desc, then the rank in each list in list order, absent last, then key), the best
    ``keep`` kept by insertion into a sorted window."""
    n_lists = len(starts) - 1
    n = len(keys)
    cap = 16
    while cap < 2 * n:
        cap *= 2
    table = np.full(cap, -1, np.int64)  # open addressing: slot -> unique key's place
    uniq = np.empty(n, np.int64)
    total = np.zeros(n, np.float64)
    ranks = np.full((n, n_lists), np.inf)
    u = 0
    for li in range(n_lists):
        w = weights[li]
        for p in range(starts[li], starts[li + 1]):
            key = keys[p]
            if key < 0:
                continue
            h = (key * 2654435761) & (cap - 1)
            while True:
                at = table[h]
                if at < 0:
                    at = u
                    table[h] = u
                    uniq[u] = key
                    u += 1
                    break
                if uniq[at] == key:
                    break
                h = (h + 1) & (cap - 1)
            r = float(p - starts[li] + 1)
            total[at] += w / (k + r)
            ranks[at, li] = r
    m = min(keep, u)
    best = np.empty(m, np.int64)
    filled = 0
    for a in range(u):
        if filled == m:
            if not _before(a, best[m - 1], total, ranks, uniq, n_lists):
                continue
            j = m - 1
        else:
            j = filled
            filled += 1
        while j > 0 and _before(a, best[j - 1], total, ranks, uniq, n_lists):
            best[j] = best[j - 1]
            j -= 1
        best[j] = a
    return uniq[best], total[best]


@numba.njit(cache=True, nogil=True, inline="always")
def _before(a, b, total, ranks, uniq, n_lists):
    """Does unique key ``a`` come before ``b`` in ``_sum_by_key``'s order?"""
    if total[a] != total[b]:
        return total[a] > total[b]
    for li in range(n_lists):
        if ranks[a, li] != ranks[b, li]:
            return ranks[a, li] < ranks[b, li]
    return uniq[a] < uniq[b]
