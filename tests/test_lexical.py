"""The lexical index kind: analyzer, posting machinery, BM25 scores, bm25s parity."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.index import postings
from polyindex.index.lexical.analyzer import Analyzer
from polyindex.index.lexical.kind import LexicalKind
from polyindex.index.protocol import BuildBatch, Query
from polyindex.index.lexical.stopwords import STOPWORDS_EN

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"

TINY = ["apple banana apple", "banana cherry", "cherry cherry cherry date", "elderberry"]


def kind(body: str = "bm25,k1=1.5,b=0.75") -> LexicalKind:
    return LexicalKind(body)


def build(k: LexicalKind, texts, folder: Path, titles=None):
    titles = titles if titles is not None else [""] * len(texts)
    ids = [f"d{i}" for i in range(len(texts))]
    info = k.build(BuildBatch(ids=ids, titles=titles, texts=list(texts)), folder)
    return k.open(folder, json.loads(json.dumps(info)))  # the info must survive JSON


def query(k, segs, texts, live=None, params=None, cache=None):
    live = live if live is not None else [None] * len(segs)
    return k.prepare([Query(text=t) for t in texts], segs, live, params or {},
                     {} if cache is None else cache)


def random_corpus(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(40)] + ["alpha", "beta", "gamma", "delta", "the", "of"]
    p = 1.0 / np.arange(1, len(words) + 1)
    p /= p.sum()
    return [" ".join(rng.choice(words, size=rng.integers(0, 25), p=p)) for _ in range(n)]


# --------------------------------------------------------------------------- analyzer

def test_analyzer_drops_stopwords_lowercases_and_stems():
    a = Analyzer()
    assert a.analyze("The Running of the CATS and dogs") == ["run", "cat", "dog"]
    assert a.analyze("It is what it is") == ["what"]
    assert a.analyze("") == [] and a.analyze("the of and") == []
    assert a.analyze("connection connected connecting") == ["connect"] * 3


def test_analyzer_unicode_words_digits_underscores():
    a = Analyzer()
    assert a.analyze("café Zürich") == ["café", "zürich"]
    assert a.analyze("naïve_x, 42-point; Ελλάδα!") == ["naïve_x", "42", "point", "ελλάδα"]
    assert a.analyze_many(["café Zürich", "", "The cats"]) == [["café", "zürich"], [], ["cat"]]


def test_stopwords_are_bm25s_english_list():
    bm25s = pytest.importorskip("bm25s")
    assert STOPWORDS_EN == frozenset(bm25s.stopwords.STOPWORDS_EN)


def test_analyzer_cache_reset_keeps_results():
    a = Analyzer(max_cache=len(STOPWORDS_EN) + 3)
    texts = ["running dogs jumped over lazy foxes", "dogs run", "jumped jumps jumping"]
    expect = [Analyzer().analyze(t) for t in texts]
    assert a.analyze_many(texts) == expect
    assert [a.analyze(t) for t in texts] == expect


# --------------------------------------------------------------------------- factory / params

def test_factory_string_normalized_and_validated():
    assert kind("").describe() == "lexical:bm25,k1=1.5,b=0.75"
    assert kind("bm25").describe() == "lexical:bm25,k1=1.5,b=0.75"
    assert kind("bm25,k1=1.2,b=0.5").describe() == "lexical:bm25,k1=1.2,b=0.5"
    with pytest.raises(InvalidArgument, match="lexical:bm25,k3=1"):
        kind("bm25,k3=1")
    with pytest.raises(InvalidArgument, match="tfidf"):
        kind("tfidf")
    with pytest.raises(InvalidArgument, match="k1"):
        kind("bm25,k1=abc")
    with pytest.raises(InvalidArgument, match="b must be"):
        kind("bm25,b=2")


def test_query_errors(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    with pytest.raises(InvalidArgument, match="needs query text"):
        k.prepare([Query(text=None)], [seg], [None], {}, {})
    with pytest.raises(InvalidArgument, match="needs query text"):
        query(k, [seg], ["  "])
    with pytest.raises(InvalidArgument, match="nprobe"):
        query(k, [seg], ["apple"], params={"nprobe": "3"})
    p = query(k, [seg], ["apple"])
    with pytest.raises(InvalidArgument, match="nprobe"):
        seg.search(p, 3, {"nprobe": "3"}, None)


# --------------------------------------------------------------------------- BM25 values

def test_bm25_scores_match_hand_computed_values(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    p = query(k, [seg], ["apple cherry"])
    # N = 4 docs; lengths 3, 2, 4, 1 -> avgdl 2.5; df(apple) = 1, df(cherry) = 2.
    idf_apple = math.log(1 + (4 - 1 + 0.5) / (1 + 0.5))
    idf_cherry = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))
    k1, b, avgdl = 1.5, 0.75, 2.5

    def tfc(tf, dl):
        return tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    expect = {0: idf_apple * tfc(2, 3), 1: idf_cherry * tfc(1, 2), 2: idf_cherry * tfc(3, 4)}
    scores, rows = seg.search(p, 4, {}, None)
    assert scores.dtype == np.float32 and rows.dtype == np.int64 and scores.shape == (1, 4)
    order = sorted(expect, key=lambda r: -expect[r])
    assert rows[0].tolist() == order + [-1]  # doc 3 matches nothing: not returned
    np.testing.assert_allclose(scores[0, :3], [expect[r] for r in order], rtol=1e-6)
    assert scores[0, 3] == -np.inf
    # score() gives the same numbers, 0 for a row without a query term, NaN out of range
    got = seg.score(p, np.array([2, 0, 3, 1, 99, -1]))
    np.testing.assert_allclose(got[0, :4], [expect[2], expect[0], 0.0, expect[1]], rtol=1e-6)
    assert np.isnan(got[0, 4:]).all()
    assert got[0, 0] == scores[0, rows[0].tolist().index(2)]  # bit-identical to search


def test_search_params_override_k1_b(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    idf = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))
    p = query(k, [seg], ["cherry"], params={"k1": "0.9", "b": "0.4"})
    scores, rows = seg.search(p, 2, {"k1": "0.9", "b": "0.4"}, None)

    def s(tf, dl):
        return idf * tf * 1.9 / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / 2.5))
    assert rows[0].tolist() == [2, 1]
    np.testing.assert_allclose(scores[0], [s(3, 4), s(1, 2)], rtol=1e-6)
    assert kind("bm25,k1=0.9,b=0.4").describe() == "lexical:bm25,k1=0.9,b=0.4"


def test_duplicate_query_terms_count_per_occurrence(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    only_banana = seg.score(query(k, [seg], ["banana"]), np.arange(4))[0]
    only_cherry = seg.score(query(k, [seg], ["cherry"]), np.arange(4))[0]
    got = seg.score(query(k, [seg], ["cherry cherries banana"]), np.arange(4))[0]
    np.testing.assert_allclose(got, 2 * only_cherry + only_banana, rtol=1e-6)
    p = query(k, [seg], ["cherry cherries banana"])
    assert p.terms == [["cherri", "banana"]]  # kept once, weight idf x 2
    s, r = seg.search(p, 4, {}, None)
    np.testing.assert_allclose(s[0, :3], got[r[0, :3]], rtol=1e-6)


def test_k_larger_than_matches_pads(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    scores, rows = seg.search(query(k, [seg], ["date", "nothingmatches", "the"]), 10, {}, None)
    assert rows.shape == (3, 10)
    assert rows[0].tolist() == [2] + [-1] * 9 and np.isneginf(scores[0, 1:]).all()
    assert (rows[1:] == -1).all() and np.isneginf(scores[1:]).all()
    s0, r0 = seg.search(query(k, [seg], ["date"]), 0, {}, None)
    assert s0.shape == (1, 0) and r0.shape == (1, 0)


# --------------------------------------------------------------------------- snapshots

def merged_topk(segs, k, prepared, allows, kk):
    """Search every segment, map rows to global positions, merge (score desc, id asc)."""
    base, cand = 0, []
    for seg, allow in zip(segs, allows):
        s, r = seg.search(prepared, kk, {}, allow)
        for q in range(s.shape[0]):
            cand += [(q, -float(x), base + int(y)) for x, y in zip(s[q], r[q]) if y >= 0]
        base += seg.n_rows
    out = []
    for q in range(len(prepared.terms)):
        got = sorted((c[1], c[2]) for c in cand if c[0] == q)[:kk]
        out.append(([g for _, g in got], [-s for s, _ in got]))
    return out


def test_segmentation_independence(tmp_path):
    texts = random_corpus(90, seed=1)
    queries = ["w1 w3 alpha", "gamma w7 w7", "w20 w33 beta delta", "w0"]
    k = kind()
    one = build(k, texts, tmp_path / "one")
    parts = [texts[:25], texts[25:70], texts[70:]]
    three = [build(k, part, tmp_path / f"p{i}") for i, part in enumerate(parts)]
    p1 = query(k, [one], queries)
    p3 = query(k, three, queries)
    assert (p1.n_docs, p1.avgdl) == (p3.n_docs, p3.avgdl) and p1.weights == p3.weights
    r1 = merged_topk([one], k, p1, [None], 15)
    r3 = merged_topk(three, k, p3, [None] * 3, 15)
    for (ids1, sc1), (ids3, sc3) in zip(r1, r3):
        assert ids1 == ids3 and len(ids1) > 0
        np.testing.assert_allclose(sc1, sc3, atol=1e-6)
    # the same with tombstones and filters spread over the segments
    rng = np.random.default_rng(5)
    live = rng.random(90) > 0.3
    allow = live & (rng.random(90) > 0.2)
    cuts = [0, 25, 70, 90]
    p1 = query(k, [one], queries, live=[live])
    p3 = query(k, three, queries, live=[live[a:b] for a, b in zip(cuts, cuts[1:])])
    r1 = merged_topk([one], k, p1, [allow], 15)
    r3 = merged_topk(three, k, p3, [allow[a:b] for a, b in zip(cuts, cuts[1:])], 15)
    for (ids1, sc1), (ids3, sc3) in zip(r1, r3):
        assert ids1 == ids3
        assert all(allow[i] for i in ids1)
        np.testing.assert_allclose(sc1, sc3, atol=1e-6)


def test_allow_mask_excludes_rows(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    p = query(k, [seg], ["cherry banana"])
    _, rows = seg.search(p, 4, {}, None)
    assert set(rows[0].tolist()) == {0, 1, 2, -1}
    allow = np.array([True, False, True, True])
    s, rows = seg.search(p, 4, {}, allow)
    assert set(rows[0].tolist()) == {0, 2, -1} and 1 not in rows[0]
    full = seg.score(p, np.array([0, 2]))[0]
    got = dict(zip(rows[0].tolist(), s[0].tolist()))
    np.testing.assert_allclose([got[0], got[2]], full, rtol=1e-7)  # the mask filters, not rescores
    s, rows = seg.search(p, 4, {}, np.zeros(4, bool))
    assert (rows == -1).all()


def test_tombstones_change_collection_statistics(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path / "all")
    live = np.array([True, True, False, True])  # doc 2 (cherry x3, date) deleted
    cache: dict = {}
    p = query(k, [seg], ["cherry apple"], live=[live], cache=cache)
    assert p.n_docs == 3 and p.avgdl == pytest.approx((3 + 2 + 1) / 3)
    idf_cherry = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))  # df over live docs: 1, not 2
    assert p.weights[0][0] == pytest.approx(idf_cherry)
    assert cache["lexical:stats"] == (3, p.avgdl) and cache["lexical:df"]["cherri"] == 1
    # identical to an index built without the deleted doc
    rebuilt = build(k, [t for t, ok in zip(TINY, live) if ok], tmp_path / "rebuilt")
    pr = query(k, [rebuilt], ["cherry apple"])
    s, r = seg.search(p, 3, {}, live)
    sr, rr = rebuilt.search(pr, 3, {}, None)
    back = np.array([0, 1, 3])
    assert r[0].tolist() == back[rr[0][rr[0] >= 0]].tolist() + [-1] * int((rr[0] < 0).sum())
    np.testing.assert_array_equal(s, sr)
    # a term only deleted docs contain matches nothing
    s, r = seg.search(query(k, [seg], ["date"], live=[live]), 3, {}, None)
    assert (r == -1).all()


def test_snapshot_cache_is_reused(tmp_path):
    k = kind()
    seg = build(k, TINY, tmp_path)
    cache = {"lexical:stats": (100, 2.5), "lexical:df": {"appl": 1}}
    p = query(k, [seg], ["apple"], cache=cache)  # uses the cached (here: fake) statistics
    assert p.n_docs == 100 and p.weights[0][0] == pytest.approx(math.log(1 + 99.5 / 1.5))


def test_save_open_round_trip(tmp_path):
    k = kind()
    texts = random_corpus(50, seed=3)
    seg = build(k, texts, tmp_path / "a", titles=[f"title {i}" for i in range(50)])
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    info = k.build(BuildBatch([f"d{i}" for i in range(50)], [f"title {i}" for i in range(50)],
                              texts), tmp_path / "c")
    assert sorted(info["files"]) == sorted(p.name for p in (tmp_path / "c").iterdir())
    for name in info["files"]:  # deterministic build
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()
    again = k.open(tmp_path / "b", info)
    assert again.n_rows == 50 and not again.P[3].flags.writeable  # memory-mapped, read-only
    qs = ["w1 w2", "title 7 alpha", "gamma"]
    pa_, pb = query(k, [seg], qs), query(k, [again], qs)
    for x, y in zip(seg.search(pa_, 12, {}, None), again.search(pb, 12, {}, None)):
        np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(seg.score(pa_, np.arange(50)), again.score(pb, np.arange(50)))


def test_empty_segment_and_empty_docs(tmp_path):
    k = kind()
    empty = build(k, [], tmp_path / "e")
    seg = build(k, ["", "the of", "apple"], tmp_path / "s")
    p = query(k, [empty, seg], ["apple"])
    assert p.n_docs == 3
    s, r = empty.search(p, 3, {}, None)
    assert (r == -1).all()
    s, r = seg.search(p, 3, {}, None)
    assert r[0].tolist() == [2, -1, -1]


# --------------------------------------------------------------------------- postings

def test_numba_topk_matches_numpy_argsort():
    rng = np.random.default_rng(0)
    for trial in range(50):
        n = int(rng.integers(1, 400))
        scores = np.round(rng.standard_normal(n), 1).astype(np.float32)  # many ties
        rows = rng.choice(n, size=int(rng.integers(0, n + 1)), replace=False)
        k = int(rng.integers(1, 60))
        got_s, got_r = postings.topk_rows(scores, rows, k)
        order = rows[np.lexsort((rows, -scores[rows]))][:k]  # score desc, row asc
        m = len(order)
        assert got_r[:m].tolist() == order.tolist()
        np.testing.assert_array_equal(got_s[:m], scores[order])
        assert (got_r[m:] == -1).all() and np.isneginf(got_s[m:]).all()


def test_build_csr_groups_terms_and_merges_duplicates():
    t = np.array([2, 0, 2, 1, 0, 2])
    d = np.array([5, 3, 1, 0, 3, 1])
    w = np.array([1.0, 0.5, 2.0, 1.0, 0.25, 3.0], np.float32)
    offsets, docs, vals = postings.build_csr(t, d, w, 4)
    assert offsets.tolist() == [0, 1, 2, 4, 4]
    assert docs.tolist() == [3, 0, 1, 5] and docs.dtype == np.int32
    assert vals.tolist() == [0.75, 1.0, 5.0, 1.0]
    offsets, docs, tf = postings.build_csr(t, d, None, 4)
    assert tf.tolist() == [2, 1, 2, 1] and tf.dtype == np.int32


def test_dot_kernels_for_sparse_vectors():
    offsets, docs, vals = postings.build_csr(np.array([0, 0, 1, 1]), np.array([0, 2, 2, 1]),
                                             np.array([1.0, 2.0, 0.5, 4.0], np.float32), 2)
    pool = postings.BufferPool(3)
    qptr, qt, qw = np.array([0, 2]), np.array([0, 1]), np.array([1.0, 2.0])
    s, r = postings.run_search(postings.dot_search, (offsets, docs, vals, qptr, qt, qw),
                               pool, 1, 4, None)
    assert r[0].tolist() == [1, 2, 0, -1] and s[0, :3].tolist() == [8.0, 3.0, 1.0]
    out = np.empty((1, 3), np.float32)
    postings.dot_score_rows(offsets, docs, vals, 3, qptr, qt, qw, np.array([2, 0, 7]), out)
    assert out[0, :2].tolist() == [3.0, 1.0] and np.isnan(out[0, 2])


# --------------------------------------------------------------------------- bm25s parity

def _load_beir(root: Path):
    corpus = [json.loads(line) for line in open(root / "corpus.jsonl", encoding="utf-8")]
    queries = [json.loads(line) for line in open(root / "queries.jsonl", encoding="utf-8")]
    return corpus, queries


@pytest.mark.skipif(not (DATA / "cranfield").is_dir(), reason="../shared/data/cranfield not present")
def test_cranfield_top10_agrees_with_bm25s(tmp_path):
    bm25s = pytest.importorskip("bm25s")
    corpus, queries = _load_beir(DATA / "cranfield")
    assert len(corpus) == 1400 and len(queries) == 225
    k = kind()
    seg = build(k, [d["text"] for d in corpus], tmp_path, titles=[d.get("title", "") for d in corpus])
    _, ours = seg.search(query(k, [seg], [q["text"] for q in queries]), 10, {}, None)

    analyzer = Analyzer()
    retriever = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    retriever.index(analyzer.analyze_many(f"{d.get('title', '')} {d['text']}" for d in corpus),
                    show_progress=False)
    theirs, _ = retriever.retrieve([analyzer.analyze(q["text"]) for q in queries], k=10,
                                   show_progress=False)
    same = sum(set(o[o >= 0].tolist()) == set(t.tolist()) for o, t in zip(ours, theirs))
    assert same >= 0.95 * len(queries), f"only {same}/{len(queries)} identical top-10 sets"
