"""The teacher: a collection's best profile ranking synthetic queries, and the pairs it gives.

``collection_teacher`` turns a collection (its ``query_batch`` and a profile, ``hybrid`` when it
has lexical and dense) into the callable ``learn`` takes: queries, depth -> per query the rows
of the corpus it ranks first, best first. ``label`` keeps the pairs the teacher is sure of (the
source document in its top ``keep_rank``) and draws a hard negative from its lower ranks
(``neg_ranks``: low enough to be rarely relevant, high enough to be hard).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from polyindex.adapt.recipe import Recipe
from polyindex.adapt.synth import SynthQuery

Teacher = Callable[[Sequence[str], int], list[list[int]]]


def best_profile(collection) -> str:
    """The collection's best text profile: hybrid (lexical + dense RRF) when it has both."""
    kinds = set(collection.kinds)
    if {"lexical", "dense"} <= kinds:
        return "hybrid"
    return "lexical" if "lexical" in kinds else "dense"


def collection_teacher(collection, ids: Sequence[str], profile: str | None = None,
                       batch: int = 256) -> Teacher:
    """A teacher over ``collection`` whose rows are ``ids`` (hits outside ``ids`` are skipped)."""
    row = {d: i for i, d in enumerate(ids)}
    profile = profile or best_profile(collection)

    def teach(queries: Sequence[str], depth: int) -> list[list[int]]:
        out = []
        for s in range(0, len(queries), batch):
            for hits in collection.query_batch(list(queries[s:s + batch]), k=depth,
                                               profile=profile):
                out.append([row[h.id] for h in hits if h.id in row])
        return out
    return teach


def fused_teacher(teacher_ranks: list[list[int]], student_ranks: list[list[int]],
                  k: int = 60) -> list[list[int]]:
    """The next round's labels: reciprocal rank fusion of the teacher's and the student's
    rankings (the student becomes a teacher without dropping the lexical evidence)."""
    out = []
    for a, b in zip(teacher_ranks, student_ranks):
        score: dict[int, float] = {}
        for ranks in (a, b):
            for r, d in enumerate(ranks):
                score[d] = score.get(d, 0.0) + 1.0 / (k + r + 1)
        out.append(sorted(score, key=lambda d: (-score[d], d)))
    return out


@dataclass(frozen=True)
class Pair:
    query: str
    positive: str
    doc: int                 # the positive's row
    negative: int | None     # a hard negative's row
    kind: str


def label(queries: Sequence[SynthQuery], ranked: Sequence[Sequence[int]], recipe: Recipe,
          seed: int = 0, unseen: frozenset[int] | set[int] = frozenset(),
          negatives: Sequence[Sequence[int]] | None = None) -> tuple[list[Pair], dict]:
    """The pairs kept, and counts of what was dropped and why; no document of ``unseen``
    (the guard's held-back ones) is drawn as a hard negative. Negatives come from
    ``negatives`` (another ranking of the same queries: ``recipe.neg_source``) when given,
    else from the teacher's."""
    lo, hi = recipe.neg_ranks
    rng = np.random.default_rng([seed, 2])
    pairs, unsure, kept_kinds = [], 0, {}
    for i, (q, ranks) in enumerate(zip(queries, ranked)):
        top = list(ranks[:recipe.keep_rank])
        if q.doc not in top:
            unsure += 1
            continue
        source = ranks if negatives is None else negatives[i]
        pool = [d for d in source[lo:hi] if d != q.doc and d not in unseen]
        neg = pool[int(rng.integers(0, len(pool)))] if pool else None
        pairs.append(Pair(q.text, q.positive, q.doc, neg, q.kind))
        kept_kinds[q.kind] = kept_kinds.get(q.kind, 0) + 1
    return pairs, {"queries": len(queries), "kept": len(pairs), "unsure": unsure,
                   "kept_by_kind": kept_kinds,
                   "with_negative": sum(p.negative is not None for p in pairs)}
