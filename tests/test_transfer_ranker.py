"""The transfer ranker (issue 21 part 1): its added features by hand, the normalized transform,
and the guard that falls back to hybrid's order."""
import math

import numpy as np
import pytest

import polyindex
from polyindex.query.candidates import collect
from polyindex.query.profiles import HYBRID, LTR
from polyindex.rerank import registry, schema, window
from polyindex.rerank.ltr import Ranker, model_names, transform

# Every word stems to itself and none is a stopword (as tests/test_rerank.py).
DOCS = [
    {"_id": "d1", "title": "wing flutter", "text": "flutter wing model"},
    {"_id": "d2", "title": "heat", "text": "wing heat transfer"},
    {"_id": "d3", "title": "", "text": "flutter flutter model test"},
    {"_id": "d4", "title": "cake", "text": "sugar cake butter"},
]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    c = polyindex.open(tmp_path_factory.mktemp("tr")).create_collection("small", ["lexical", "dense"])
    c.add(DOCS)
    return c


def features(coll, text, profile="hybrid"):
    cand = collect(coll, [("q", text)], None, profile=profile, window=10)
    return cand, {d: dict(zip(schema.NAMES, cand.X[i].tolist())) for i, d in enumerate(cand.doc_ids)}


def test_query_difficulty_agreement_and_fused_score_by_hand(small):
    _, f = features(small, "wing flutter")
    # "all" field: wing in d1, d2 (cf 3), flutter in d1, d3 (cf 4), 17 terms, 4 documents
    idf = math.log(1 + (4 - 2 + 0.5) / (2 + 0.5))
    clarity = 0.5 * math.log(0.5 / (3 / 17)) + 0.5 * math.log(0.5 / (4 / 17))
    for d in f.values():
        assert d["q_idf_max"] == pytest.approx(idf) and d["q_idf_mean"] == pytest.approx(idf)
        assert d["q_clarity"] == pytest.approx(clarity, rel=1e-5)
        assert 0 < d["doc_quality"] < 1  # the stored estimate (rerank.doc_quality)
    weight = HYBRID["fuse"]["weights"]["dense"]
    for name, d in f.items():
        ranks = [r for r in (d["lexical_rank"], d["dense_rank"]) if not math.isnan(r)]
        assert d["n_found"] == len(ranks), name
        assert d["best_rank"] == min(ranks) and d["mean_rank"] == pytest.approx(np.mean(ranks))
        # the profile's own fusion (dense weighted), not the unweighted rrf feature
        fused = sum(w / (60 + r) for w, r in ((1, d["lexical_rank"]), (weight, d["dense_rank"]))
                    if not math.isnan(r))
        assert d["fused_score"] == pytest.approx(fused, rel=1e-6)
    assert f["d4"]["n_found"] == 1 and math.isnan(f["d4"]["lexical_rank"])  # dense only


def test_document_quality_estimators_by_hand(small):
    _, f = features(small, "wing flutter")
    # d1 "all": [wing flutter flutter wing model]; collection cf wing 3, flutter 4, model 2 of 17
    assert f["d1"]["doc_unique_ratio"] == pytest.approx(3 / 5)
    kl = 0.4 * math.log(0.4 / (3 / 17)) + 0.4 * math.log(0.4 / (4 / 17)) + 0.2 * math.log(0.2 / (2 / 17))
    assert f["d1"]["doc_kl_coll"] == pytest.approx(kl, rel=1e-5)
    # d4 [cake sugar cake butter]: cake 2 of 17, sugar and butter 1 each
    assert f["d4"]["doc_unique_ratio"] == pytest.approx(3 / 4)
    kl4 = 0.5 * math.log(0.5 / (2 / 17)) + 2 * 0.25 * math.log(0.25 / (1 / 17))
    assert f["d4"]["doc_kl_coll"] == pytest.approx(kl4, rel=1e-5)


def test_a_query_without_known_terms_has_no_difficulty_values(small):
    _, f = features(small, "zebra")
    assert all(math.isnan(d["q_idf_max"]) and math.isnan(d["q_clarity"]) for d in f.values())


