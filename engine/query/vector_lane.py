"""The lanes' query side: which calls may skip the general pipeline, and the plans.

A plain call (vectors only, or texts only; no filter, explain or stored payload, a profile
by name) whose profile is one retrieve stage of a kind that ``PlansDirectly``, with nothing
after it, is answered by that kind's plan when the plan takes what the call gives (the dense
kind's takes vectors: ``index/dense/lane``; the lexical kind's texts: ``index/lexical/lane``),
which gives the general path's hits bit for bit, or hands the call back to it.
``Collection.query`` and ``query_batch`` ask ``plain_call`` first; the plan of a profile is
made once per snapshot (``plan``), keyed by the profile and what the call gives.
"""
from __future__ import annotations

from polyindex.index.protocol import PlansDirectly, implements
from polyindex.types import MAX_K

_NONE = object()  # a profile the lane cannot take (cached as such)
LANE_CACHE = "query:vector-lane"  # in ``Snapshot.cache`` (whose other keys are kind names)


def plain_call(texts, vectors, using, tokens, k, profile, filter, explain, with_text,
               with_metadata) -> str | None:
    """What a plain call gives, ``"vector"`` or ``"text"``, where a lane may take it
    (``texts``, ``vectors``, ``tokens``: the batch's, or a single query's as a one-item
    list); None for anything else, or a k out of range: the general path, which checks and
    reports."""
    if not (tokens is None and using is None and filter is None and not explain
            and not with_text and not with_metadata
            and (profile is None or isinstance(profile, str))
            and type(k) is int and 1 <= k <= MAX_K):
        return None
    if vectors is not None and texts is None and len(vectors) \
            and not isinstance(vectors[0], dict):
        return "vector"
    if texts is not None and vectors is None and len(texts):
        return "text"
    return None


def plan_for(snapshot, profile, takes: str = "vector"):
    """The lane's plan for ``profile`` (resolved) over ``snapshot`` taking ``takes``, or None
    when the profile is not one stage of a kind that plans directly (and takes it, and
    what the call gives), with nothing after it."""
    if len(profile.retrieve) != 1 or profile.rerank is not None:
        return None
    stage = profile.retrieve[0]
    kind = snapshot.kinds.get(stage.index)
    if not implements(kind, PlansDirectly):
        return None
    segments = [s.indexes[stage.index] for s in snapshot.segments]
    made = kind.direct_plan(snapshot, segments, stage.params)
    return made if getattr(made, "takes", None) == takes else None


def plan(snapshot, key, resolve, takes: str = "vector"):
    """The snapshot's plan for the profile named ``key`` taking ``takes`` (``resolve()`` gives
    the resolved profile), made on first use. Kept in the snapshot's cache, so it lives exactly as long
    as the snapshot and pins nothing after it (a plan refers to segments, not the snapshot)."""
    plans = snapshot.cache.get(LANE_CACHE)
    if plans is None:
        plans = snapshot.cache.setdefault(LANE_CACHE, {})
    if takes != "vector":
        key = (takes, key)
    got = plans.get(key)
    if got is None:
        made = plan_for(snapshot, resolve(), takes)
        if len(plans) < 64:  # names come from callers: bounded
            plans[key] = _NONE if made is None else made
        return made
    return None if got is _NONE else got


def answer(coll, how: str, texts, vectors, using, tokens, k, profile, filter, explain,
           with_text, with_metadata, fields):
    """A plain call's answer from its kind's lane (``how``: the plan's ``search``,
    ``search_batch`` or ``rank``: ``Collection.query``, ``query_batch``, ``query_ids``); None:
    the general path answers."""
    takes = fields is None and plain_call(texts, vectors, using, tokens, k, profile, filter,
                                          explain, with_text, with_metadata)
    if not takes:
        return None
    snap = coll.view()
    plans = snap.cache.get(LANE_CACHE)  # a plan made already: no resolver closure (~0.4 us)
    made = plans.get(profile if takes == "vector" else (takes, profile)) if plans else None
    if made is None:
        snap, made = coll._lane(profile, takes, texts, vectors)
    if made is None or made is _NONE:
        return None
    given = vectors if takes == "vector" else texts
    return getattr(made, how)(snap, given if how == "search_batch" else given[0], k)
