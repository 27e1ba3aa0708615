"""Equal scores put in document id order, so which row of a document comes first (its
segment, its shard) never decides a ranking, nor which members of a run of equal scores
straddling the k-th place make the top k (docs/notes/segmentation-independence.md)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Past this many tied keys their ids are sorted in Arrow (C++), not as Python strings: a
# lexical top-1000 over generated text tied ~870 rows a query, and reading them as Python
# strings took over half of a hybrid query (bench_scale).
ARROW_TIES = 64


def order_ties(scores: np.ndarray, keys: np.ndarray, ids_of, id_array=None,
               id_ranks=None) -> np.ndarray:
    """``keys`` with each run of equal scores put in id order (a copy when any moved): which
    row of a document comes first (its segment, its shard) then never decides the order, nor
    the ranks and fused lists computed from it. ``ids_of(keys) -> ids``, asked only for keys
    that tie; ``id_array(keys) -> pa.Array`` (optional) is used instead when many tie;
    ``id_ranks(keys) -> ints or None`` (optional; integers that sort as the ids, None when it
    has none for these keys) before either: one integer sort, no strings.
    (Which members of a run straddling the k-th place are kept: ``cut_ties``.)"""
    if scores.shape[1] < 2:
        return keys
    valid = keys >= 0
    eq = (scores[:, 1:] == scores[:, :-1]) & valid[:, 1:] & valid[:, :-1]
    if not eq.any():
        return keys
    tied = np.zeros(keys.shape, bool)
    tied[:, 1:] |= eq
    tied[:, :-1] |= eq
    # vectorized: each tied position's run (a new run where it does not tie its left
    # neighbour), then one sort of all of them by (run, id)
    starts = tied.copy()
    starts[:, 1:] &= ~eq
    run = np.cumsum(starts[tied])
    ranks = id_ranks(keys[tied]) if id_ranks is not None else None
    if ranks is not None:  # the ids' order as integers: one sort, no string read
        order = np.lexsort((ranks, run))
    elif id_array is not None and len(run) > ARROW_TIES:
        # Arrow orders strings by UTF-8 bytes, which is code point order, as numpy's str sort
        order = pc.sort_indices(pa.table({"run": run, "id": id_array(keys[tied])}),
                                sort_keys=[("run", "ascending"), ("id", "ascending")]
                                ).to_numpy()
    else:
        order = np.lexsort((np.array(ids_of(keys[tied]), dtype=str), run))
    if (order == np.arange(len(order))).all():
        return keys
    keys = keys.copy()
    at = np.flatnonzero(tied.ravel())
    flat = keys.ravel()
    flat[at] = flat[at[order]]
    return keys


def ask_for(k: int) -> int:
    """Rows to ask a top k of, to see a run of equal scores straddling the k-th place and
    usually all of it (one row more shows it; a quarter more holds most runs of BM25 ties,
    so few queries search again: cacm's hybrid, 19 of 64 queries straddling its lexical
    1,000th place, searched again at k + 1, none at k + k/4; bench/bench_tie_cut.py)."""
    return k + max(1, k // 4)


def cut_ties(scores: np.ndarray, keys: np.ndarray, k: int, ids_of, id_array=None,
             id_ranks=None) -> tuple[np.ndarray, np.ndarray]:
    """The first ``k`` of lists sorted best first (padding, key -1, last), where a run of
    equal scores straddling the k-th place keeps its members with the smallest ids: which
    documents make a top k then never follows which rows hold them (their segments, their
    shards). The lists must hold every row tied with their k-th score (the callers complete
    such runs first); ``ids_of``, ``id_array``, ``id_ranks`` as in ``order_ties``. The kept
    run is in id order; the scores are the first ``k`` as given (the run's are all equal)."""
    if scores.shape[1] <= k:
        return scores, keys
    valid = keys >= 0
    straddle = valid[:, k] & (scores[:, k] == scores[:, k - 1])
    out_s, out_k = scores[:, :k], keys[:, :k]
    if not straddle.any():
        return out_s, out_k
    out_k = out_k.copy()
    for q in np.flatnonzero(straddle).tolist():
        run = np.flatnonzero((scores[q] == scores[q, k - 1]) & valid[q])  # contiguous: sorted
        first = int(run[0])
        out_k[q, first:] = keys[q, run[_id_order(keys[q, run], ids_of, id_array,
                                                 id_ranks)[:k - first]]]
    return out_s, out_k


def _id_order(keys: np.ndarray, ids_of, id_array, id_ranks) -> np.ndarray:
    """The permutation that puts ``keys`` in id order."""
    ranks = id_ranks(keys) if id_ranks is not None else None
    if ranks is not None:
        return np.argsort(ranks, kind="stable")
    if id_array is not None and len(keys) > ARROW_TIES:
        return pc.sort_indices(id_array(keys)).to_numpy()
    return np.argsort(np.array(ids_of(keys), dtype=str), kind="stable")
