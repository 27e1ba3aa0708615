"""Pseudo-relevance feedback: RM3 on the lexical index, Rocchio on the dense index, and the
built-in profiles that use them. Expected values are computed here from the formulas."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from polyindex.errors import InvalidArgument
from polyindex.index.dense.kind import DenseKind
from polyindex.index.lexical.kind import LexicalKind
from polyindex.index.protocol import BuildBatch, Query

# Every word is its own stem and no stopword, so terms are the words.
DOCS = ["river ocean ocean reef",                   # d0
        "river forest",                             # d1
        "ocean reef reef glacier",                  # d2
        "desert canyon",                            # d3
        "forest forest valley",                     # d4
        "marsh harbor valley",                      # d5
        "river desert desert desert desert desert"]  # d6
RM3_PARAMS = {"prf": "rm3", "fb_docs": "2", "fb_terms": "2", "orig_weight": "0.5",
              "fb_max_df": "0.3"}


def build(k, texts, folder: Path, offset: int = 0):
    ids = [f"d{offset + i}" for i in range(len(texts))]
    info = k.build(BuildBatch(ids, [""] * len(texts), list(texts)), folder)
    return k.open(folder, json.loads(json.dumps(info)))


def prepare(k, segs, texts, params, live=None):
    return k.prepare([Query(text=t) for t in texts], segs, live or [None] * len(segs),
                     params, {})


def expected_rm3():
    """RM3 of the query "river" over DOCS with RM3_PARAMS, by hand from the formula."""
    n, lens = 7, [4, 2, 4, 2, 3, 3, 6]
    avgdl = sum(lens) / n
    k1, b = 1.5, 0.75

    def idf(df):
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def bm25(tf, dl, df):
        return idf(df) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))

    # first pass: river (df 3) is in d0, d1, d6; d1 (shortest) then d0 are the 2 feedback docs
    s1, s0 = bm25(1, 2, 3), bm25(1, 4, 3)
    assert s1 > s0 > bm25(1, 6, 3)
    # fb_max_df 0.3 x 7 docs = 2.1: river (df 3) leaves the document vectors.
    # P(t|d0) = {ocean: 2/3, reef: 1/3}, P(t|d1) = {forest: 1}
    rm1 = {"forest": s1 * 1.0, "ocean": s0 * 2 / 3, "reef": s0 * 1 / 3}
    top = dict(sorted(rm1.items(), key=lambda kv: -kv[1])[:2])  # fb_terms 2: reef is cut
    assert set(top) == {"forest", "ocean"}
    total = sum(top.values())
    weights = {"river": 0.5 * 1.0, **{t: 0.5 * v / total for t, v in top.items()}}
    dfs = {"river": 3, "forest": 2, "ocean": 2}
    return weights, {t: w * idf(dfs[t]) for t, w in weights.items()}, bm25


def test_rm3_terms_and_weights_equal_hand_computed(tmp_path):
    k = LexicalKind("")
    seg = build(k, DOCS, tmp_path)
    p = prepare(k, [seg], ["river"], RM3_PARAMS)
    weights, idf_weights, bm25 = expected_rm3()
    assert p.expansion[0] == pytest.approx(weights)
    assert sorted(p.terms[0]) == sorted(idf_weights)
    got = dict(zip(p.terms[0], p.weights[0]))
    assert got == pytest.approx(idf_weights)
    # the expanded query scores d2 (ocean x1, no river/forest) as sum_t w idf tfc
    scores = seg.score(p, np.arange(7))[0]
    tfc_over_idf = bm25(1, 4, 2) / math.log(1 + (7 - 2 + 0.5) / 2.5)
    assert scores[2] == pytest.approx(weights["ocean"] * math.log(1 + 5.5 / 2.5) * tfc_over_idf,
                                      rel=1e-6)
    # fb_doc_terms=1 (Anserini's cut): d0 keeps only ocean (tf 2 beats reef's 1) -> P = 1
    cut = prepare(k, [seg], ["river"], {**RM3_PARAMS, "fb_doc_terms": "1"}).expansion[0]
    s1, s0 = bm25(1, 2, 3), bm25(1, 4, 3)
    assert cut == pytest.approx({"river": 0.5, "forest": 0.5 * s1 / (s1 + s0),
                                 "ocean": 0.5 * s0 / (s1 + s0)})
    # and feedback changes the ranking: d4 (forest x2) now beats d6 (river, long)
    plain = seg.score(prepare(k, [seg], ["river"], {}), np.arange(7))[0]
    assert plain[4] == 0 and scores[4] > scores[6]


def test_rm3_no_feedback_keeps_the_query(tmp_path):
    k = LexicalKind("")
    seg = build(k, DOCS, tmp_path)
    p = prepare(k, [seg], ["volcano river"], {**RM3_PARAMS, "fb_max_df": "0.1"})
    # 0.1 x 7 < 1: every term is filtered from the documents; volcano is in no document
    assert p.expansion[0] == {"volcano": 0.5, "river": 0.5} and p.terms[0] == ["river"]


def test_rm3_feedback_is_global_over_segments(tmp_path):
    """Split so d6 (third by score) shares a segment with d0: per-segment top-2 feedback
    would use d6 as well; the global top 2 (d1, d0) gives the single-segment expansion."""
    k = LexicalKind("")
    whole = build(k, DOCS, tmp_path / "whole")
    parts = [build(k, [DOCS[0], DOCS[6]], tmp_path / "a"),
             build(k, [DOCS[1], DOCS[2]], tmp_path / "b"),
             build(k, DOCS[3:6], tmp_path / "c")]
    pw = prepare(k, [whole], ["river"], RM3_PARAMS)
    ps = prepare(k, parts, ["river"], RM3_PARAMS)
    assert ps.expansion == pw.expansion and ps.terms == pw.terms
    np.testing.assert_allclose(ps.weights, pw.weights, rtol=1e-12)
    order = [0, 6, 1, 2, 3, 4, 5]
    split = np.concatenate([s.score(ps, np.arange(s.n_rows))[0] for s in parts])
    np.testing.assert_allclose(split, whole.score(pw, np.arange(7))[0][order], rtol=1e-6)
    # a deleted feedback document is not feedback (and changes the collection statistics)
    live = [np.array([False, True]), None, None]  # d0 deleted
    pd = prepare(k, parts, ["river"], RM3_PARAMS, live)
    assert "ocean" not in pd.expansion[0]


def test_prf_params_are_validated(tmp_path):
    k = LexicalKind("")
    seg = build(k, DOCS, tmp_path)
    with pytest.raises(InvalidArgument, match="knows prf=rm3"):
        prepare(k, [seg], ["river"], {"prf": "rocchio"})
    with pytest.raises(InvalidArgument, match="fb_docs need prf=rm3"):
        prepare(k, [seg], ["river"], {"fb_docs": "3"})
    with pytest.raises(InvalidArgument, match="orig_weight must be in"):
        prepare(k, [seg], ["river"], {"prf": "rm3", "orig_weight": "2"})
    with pytest.raises(InvalidArgument, match="fb_terms=.x. is not an integer"):
        prepare(k, [seg], ["river"], {"prf": "rm3", "fb_terms": "x"})
    p = prepare(k, [seg], ["river"], RM3_PARAMS)
    seg.search(p, 3, RM3_PARAMS, None)  # the stage's params reach search too: accepted


def _unit(v):
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def test_rocchio_moves_the_query_to_its_global_top_documents(tmp_path):
    x = _unit([[1, 0, 0], [0.9, 0.1, 0], [0, 1, 0], [0.8, 0, 0.6], [0, 0, 1], [-1, 0, 0]])
    k = DenseKind("Flat")

    def seg(rows, name):
        folder = tmp_path / name
        folder.mkdir()
        info = k.build(BuildBatch([f"d{i}" for i in rows], [""] * len(rows), [""] * len(rows),
                                  embeddings=x[rows]), folder)
        return k.open(folder, info)

    segs = [seg([0, 4], "a"), seg([1, 2, 5], "b"), seg([3], "c")]
    q = _unit([1, 0.05, 0.02])
    params = {"prf": "rocchio", "fb_docs": "2", "orig_weight": "0.5"}
    got = k.prepare([Query(vector=q)], segs, [None] * 3, params, {})
    # nearest two over all segments: d0 (segment a) and d1 (segment b)
    expect = _unit(0.5 * q + 0.5 * (x[0] + x[1]) / 2)
    np.testing.assert_allclose(got[0], expect, rtol=1e-6)
    scores, rows = segs[2].search(got, 1, params, None)  # params reach search: accepted
    assert scores[0, 0] == pytest.approx(float(expect @ x[3]), rel=1e-6)
    plain = k.prepare([Query(vector=q)], segs, [None] * 3, {}, {})
    np.testing.assert_array_equal(plain[0], q)
    with pytest.raises(InvalidArgument, match="knows prf=rocchio"):
        k.prepare([Query(vector=q)], segs, [None] * 3, {"prf": "rm3"}, {})


def test_prf_profiles_in_a_collection(tmp_path):
    import polyindex
    coll = polyindex.open(tmp_path).create_collection("c", ["lexical"])
    # 30 unrelated documents: with the default fb_max_df (0.1) ocean, reef and forest (df 2)
    # stay feedback terms
    filler = [f"zz{i} yy{i}" for i in range(30)]
    coll.add([{"id": f"d{i}", "text": t} for i, t in enumerate(DOCS + filler)])
    profiles = coll.profiles()
    assert "lexical-prf" in profiles and "hybrid-prf" not in profiles  # no dense index
    plain = [h.id for h in coll.query("river", k=7, profile="lexical")]
    fed = [h.id for h in coll.query("river", k=7, profile="lexical-prf")]
    assert plain == ["d1", "d0", "d6"]
    assert set(plain) < set(fed)  # expansion terms reach documents without "river"
