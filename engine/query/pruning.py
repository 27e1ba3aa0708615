"""Documents pruned by quality (``polyindex index --prune-quality``) kept out of the costly
representations' searches: each segment's ``_pruned`` rows are folded out of the allow mask
of every retrieve stage of a costly kind (multivector, sparse, tree). Dense needs no fold:
its build marks pruned rows absent (``index.dense.presence``), as a missing optional vector.
Lexical searches every stored document.

Fusion then treats a costly leg as *blind* to a pruned document, not as a vote against it:
``abstaining`` gives the pruned keys among a batch's candidates (when ``may_abstain``), and
``pipeline.fuse`` scales such a key's fused score by (every leg's weight) / (the weight of
the legs that can see it), so a pruned document the lexical leg finds at rank r fuses as one
every leg put at rank r.
Without it hybrid ranked a pruned document below every document both legs found (bench_prune:
-14% to -19% nDCG@10 on three of five collections at P = 0.25)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from polyindex.index.dense.presence import Presence
from polyindex.index.masks import freeze

FOLDED_KINDS = ("multivector", "sparse", "tree")
COSTLY_KINDS = ("dense",) + FOLDED_KINDS  # kinds that never see a pruned document


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


HAS_PRUNED_KEY = "query:has-pruned"  # in ``Snapshot.cache``: whether any segment prunes


def may_abstain(snapshot, kinds: Sequence[str]) -> bool:
    """Whether a profile retrieving ``kinds`` has a leg that may be blind to some document
    of the snapshot: a costly kind beside a kind that is not, in a snapshot with pruned rows
    (known per snapshot)."""
    if not (any(k in COSTLY_KINDS for k in kinds) and any(k not in COSTLY_KINDS for k in kinds)):
        return False
    has = snapshot.cache.get(HAS_PRUNED_KEY)
    if has is None:
        has = snapshot.cache[HAS_PRUNED_KEY] = any(_kept(s) is not None
                                                   for s in snapshot.segments)
    return has


def abstaining(snapshot, keys: np.ndarray) -> np.ndarray:
    """The pruned keys (sorted) among ``keys`` (global keys, -1 padding allowed). One pass
    over the keys and the segments they touch."""
    keys = np.unique(keys[keys >= 0])
    out = np.zeros(len(keys), bool)
    for s, at, rows in snapshot.by_segment(keys):
        kept = _kept(snapshot.segments[s])
        if kept is not None:
            out[at] = ~kept.mask[rows]
    return keys[out]
