"""The query pipeline: segment-local retrieve stages, global fusion, final top-k with explain."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from polyindex.index.masks import freeze, is_nothing
from polyindex.index.protocol import Explains, Query, SearchesSnapshot, empty_result, implements
from polyindex.index.ties import ask_for, cut_ties, order_ties
from polyindex.query.filters import allow_mask
from polyindex.query.profiles import Profile
from polyindex.query.pruning import COSTLY_KINDS, abstaining, kept_allow, may_abstain
from polyindex.rerank import fusion
from polyindex.storage.snapshot import Snapshot
from polyindex.types import Hit, Ranking, select_fields


def allow_masks(snapshot: Snapshot, filter_expr) -> list[np.ndarray | None]:
    """Live rows that pass the filter, per segment (None = every row allowed). Masks are
    immutable (``masks.freeze``: live masks are copy-on-write already), so what is derived
    from them (filter masks, dense bitmaps) is cached by their identity."""
    for live in snapshot.live:
        freeze(live)
    if filter_expr is None:
        return snapshot.live
    return [allow_mask(seg.docs, live, filter_expr)
            for seg, live in zip(snapshot.segments, snapshot.live)]


_RUNS = "_dense_runs"  # a stage's runs in the snapshot's cache of its index


def retrieve(snapshot: Snapshot, queries: Sequence[Query], index: str, k: int,
             params: dict[str, str], allow: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    """One retrieve stage over every segment, merged to a per-kind top-k of global keys."""
    scores, keys = _retrieve(snapshot, queries, index, k, params, allow)
    return scores, order_ties(scores, keys, snapshot.ids_of, snapshot.id_array,
                              _id_ranks(snapshot))


def _id_ranks(snapshot: Snapshot):
    return getattr(snapshot, "id_ranks", None)


def _retrieve(snapshot: Snapshot, queries: Sequence[Query], index: str, k: int,
              params: dict[str, str], allow: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    kind = snapshot.kinds[index]
    seg_indexes = [s.indexes[index] for s in snapshot.segments]
    prepared = kind.prepare(queries, seg_indexes, snapshot.live, params, snapshot.cache[index])
    nq = len(queries)
    if not seg_indexes:
        return np.full((nq, 0), -np.inf, np.float32), np.full((nq, 0), -1, np.int64)
    allow = kept_allow(snapshot, kind, allow)  # documents pruned by quality
    if implements(kind, SearchesSnapshot):  # a collection-wide budget (rescore, ndocs, budget)
        return kind.search_snapshot(prepared, seg_indexes, snapshot.bases, k, params, allow)
    all_scores, all_keys = [], []
    # a kind whose ties are cut by id: each segment's list at all_*[pos] and what it was
    # asked for, (segment ordinal, rows), for ``_complete_runs``
    asked: dict[int, tuple[int, int]] = {}
    ties = getattr(kind, "completes_ties", False)
    want = ask_for(k) if ties else k
    stacks = _stacks(snapshot, index, seg_indexes, params)
    runs = _runs(snapshot, kind, index, seg_indexes, params, allow, stacks)
    skip_to = 0
    for i, (base, seg_index, mask) in enumerate(zip(snapshot.bases, seg_indexes, allow)):
        if i < skip_to:
            continue
        if i in runs:  # plain flat segments searched by one faiss call, as the vector lane's
            skip_to, run = runs[i]
            scores, keys = run.search(prepared, k)
            all_scores.append(scores)
            all_keys.append(np.where(keys >= 0, keys + base, -1) if base else keys)
            continue
        if i in stacks:  # an online buffer's segments as one stack, as the vector lane's
            view, kwargs = stacks[i]
            skip_to = i + view.segments
            prep = _stack_prepared(snapshot, i, view, seg_indexes, allow)
            from polyindex.index.dense import stack as dense_stack
            scores, keys = dense_stack.search(prep, prepared, k, kwargs)
            all_scores.append(scores)
            all_keys.append(np.where(keys >= 0, keys + base, -1) if base else keys)
            continue
        if is_nothing(mask):  # the filter's column range excludes every row of the segment
            scores, keys = empty_result(nq, k)
            all_scores.append(scores)
            all_keys.append(keys)
            continue
        scores, rows = seg_index.search(prepared, want, params, mask)
        if ties:
            asked[len(all_scores)] = (i, want)
        all_scores.append(scores)
        all_keys.append(np.where(rows >= 0, rows + base, -1) if base else rows)
    if len(all_scores) == 1 and not asked:
        return all_scores[0], all_keys[0]
    if asked:
        _complete_runs(snapshot, seg_indexes, prepared, k, params, allow, asked, all_scores,
                       all_keys)
    if len(all_scores) == 1:  # one segment's list: best first already
        scores, keys = all_scores[0], all_keys[0]
    else:
        scores = np.concatenate(all_scores, axis=1)
        keys = np.concatenate(all_keys, axis=1)
        scores = np.where(keys >= 0, scores, -np.inf)
        top = np.argsort(-scores, axis=1, kind="stable")
        scores, keys = np.take_along_axis(scores, top, 1), np.take_along_axis(keys, top, 1)
    if not asked:
        return scores[:, :k], keys[:, :k]
    return cut_ties(scores, keys, k, snapshot.ids_of, snapshot.id_array, _id_ranks(snapshot))


def _complete_runs(snapshot: Snapshot, seg_indexes, prepared, k: int, params, allow,
                   asked: dict, all_scores: list, all_keys: list) -> None:
    """Make every segment list hold each row tied with the merged k-th score (so
    ``cut_ties`` can keep the run's smallest ids, whatever the segmentation): a list that
    came back full (every row it was asked for) and ends on that score may stop inside the
    run, so its segment is asked again for twice as many, until it ends below that score or
    holds every row the segment has. Only lists that end on the k-th score are asked again
    (the rows asked beyond k tell: ``ties.ask_for``): a run straddling the cut and longer
    than those rows, not every query."""
    while True:
        full = [pos for pos, (_, n) in asked.items()
                if all_keys[pos].shape[1] >= n and (all_keys[pos][:, n - 1] >= 0).any()]
        if not full:
            return
        if len(all_keys) == 1:  # one list, best first: its own k-th
            kth = all_scores[0][:, k - 1]
        else:
            keys = np.concatenate(all_keys, axis=1)
            scores = np.where(keys >= 0, np.concatenate(all_scores, axis=1), -np.inf)
            kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
        again = [pos for pos in full
                 if ((all_keys[pos][:, asked[pos][1] - 1] >= 0)
                     & (all_scores[pos][:, asked[pos][1] - 1] == kth)).any()]
        if not again:
            return
        for pos in again:
            i, n = asked[pos]
            asked[pos] = (i, 2 * n)
            base = int(snapshot.bases[i])
            all_scores[pos], rows = seg_indexes[i].search(prepared, 2 * n, params, allow[i])
            all_keys[pos] = np.where(rows >= 0, rows + base, -1) if base else rows


def _stacks(snapshot: Snapshot, index: str, seg_indexes, params) -> dict:
    """{first segment ordinal: (stack view, faiss search kwargs)} of the snapshot's stacked
    buffer segments this stage searches as one (``index.dense.stack``), as the vector lane
    takes them."""
    if not getattr(snapshot, "stacks", None):
        return {}
    # dense imported only here: a collection without dense never loads faiss (issue 38)
    from polyindex.index.dense import kind as dense
    from polyindex.index.dense import stack as dense_stack
    if index != dense_stack.FIELD:
        return {}
    kwargs = dense.faiss_kwargs(params)
    return {i: (view, kwargs) for i, view in snapshot.stacks.items()
            if len(seg_indexes[i:i + view.segments]) == view.segments
            and dense_stack.stackable(seg_indexes[i:i + view.segments])}


def _runs(snapshot: Snapshot, kind, index: str, seg_indexes, params, allow, stacks) -> dict:
    """A dense stage's runs of plain flat segments (``index.dense.shards.runs``), worked out
    once per snapshot for its unfiltered masks (the same list object every query), per
    query under a filter."""
    if getattr(kind, "kind", None) != "dense" or len(seg_indexes) < 2:
        return {}
    from polyindex.index.dense import kind as dense  # a dense stage: faiss is loaded already
    from polyindex.index.dense import shards as dense_shards
    if dense.faiss_kwargs(params):
        return {}
    cache = snapshot.cache[index]
    got = cache.get(_RUNS)
    if got is not None and got[0] is allow:
        return got[1]
    taken = frozenset(j for i, (view, _) in stacks.items() for j in range(i, i + view.segments))
    runs = dense_shards.runs(seg_indexes, snapshot.bases, allow, dense.QUERY_THREADS, taken)
    if allow is snapshot.live:
        cache[_RUNS] = (allow, runs)
    return runs


def _stack_prepared(snapshot, i, view, seg_indexes, allow):
    """The stack's rows allowed by ``allow``, ready to search: the snapshot's own (made as
    the writer published it) when ``allow`` is its live masks, made per query under a
    filter."""
    from polyindex.index.dense import stack as dense_stack
    end = i + view.segments
    if allow is snapshot.live:
        return dense_stack.cached_prepare(snapshot, i, view, seg_indexes[i:end], allow[i:end])
    return dense_stack.prepare(view, dense_stack.key_mask(seg_indexes[i:end], allow[i:end]))


def run(snapshot: Snapshot, queries: Sequence[Query], profile: Profile, k: int,
        filter_expr=None, explain: bool = False, with_text: bool = False,
        with_metadata: bool | None = None, fields: list[str] | None = None,
        ranking: bool = False) -> list[list[Hit]] | list[Ranking]:
    """``with_text``: each hit's title and text; ``with_metadata``: its stored metadata
    (None: the same as ``with_text``, what ``Collection.query(with_text=True)`` gives), only
    the names in ``fields`` when given. ``ranking``: each query's ``Ranking`` (ids and
    scores, no ``Hit`` objects; nothing to explain or fill in)."""
    if with_metadata is None:
        with_metadata = with_text
    allow = allow_masks(snapshot, filter_expr)
    # With one stage and nothing after it, the stage's top-k is the answer: fetch exactly k.
    single = len(profile.retrieve) == 1 and profile.rerank is None
    stage_results = [retrieve(snapshot, queries, st.index, k if single else st.k, st.params, allow)
                     for st in profile.retrieve]
    keep = max(k, profile.rerank["window"]) if profile.rerank else k
    blind = blind_keys(snapshot, profile, stage_results)
    per_query = []
    for qi in range(len(queries)):
        lists = [(s[qi], keys[qi]) for s, keys in stage_results]
        per_query.append((lists, *fuse(profile, lists, keep, blind)))
    extra = [None] * len(queries)
    if profile.rerank is not None:
        window = profile.rerank["window"]
        cands = [(kk[:window], sc[:window]) for _, kk, sc in per_query]
        if "index" in profile.rerank:  # one kind's own score reorders the window
            from polyindex.rerank.kind_scores import rescore
            reranked = rescore(snapshot, queries, cands, profile.rerank, explain)
        else:
            from polyindex.rerank.stage import rerank
            reranked = rerank(snapshot, queries, cands, [lists for lists, _, _ in per_query],
                              [st.index for st in profile.retrieve], profile.rerank, explain,
                              blind)
        per_query = [(lists, kk, sc) for (lists, _, _), (kk, sc, _) in zip(per_query, reranked)]
        extra = [details for _, _, details in reranked]
    if ranking:
        return [Ranking(snapshot.ids_of(keys[:k]), np.asarray(scores[:k], np.float64))
                for _, keys, scores in per_query]
    return [_hits(snapshot, keys[:k], scores[:k], profile, lists if explain else None,
                  (with_text, with_metadata, fields), None if details is None else details[:k],
                  query)
            for (lists, keys, scores), details, query in zip(per_query, extra, queries)]


def blind_keys(snapshot: Snapshot, profile: Profile, stage_results):
    """(the pruned keys among a batch's stage results, per stage whether it is blind to them:
    a costly kind) when some stage cannot see some of them (``pruning.abstaining``); None
    for one stage or a collection that prunes nothing."""
    if len(stage_results) < 2:
        return None
    kinds = [snapshot.kinds[st.index].kind for st in profile.retrieve]
    if not may_abstain(snapshot, kinds):
        return None
    keys = abstaining(snapshot, np.concatenate([kk.ravel() for _, kk in stage_results]))
    if not len(keys):
        return None
    return keys, [k in COSTLY_KINDS for k in kinds]


def fuse(profile: Profile, lists, keep: int, blind=None) -> tuple[np.ndarray, np.ndarray]:
    """One query's per-stage lists -> (keys, scores) best first, at most ``keep`` long.
    ``blind`` (``blind_keys``): pruned keys whose blind stages abstain rather than vote
    against them: their fused score is scaled by all legs' weight over the seeing legs'."""
    if len(lists) == 1:
        scores, keys = lists[0]
        n = int(np.count_nonzero(keys >= 0))  # results are -1 padded at the end only
        return keys[:n][:keep], scores[:n][:keep]
    w = profile.fuse.get("weights", {})  # per retrieved kind, 1 when not named
    weights = [float(w.get(st.index, 1.0)) for st in profile.retrieve]
    adapt = profile.fuse.get("adapt")
    if adapt is not None:  # this query's weights, from how peaked one leg's list is
        at = next(i for i, st in enumerate(profile.retrieve) if st.index == adapt["index"])
        s, kk = lists[at]
        weights = fusion.adapted_weights(weights, at, s[kk >= 0], float(adapt["slope"]),
                                         float(adapt["centre"]))
    rescale = None
    if blind is not None:
        seeing = sum(wt for wt, b in zip(weights, blind[1]) if not b)
        if seeing > 0:
            rescale = (blind[0], sum(weights) / seeing)
    if profile.fuse["method"] == "rrf":
        keys, scores = fusion.rrf([kk for _, kk in lists], profile.fuse.get("k", 60), weights,
                                  rescale, keep)
    else:
        keys, scores = fusion.weighted([kk for _, kk in lists], [s for s, _ in lists], weights,
                                       rescale)
    return keys[:keep], scores[:keep]


def _hits(snapshot, keys, scores, profile, lists, payload, details=None,
          query: Query | None = None) -> list[Hit]:
    ids = snapshot.ids_of(keys)
    hits = [Hit(i, s, r) for r, i, s in zip(range(1, len(ids) + 1), ids, scores.tolist())]
    if any(payload) and hits:
        _payload(snapshot, hits, keys, *payload)
    if lists is not None:
        explain_hits(profile, lists, hits, keys, details)
        if query is not None and hits:
            _index_explain(snapshot, profile, query, hits, keys)
    return hits


def explain_hits(profile: Profile, lists, hits: list[Hit], keys, details=None) -> None:
    """Each hit's account: its rank and score in every retrieve stage (``lists``: the
    query's per-stage (scores, keys)), the fusion, and the rerank stage's own ``details``
    (features, contributions). The sharded router explains its merged lists the same way."""
    per_stage = []
    for st, (s, kk) in zip(profile.retrieve, lists):
        valid = kk >= 0
        per_stage.append((st.index, {int(key): (rank + 1, float(sc)) for rank, (key, sc) in
                                     enumerate(zip(kk[valid].tolist(), s[valid].tolist()))}))
    for h, key in zip(hits, np.asarray(keys).tolist()):
        h.explain = {"stages": {name: ({"rank": m[key][0], "score": m[key][1]} if key in m
                                       else None) for name, m in per_stage},
                     "fused": {"method": profile.fuse["method"] if len(lists) > 1 else None,
                               "score": h.score}}
    for h, d in zip(hits, details or ()):
        h.explain["fused"]["score"] = d.get("fused_score")
        h.explain["rerank"] = d


def _payload(snapshot, hits: list[Hit], keys, with_text: bool, with_metadata: bool,
             fields: list[str] | None = None) -> None:
    """Fill in the stored title/text and/or metadata of hits, one read per segment."""
    seg, rows = snapshot.locate(keys)
    by_segment: dict[int, list[int]] = {}
    for i, s in enumerate(seg.tolist()):
        by_segment.setdefault(s, []).append(i)
    for s, idx in by_segment.items():
        docs = snapshot.segments[s].docs
        seg_rows = [int(rows[i]) for i in idx]
        if with_metadata:
            for i, doc in zip(idx, docs.documents(seg_rows)):
                hits[i].metadata = select_fields(doc.metadata, fields)
                if with_text:
                    hits[i].title, hits[i].text = doc.title, doc.text
        else:
            for i, doc in zip(idx, docs.rows(seg_rows, ("title", "text"))):
                hits[i].title, hits[i].text = doc["title"], doc["text"]


def _index_explain(snapshot, profile, query: Query, hits: list[Hit], keys) -> None:
    """Retrieve stages whose segment indexes explain hits themselves (an ``explain(prepared,
    row_ids)`` method, e.g. the tree's root-to-leaf path with node labels) add their account
    under ``explain["index"][stage index]``, for every hit, retrieved by that stage or not."""
    seg, rows = snapshot.locate(keys)
    for st in profile.retrieve:
        seg_indexes = [s.indexes[st.index] for s in snapshot.segments]
        if not implements(seg_indexes[0], Explains):
            continue
        prepared = snapshot.kinds[st.index].prepare([query], seg_indexes, snapshot.live,
                                                    st.params, snapshot.cache[st.index])
        for h, s, r in zip(hits, seg.tolist(), rows.tolist()):
            h.explain.setdefault("index", {})[st.index] = seg_indexes[s].explain(prepared, [r])[0]
