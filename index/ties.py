"""Equal scores put in document id order, so which row of a document comes first (its
segment, its shard) never decides a ranking (docs/notes/segmentation-independence.md)."""
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
    (Which of a tie run straddling the k-th place are kept still follows rows.)"""
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
