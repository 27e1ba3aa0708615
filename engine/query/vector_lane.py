"""The vector lane's query side: which calls may skip the general pipeline, and the plans.

A plain nearest-neighbour call (vectors only, no filter, explain or stored payload, a
profile by name) whose profile is one retrieve stage of a kind that ``PlansDirectly``, with
nothing after it, is answered by that kind's plan (the dense kind's: ``index/dense/lane``),
which gives the general path's hits bit for bit, or hands the call back to it.
``Collection.query`` and ``query_batch`` ask ``plain_call`` first; the plan of a profile is
made once per snapshot (``plan``).
"""
from __future__ import annotations

from polyindex.index.protocol import PlansDirectly, implements
from polyindex.types import MAX_K

_NONE = object()  # a profile the lane cannot take (cached as such)
LANE_CACHE = "query:vector-lane"  # in ``Snapshot.cache`` (whose other keys are kind names)


def plain_call(texts, vectors, using, tokens, k, profile, filter, explain, with_text,
               with_metadata) -> bool:
    """Whether a query call is a plain nearest-neighbour call the lane may take (``texts``,
    ``vectors``, ``tokens``: the batch's, or a single query's as a one-item list). Anything
    else, or a k out of range, takes the general path, which checks and reports."""
    return bool(vectors is not None and texts is None and tokens is None and using is None
                and filter is None and not explain and not with_text and not with_metadata
                and (profile is None or isinstance(profile, str))
                and type(k) is int and 1 <= k <= MAX_K
                and len(vectors) and not isinstance(vectors[0], dict))


def plan_for(snapshot, profile):
    """The lane's plan for ``profile`` (resolved) over ``snapshot``, or None when the profile
    is not one stage of a kind that plans directly (and takes it), with nothing after it."""
    if len(profile.retrieve) != 1 or profile.rerank is not None:
        return None
    stage = profile.retrieve[0]
    kind = snapshot.kinds.get(stage.index)
    if not implements(kind, PlansDirectly):
        return None
    segments = [s.indexes[stage.index] for s in snapshot.segments]
    return kind.direct_plan(snapshot, segments, stage.params)


def plan(snapshot, key, resolve):
    """The snapshot's plan for the profile named ``key`` (``resolve()`` gives the resolved
    profile), made on first use. Kept in the snapshot's cache, so it lives exactly as long
    as the snapshot and pins nothing after it (a plan refers to segments, not the snapshot)."""
    plans = snapshot.cache.get(LANE_CACHE)
    if plans is None:
        plans = snapshot.cache.setdefault(LANE_CACHE, {})
    got = plans.get(key)
    if got is None:
        made = plan_for(snapshot, resolve())
        if len(plans) < 64:  # names come from callers: bounded
            plans[key] = _NONE if made is None else made
        return made
    return None if got is _NONE else got
