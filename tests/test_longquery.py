"""Long queries: the text lane's dense term-at-a-time (``postings.dense_pays``, forced with
``use_blockmax`` 4) and term-at-a-time MaxScore (``index/lexical/longquery``, ``use_blockmax``
3) return exactly the exhaustive top k (term-at-a-time with seen flags: the same ids in the
same order, the same float32 scores), over several segments with deletions and with equal
scores straddling the k-th place."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from polyindex.query.pipeline import run
from polyindex.query.requests import make_queries

from test_lexical_lane import read_beir

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def _plan(coll, text):
    plan = coll._lane("lexical", "text", [text], None)[1]
    assert plan is not None
    return plan


def _both(coll, text, k):
    """The lane's exhaustive hits, its hits with each long-query mode (as chosen by
    default, dense, longquery), and the general path's."""
    plan = _plan(coll, text)
    try:
        plan.blockmax = 0
        exhaustive = coll.query(text, k=k, profile="lexical")
        modes = []
        for mode in (1, 4, 3):
            plan.blockmax = mode
            modes.append(coll.query(text, k=k, profile="lexical"))
    finally:
        plan.blockmax = 1
    general = run(coll.view(), make_queries([text], None), coll._profile("lexical"), k)[0]
    return exhaustive, modes, general


def _same(a, b):
    assert [h.id for h in a] == [h.id for h in b]
    assert [h.rank for h in a] == [h.rank for h in b]
    np.testing.assert_allclose([h.score for h in a], [h.score for h in b], rtol=1e-6, atol=0)


def _check(coll, texts, ks):
    tied_at_k = 0
    for k in ks:
        for text in texts:
            exhaustive, modes, general = _both(coll, text, k)
            _same(exhaustive, general)
            for got in modes:
                _same(got, exhaustive)
                assert [h.score for h in got] == [h.score for h in exhaustive]  # bit for bit
            scores = [h.score for h in exhaustive]
            if len(scores) == k and scores.count(scores[-1]) > 1:
                tied_at_k += 1
    return tied_at_k


@pytest.mark.slow
def test_long_queries_equal_exhaustive_with_ties_and_deletes(eng):
    """Generated documents, 40-term queries, three segments, deletions, and duplicate texts
    (different ids, different segments) whose equal scores cross the k-th place."""
    rng = np.random.default_rng(7)
    words = [f"w{i}" for i in range(400)]
    p = 1.0 / np.arange(1, 401) ** 1.1
    p /= p.sum()
    docs = [{"id": f"d{i:05d}", "text": " ".join(rng.choice(words, rng.integers(5, 60), p=p))}
            for i in range(1500)]
    texts = [" ".join(rng.choice(words, 40, p=p)) for _ in range(15)]
    coll = eng.create_collection("c", ["lexical"], model=None)
    coll.add(docs[:500])
    coll.add(docs[500:1000])
    # copies of the 10th and the 50th hit of some queries: a run of equal scores there
    extra = []
    for q, text in enumerate(texts[:10]):
        for k in (10, 50):
            at = coll.query(text, k=k, profile="lexical")[-1].id
            src = next(d for d in docs if d["id"] == at)
            extra += [{"id": f"z{q:02d}{k:03d}{c}", "text": src["text"]} for c in range(3)]
    coll.add(docs[1000:] + extra)
    coll.delete([d["id"] for d in docs[::41]])
    assert len(coll.view().segments) == 3
    assert _check(coll, texts, (1, 10, 50, 100)) >= 3  # ties at the k-th place


@pytest.mark.skipif(not (DATA / "cisi" / "corpus.jsonl").is_file(),
                    reason="../shared/data/cisi not present (the shared IR collections)")
def test_long_queries_equal_exhaustive_on_a_shared_collection(eng):
    """cisi (~50 terms a query) in five segments with deletions, and copies of the k-th
    hit of some queries in another segment: exactly the exhaustive top k at k=10 and 100."""
    docs, queries = read_beir("cisi", 60)
    coll = eng.create_collection("cisi", ["lexical"], model=None)
    step = -(-len(docs) // 4)
    for a in range(0, len(docs), step):
        coll.add(docs[a:a + step])
    extra = []
    for q, text in enumerate(queries[:8]):
        for k in (10, 100):
            at = coll.query(text, k=k, profile="lexical")[-1].id
            src = next(d for d in docs if d["id"] == at)
            extra += [dict(src, id=f"copy-{q}-{k}-{c}") for c in range(2)]
    coll.add(extra)
    coll.delete([d["id"] for d in docs[::53]])
    assert len(coll.view().segments) == 5
    assert _check(coll, queries, (10, 100)) >= 4  # ties at the k-th place
