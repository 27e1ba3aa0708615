"""Other index kinds' own scores in the rerank stage: as LightGBM features and as a rescore stage."""
import math

import numpy as np
import pytest
from topic_docs import TOPIC_DOCS as DOCS

import polyindex
from polyindex import InvalidArgument
from polyindex.query.candidates import collect
from polyindex.rerank import schema

HYBRID = {"retrieve": [{"index": "lexical", "k": 1000}, {"index": "dense", "k": 100}],
          "fuse": {"method": "rrf", "k": 60}}


@pytest.fixture(scope="module")
def coll(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("ks")
    c = polyindex.open(tmp).create_collection(
        "s", ["lexical", "dense", "sparse:UHD4096,k=16,epochs=2,rescore=0"], segment_size=100)
    filler = corpus.make(tmp / "filler.jsonl", 150, seed=3, dup_frac=0.0, words=12)
    c.add(filler + DOCS)  # two segments: scores must not depend on where a row lives
    c.delete(["d7"])
    return c


def sparse_scores(coll, text):
    """The sparse kind's own score of every document it retrieves for ``text`` (pure: rescore=0)."""
    return {h.id: h.score for h in coll.query(text, profile="sparse", k=1000)}


def test_kind_score_feature_equals_the_kinds_own_score(coll):
    text = "chocolate cake with butter"
    own = sparse_scores(coll, text)
    cand = collect(coll, [("q", text)], None, profile="hybrid", window=40)
    col = schema.INDEX[schema.KIND_SCORES["sparse"]]
    checked = 0
    for i, doc in enumerate(cand.doc_ids):
        value = float(cand.X[i, col])
        if doc in own:
            assert value == pytest.approx(own[doc], rel=1e-5, abs=1e-6)
            checked += 1
        else:  # not retrieved by sparse: a zero overlap (or missing), never a made-up score
            assert math.isnan(value) or value <= min(own.values()) + 1e-6
    assert checked >= 5
    assert "d7" not in cand.doc_ids
    # kinds the collection lacks are missing, not zero
    assert np.isnan(cand.X[:, schema.INDEX[schema.KIND_SCORES["tree"]]]).all()


def test_rescore_stage_reorders_the_window_by_the_kind(coll):
    text = "heat transfer in hypersonic flow"
    window = 15
    profile = {**HYBRID, "rerank": {"index": "sparse", "window": window}}
    hybrid = coll.query(text, k=window, profile="hybrid")
    hits = coll.query(text, k=window, profile=profile, explain=True)
    assert {h.id for h in hits} == {h.id for h in hybrid}  # the same window, reordered
    own = sparse_scores(coll, text)
    scored = [h for h in hits if h.id in own]
    assert [h.id for h in scored] == [h.id for h in sorted(scored, key=lambda h: -own[h.id])]
    for h in scored:
        assert h.score == pytest.approx(own[h.id], rel=1e-5, abs=1e-6)
        assert h.explain["rerank"]["sparse_score"] == pytest.approx(own[h.id], rel=1e-5, abs=1e-6)
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].id == "heat"


def test_rescore_profile_errors_are_clear(coll):
    with pytest.raises(InvalidArgument, match="either a 'model'.*or an 'index'"):
        coll.query("x", profile={**HYBRID, "rerank": {"model": "general", "index": "sparse"}})
    with pytest.raises(InvalidArgument, match="rerank.index names 'tree'"):
        coll.query("x", profile={**HYBRID, "rerank": {"index": "tree"}})


def test_models_trained_before_kind_scores_still_serve(coll):
    # A model trained on the version-1 names (the prefix before the kind scores and the
    # transfer ranker's features, as the general ranker shipped before issue 21) reads its
    # columns by name from today's feature matrix.
    import lightgbm as lgb

    from polyindex.rerank.ltr import Ranker, new_meta
    v1 = schema.NAMES[:schema.INDEX["sparse_sim"]]
    rng = np.random.default_rng(0)
    booster = lgb.train({"objective": "regression", "verbose": -1, "num_threads": 1,
                         "min_data_in_leaf": 5}, lgb.Dataset(rng.random((200, len(v1))),
                                                             rng.random(200)), num_boost_round=3)
    ranker = Ranker(booster, new_meta("raw", 0.0, v1), "old model")
    assert set(schema.KIND_SCORES.values()).isdisjoint(ranker.base)
    cand = collect(coll, [("q", "heat transfer")], None, profile=HYBRID, window=10)
    assert cand.X.shape[1] > len(v1)
    np.testing.assert_allclose(ranker.predict(cand.X, cand.qptr),
                               booster.predict(cand.X[:, :len(v1)]), rtol=1e-6)