def test_query_moments_equal_numpy():
    a = np.array([[1.0, -2.0], [3.0, np.nan], [5.0, -4.0], [2.0, 7.0], [2.0, 7.0]], np.float32)
    qptr = np.array([0, 3, 5], np.int64)
    z, ratio = np.empty_like(a), np.empty_like(a)
    window.query_moments(a, qptr, z, ratio)
    q0 = np.array([1.0, 3.0, 5.0])
    np.testing.assert_allclose(z[:3, 0], (q0 - q0.mean()) / q0.std(), rtol=1e-6)
    np.testing.assert_allclose(ratio[:3, 0], q0 / 5.0, rtol=1e-6)
    assert math.isnan(z[1, 1]) and math.isnan(ratio[1, 1])       # NaN stays NaN
    assert np.isnan(ratio[[0, 2], 1]).all()                        # maximum -2: no ratio
    np.testing.assert_allclose(z[[0, 2], 1], [1.0, -1.0], rtol=1e-6)
    assert (z[3:] == 0).all() and (ratio[3:] == 1).all()           # constant within query 2


def test_normalized_transform_layout(small):
    cand, _ = features(small, "wing flutter")
    out = transform("normalized", cand.X, cand.qptr)
    names = model_names("normalized")
    assert out.shape == (len(cand.X), len(names))
    k = len(schema.NORMALIZED)
    col = schema.NORMALIZED.index("dense_cos")
    dense = cand.X[:, schema.INDEX["dense_cos"]]
    assert names[col] == "dense_cos@rank" and names[2 * k + col] == "dense_cos@max"
    np.testing.assert_allclose(out[:, 2 * k + col], dense / dense.max(), rtol=1e-6)
    assert out[np.argmax(dense), col] == 1.0  # the best cosine ranks last (highest fraction)
    np.testing.assert_array_equal(out[:, -1], cand.X[:, schema.INDEX["fused_score"]])


def test_ltr_window_is_hybrids_and_the_guard_falls_back_to_it(small, monkeypatch):
    assert LTR["retrieve"] == HYBRID["retrieve"] and LTR["fuse"] == HYBRID["fuse"]
    shipped = registry.resolve(small.view(), "general")
    assert shipped.transform == "normalized" and shipped.meta["prior"]["feature"] == "fused_score"
    assert 0 <= shipped.tree_weight <= 1
    guarded = Ranker(shipped.booster, {**shipped.meta, "tree_weight": 0.0}, "guarded")
    monkeypatch.setattr(registry, "resolve", lambda snap, name: guarded)
    assert guarded.falls_back() and not Ranker(shipped.booster, {**shipped.meta, "tree_weight": 0.5},
                                                 "half").falls_back()
    for text in ("wing flutter", "heat model", "cake sugar"):
        want = [h.id for h in small.query(text, k=4, profile="hybrid")]
        assert [h.id for h in small.query(text, k=4, profile="ltr")] == want
        # explain computes the features and scores through the trees: the same order
        hits = small.query(text, k=4, profile="ltr", explain=True)
        assert [h.id for h in hits] == want and hits[0].explain["rerank"]["features"]


def test_the_general_ranker_never_splits_on_the_stored_quality(small):
    """``doc_quality`` depends on which batch (and, sharded, which shard) first wrote the
    collection: the general ranker must not use it, even where it predicts every label."""
    from polyindex.rerank.train import Candidates, fit
    rng = np.random.default_rng(3)
    parts = []
    for _ in range(2):  # two "collections" of 40 queries x 20 candidates
        n, nq = 800, 40
        labels = (rng.random(n) < 0.2).astype(np.float32)
        X = rng.normal(size=(n, len(schema.NAMES))).astype(np.float32)
        X[:, schema.INDEX["doc_quality"]] = labels + 0.01 * rng.random(n)  # a perfect predictor
        fused = X[:, schema.INDEX["fused_score"]] = rng.random(n) / 60
        parts.append(Candidates([f"q{i}" for i in range(nq)], X, np.arange(0, n + 1, 20),
                                labels, [f"d{i}" for i in range(n)], fused.copy()))
    ranker = fit(parts, None, transform="normalized", general=True, max_rounds=20,
                 prior_feature="fused_score")
    split = dict(zip(ranker.names, ranker.booster.feature_importance("split")))
    assert split["doc_quality"] == 0 and sum(split.values()) > 0
    shipped = registry.resolve(small.view(), "general")
    assert dict(zip(shipped.names, shipped.booster.feature_importance("split")))["doc_quality"] == 0


def test_the_shipped_general_ranker_uses_maxsim_where_a_collection_has_it(small):
    """The shipped model trained on every window with its MaxSim feature and with it missing
    (bench_ltr ``--multivector``), so it splits on MaxSim's normalized inputs."""
    shipped = registry.resolve(small.view(), "general")
    split = dict(zip(shipped.names, shipped.booster.feature_importance("split")))
    assert sum(v for n, v in split.items() if n.startswith("multivector_maxsim@")) > 0
