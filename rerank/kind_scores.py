"""Any index kind's own score of given candidates (``SegmentIndex.score``), per query.

Used twice: as rerank features (``schema.KIND_SCORES``: the sparse similarity, the exact
MaxSim of a multivector index, the tree's path score) and as a rerank stage that reorders the
fused window by one kind's score (a profile's ``{"rerank": {"index": KIND, "window": W}}``,
e.g. late-interaction MaxSim over lexical + dense candidates).

Each query is prepared on its own: ``score`` returns (queries x rows), so a batch prepared
together would score every query against every other query's candidates (for MaxSim, the
cost that matters, a batch of B queries would cost B times more).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def score(snapshot, index: str, queries: Sequence, q_of: np.ndarray, seg: np.ndarray,
          rows: np.ndarray, params: dict[str, str] | None = None) -> np.ndarray:
    """float32 (n,): kind ``index``'s score of candidate i (query ``q_of[i]``, segment
    ``seg[i]``, segment row ``rows[i]``); NaN where the kind cannot score it (a query without
    the vector the kind needs, a row the kind does not hold)."""
    kind = snapshot.kinds[index]
    seg_indexes = [s.indexes[index] for s in snapshot.segments]
    out = np.full(len(rows), np.nan, np.float32)
    if not len(rows):
        return out
    order = np.argsort(q_of, kind="stable")
    bounds = np.searchsorted(q_of[order], np.arange(len(queries) + 1))
    for qi, q in enumerate(queries):
        sel = order[bounds[qi]:bounds[qi + 1]]
        if not len(sel) or (kind.needs_embeddings and getattr(q, "vector", None) is None) \
                or (kind.kind == "dense" and kind.field != "dense"
                    and kind.field not in (getattr(q, "vectors", None) or {})):
            continue  # the query lacks what the kind scores with
        prepared = kind.prepare([q], seg_indexes, snapshot.live, params or {},
                                snapshot.cache[index])
        for s in np.unique(seg[sel]).tolist():
            pick = sel[seg[sel] == s]
            out[pick] = seg_indexes[s].score(prepared, rows[pick])[0]
    return out


def rescore(snapshot, queries: Sequence, candidates: Sequence[tuple[np.ndarray, np.ndarray]],
            spec: dict, explain: bool) -> list:
    """The rerank stage ``{"index": KIND, ...}``: per query, (keys best first, the kind's
    scores, details or None). Candidates the kind cannot score follow the scored ones in fused
    order, scored just below them; a query the kind cannot score at all keeps its fused list."""
    return order_by(candidates, raw_scores(snapshot, queries, [k for k, _ in candidates], spec),
                    spec, explain)


def raw_scores(snapshot, queries: Sequence, keys: Sequence[np.ndarray], spec: dict) -> np.ndarray:
    """The kind's score of every candidate (per query, its keys), NaN where it has none."""
    from polyindex.index.protocol import parse_options
    params = spec.get("params", "")
    params = parse_options(params, where="rerank.params") if isinstance(params, str) \
        else dict(params)
    counts = [len(k) for k in keys]
    flat = np.concatenate([np.asarray(k, np.int64) for k in keys]) if counts \
        else np.zeros(0, np.int64)
    q_of = np.repeat(np.arange(len(keys)), counts)
    seg, rows = snapshot.locate(flat) if len(flat) else (flat, flat)
    return score(snapshot, spec["index"], queries, q_of, seg, rows, params)


def order_by(candidates, s: np.ndarray, spec: dict, explain: bool) -> list:
    """``rescore``'s answer from the kind's scores ``s`` of every candidate (NaN: none)."""
    counts = [len(k) for k, _ in candidates]
    out, lo = [], 0
    for (kk, fused), n in zip(candidates, counts):
        sc = s[lo:lo + n]
        lo += n
        missing = np.isnan(sc)
        if missing.all():
            sc = np.asarray(fused, np.float32)
        elif missing.any():  # finite scores (JSON-safe), below every scored candidate
            sc = np.where(missing, np.nanmin(sc) - 1.0, sc).astype(np.float32)
        order = np.lexsort((np.arange(n), -sc))  # ties keep the fused order
        details = None
        if explain:
            details = [{"fused_score": float(fused[i]),
                        f"{spec['index']}_score": None if missing[i] else float(sc[i])}
                       for i in order.tolist()]
        out.append((np.asarray(kk)[order], sc[order], details))
    return out
