"""The guard: is the student better than the encoder it would replace? Judged without labels.

A share of the documents is held back before the teacher is asked (``hold_back``): none of
their synthetic queries is trained on, none of them is a positive or a hard negative. After
learning, each held-back query's source document is looked up among the corpus (a seeded pool
of at most ``recipe.guard_pool`` documents, the held-back sources always in it) by dense
retrieval with the old encoder and with the student, and, when the collection serves hybrid,
by the same RRF of its lexical ranking with each encoder's dense ranking (``evaluate``): the
reciprocal rank of the source, paired over the held-back queries. The student passes only when
its mean reciprocal rank on the score the collection serves (fused when it has a lexical
ranking, else dense) is at least ``1 + recipe.guard_margin`` times the old encoder's: a margin
fixed once for every collection, never chosen on qrels.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from polyindex.adapt.recipe import Recipe
from polyindex.adapt.synth import SynthQuery

RRF_K = 60
DENSE_WEIGHT = 1.1  # the shipped hybrid's dense weight (query.profiles.NEURAL_WEIGHT)
FUSE_DEPTH = 100    # dense and lexical ranks fused, as deep as the hybrid profile's


def hold_back(queries: Sequence[SynthQuery], recipe: Recipe,
              seed: int = 0) -> tuple[list[SynthQuery], list[SynthQuery], set[int]]:
    """(train, held, held_docs): every query of a seeded share of the source documents held
    back (a document's other query would teach the student that very document)."""
    docs = sorted({q.doc for q in queries})
    per_doc = max(1, len(queries) / max(1, len(docs)))
    want = max(math.ceil(recipe.guard_share * len(docs)),
               math.ceil(recipe.guard_min_queries / per_doc))
    want = min(want, len(docs) // 2)  # at least half the documents still teach
    rng = np.random.default_rng([seed, 4])
    held = set(rng.choice(docs, want, replace=False).tolist()) if want else set()
    return ([q for q in queries if q.doc not in held], [q for q in queries if q.doc in held],
            held)


def _pool(n: int, held: Sequence[SynthQuery], recipe: Recipe, seed: int) -> np.ndarray:
    """The documents the held-back queries are retrieved among: every one, or the held-back
    sources and a seeded sample of the rest up to ``guard_pool`` (bounds the encoding)."""
    if n <= recipe.guard_pool:
        return np.arange(n)
    sources = np.unique([q.doc for q in held])
    rest = np.setdiff1d(np.arange(n), sources)
    take = max(0, recipe.guard_pool - len(sources))
    extra = np.random.default_rng([seed, 5]).choice(rest, min(take, len(rest)), replace=False)
    return np.sort(np.concatenate([sources, extra]))


def _fused(lex: Sequence[int], dense: Sequence[int]) -> list[int]:
    score: dict[int, float] = {}
    for ranks, w in ((lex, 1.0), (dense, DENSE_WEIGHT)):
        for r, d in enumerate(ranks[:FUSE_DEPTH]):
            score[d] = score.get(d, 0.0) + w / (RRF_K + r + 1)
    return sorted(score, key=lambda d: (-score[d], d))


def _rr(ranks: Sequence[int], doc: int) -> float:
    for r, d in enumerate(ranks):
        if d == doc:
            return 1.0 / (r + 1)
    return 0.0


def _paired(old: np.ndarray, new: np.ndarray) -> dict:
    out = {"wins": int((new > old + 1e-12).sum()), "losses": int((new < old - 1e-12).sum())}
    if len(old) > 1 and not np.allclose(old, new):
        from scipy.stats import ttest_rel
        out["t_p"] = round(float(ttest_rel(new, old).pvalue), 6)
    else:
        out["t_p"] = 1.0
    return out


def evaluate(encode_old: Callable[[Sequence[str]], np.ndarray],
             encode_new: Callable[[Sequence[str]], np.ndarray], texts: Sequence[str],
             held: Sequence[SynthQuery], recipe: Recipe, seed: int = 0,
             lexical: Callable[[Sequence[str], int], list[list[int]]] | None = None) -> dict:
    """The guard's verdict on held-back queries: ``encode_*(texts)`` -> L2-normalized rows;
    ``lexical(queries, depth)`` -> per query the corpus rows the lexical index ranks first
    (None: the collection serves dense alone). A JSON-able dict with ``passed`` and
    ``reason``."""
    if not held:
        return {"passed": False, "queries": 0, "margin": recipe.guard_margin,
                "reason": "no synthetic query could be held back to check the student on"}
    pool = _pool(len(texts), held, recipe, seed)
    at = {int(d): i for i, d in enumerate(pool)}
    qtexts = [q.text for q in held]
    lex = None
    if lexical is not None:
        lex = [[at[d] for d in ranks if d in at] for ranks in lexical(qtexts, FUSE_DEPTH)]
    pool_texts = [texts[i] for i in pool]
    src = np.array([at[q.doc] for q in held])
    depth = min(FUSE_DEPTH, len(pool))
    rr: dict[str, dict[str, np.ndarray]] = {}
    for name, enc in (("old", encode_old), ("student", encode_new)):
        d, q = enc(pool_texts), enc(qtexts)
        sims = q @ d.T
        own = sims[np.arange(len(src)), src]
        rank = 1 + (sims > own[:, None]).sum(1)  # ties count for the source
        got = {"dense": 1.0 / rank}
        if lex is not None:
            top = np.argpartition(-sims, depth - 1, axis=1)[:, :depth]
            order = np.take_along_axis(sims, top, 1).argsort(1)[:, ::-1]
            dense_top = np.take_along_axis(top, order, 1).tolist()
            got["fused"] = np.array([_rr(_fused(lx, dn), s)
                                     for lx, dn, s in zip(lex, dense_top, src.tolist())])
        rr[name] = got
    served = "fused" if lex is not None else "dense"
    out: dict = {"queries": len(held), "documents_held_back": len({q.doc for q in held}),
                 "pool": len(pool), "served": served, "margin": recipe.guard_margin}
    for score in rr["old"]:
        old, new = rr["old"][score], rr["student"][score]
        out[score] = {"mrr_old": round(float(old.mean()), 6),
                      "mrr_student": round(float(new.mean()), 6),
                      "ratio": round(float(new.mean() / old.mean()), 6) if old.mean() else None,
                      **_paired(old, new)}
    s = out[served]
    need = s["mrr_old"] * (1 + recipe.guard_margin)
    out["passed"] = bool(s["mrr_student"] >= need and s["mrr_student"] > 0)
    what = "lexical + dense (RRF)" if served == "fused" else "dense"
    out["reason"] = (
        f"on {len(held)} held-back synthetic queries ({what}) the student's MRR "
        f"{s['mrr_student']:.4f} vs the current encoder's {s['mrr_old']:.4f} "
        f"(x{s['ratio'] if s['ratio'] is not None else float('nan'):.3f}, "
        f"{s['wins']} better, {s['losses']} worse); "
        + ("it is better by the margin" if out["passed"] else
           f"it must be at least x{1 + recipe.guard_margin:.3f} to be committed"))
    return out
