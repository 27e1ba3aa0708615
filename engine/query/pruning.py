"""Documents pruned by quality (``polyindex index --prune-quality``) kept out of the costly
representations' searches: each segment's ``_pruned`` rows are folded out of the allow mask
of every retrieve stage of a costly kind (multivector, sparse, tree). Dense needs no fold:
its build marks pruned rows absent (``index.dense_presence``), as a missing optional vector.
Lexical searches every stored document."""
from __future__ import annotations

import numpy as np

from polyindex.index.dense_presence import Presence
from polyindex.index.masks import freeze

FOLDED_KINDS = ("multivector", "sparse", "tree")


CACHE_KEY = "query:kept-allow"  # in ``Snapshot.cache``: the fold of the live masks


def kept_allow(snapshot, kind, allow: list[np.ndarray | None]) -> list[np.ndarray | None]:
    """``allow`` with each segment's pruned rows removed, for a costly kind's stage (the
    same list when no segment has a pruned row). Without a filter ``allow`` is the
    snapshot's live masks, folded once per snapshot: a query does no per-segment work."""
    if getattr(kind, "kind", None) not in FOLDED_KINDS:
        return allow
    if allow is snapshot.live:
        got = snapshot.cache.get(CACHE_KEY)
        if got is None:
            got = snapshot.cache[CACHE_KEY] = _fold(snapshot.segments, allow)
        return got
    return _fold(snapshot.segments, allow)


def _fold(segments, allow):
    out = None
    for i, seg in enumerate(segments):
        kept = _kept(seg)
        if kept is None:
            continue
        if out is None:
            out = list(allow)
        out[i] = kept.fold(allow[i])
    return allow if out is None else out


def _kept(seg) -> Presence | None:
    """A segment's not-pruned rows as a ``Presence`` (folds are cached per allow mask)."""
    got = getattr(seg, "_kept_rows", None)
    if got is None:
        docs = getattr(seg, "docs", None)
        pruned = docs.pruned() if hasattr(docs, "pruned") else None
        got = False if pruned is None else Presence(freeze(~pruned))
        try:
            seg._kept_rows = got
        except AttributeError:  # a slotted stand-in: computed again next time
            pass
    return got or None

