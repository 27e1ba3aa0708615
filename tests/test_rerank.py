"""The rerank stage: hand-checked features, training, schema versions, serving and explain."""
import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

import polyindex
import polyindex.cli.main
from polyindex import InvalidArgument
from polyindex.query.candidates import collect
from polyindex.rerank import registry, schema
from polyindex.rerank.ltr import Ranker
from polyindex.rerank.stats import _build_forward, forward_index

# Every word below stems to itself and none is a stopword, so the analyzed terms are the words.
DOCS = [
    {"_id": "d1", "title": "wing flutter", "text": "flutter wing model"},
    {"_id": "d2", "title": "heat", "text": "wing heat transfer"},
    {"_id": "d3", "title": "", "text": "flutter flutter model test"},
    {"_id": "d4", "title": "cake", "text": "sugar cake butter"},
    {"_id": "gone", "title": "wing wing", "text": "flutter flutter flutter"},
]
HYBRID = {"retrieve": [{"index": "lexical", "k": 1000}, {"index": "dense", "k": 100}],
          "fuse": {"method": "rrf", "k": 60}}


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    eng = polyindex.open(tmp_path_factory.mktemp("rr"))
    c = eng.create_collection("small", ["lexical", "dense"], segment_size=2)
    c.add(DOCS[:2])
    c.add(DOCS[2:])  # two segments: statistics must be collection-wide
    c.delete(["gone"])  # ... and over live rows only
    return c


def features_of(coll, text, profile="hybrid"):
    cand = collect(coll, [("q", text)], None, profile=profile, window=10)
    return {d: dict(zip(schema.NAMES, cand.X[i].tolist())) for i, d in enumerate(cand.doc_ids)}


def bm25(tf, dl, avg, df, n, k1, b):
    return math.log(1 + (n - df + 0.5) / (df + 0.5)) * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avg))


def test_features_equal_hand_computed_values(small):
    f = features_of(small, "wing flutter")
    assert set(f) == {"d1", "d2", "d3", "d4"}
    # Field "all" (title + text), live rows: d1 [wing flutter flutter wing model],
    # d2 [heat wing heat transfer], d3 [flutter flutter model test], d4 [cake sugar cake butter]
    n, avg = 4, 17 / 4
    d1, d3, d4 = f["d1"], f["d3"], f["d4"]
    assert d1["all.length"] == 5 and d1["title.length"] == 2 and d1["body.length"] == 3
    assert d1["all.length_norm"] == pytest.approx(5 / avg)
    expected = 2 * bm25(2, 5, avg, 2, n, 1.2, 0.75)  # wing and flutter: tf 2, df 2 each
    assert d1["all.bm25_k1.2_b0.75"] == pytest.approx(expected, rel=1e-5)
    assert d1["all.bm25_k0.9_b0.4"] == pytest.approx(2 * bm25(2, 5, avg, 2, n, 0.9, 0.4), rel=1e-5)
    # title: d1 [wing flutter], d2 [heat], d3 [], d4 [cake]: average length 1, df 1 each
    assert d1["title.bm25_k1.2_b0.75"] == pytest.approx(2 * bm25(1, 2, 1.0, 1, n, 1.2, 0.75), rel=1e-5)
    assert d1["title.tfidf_cos"] == pytest.approx(1.0)
    assert d1["all.matched"] == 2 and d1["all.matched_frac"] == 1.0
    assert d1["all.tf_sum"] == 4 and d1["all.tf_max"] == 2
    assert d1["all.idf_sum"] == pytest.approx(2 * math.log(1 + 2.5 / 2.5), rel=1e-6)
    assert d1["all.min_window"] == 2 and d1["all.bigrams"] == 1 and d1["all.phrase"] == 1
    assert d1["body.bigrams"] == 0 and d1["body.min_window"] == 2  # [flutter wing model]
    # query likelihood, Dirichlet mu=100: collection frequencies wing 3, flutter 4 of 17 terms
    ql = math.log((0 + 100 * 3 / 17) / (4 + 100)) + math.log((2 + 100 * 4 / 17) / (4 + 100))
    assert d3["all.ql_dir_mu100"] == pytest.approx(ql, rel=1e-5)
    jm = math.log(0.4 * 3 / 17) + math.log(0.6 * 2 / 4 + 0.4 * 4 / 17)
    assert d3["all.ql_jm_l0.4"] == pytest.approx(jm, rel=1e-5)
    assert d3["all.matched"] == 1 and d3["all.min_window"] == 1 and d3["all.matched_frac"] == 0.5
    assert d3["title.length"] == 0 and d3["title.bm25_k1.2_b0.75"] == 0
    # d4 matches nothing: undefined values are NaN, not zero
    assert d4["all.matched"] == 0 and math.isnan(d4["all.min_window"])
    assert math.isnan(d4["all.idf_mean"]) and math.isnan(d4["lexical_rank"])
    assert d4["q_terms"] == 2 and d4["q_distinct"] == 2
    # dense PRF: cosine with the normalized mean embedding of the (here: all 4) candidates
    snap = small.view()
    emb = {i: e for seg in snap.segments
           for i, e in zip(seg.docs.ids, seg.indexes["dense"].matrix())}
    centroid = sum(emb[d] for d in f) / 4
    centroid /= np.linalg.norm(centroid)
    for d in f:
        assert f[d]["dense_prf_cos"] == pytest.approx(float(emb[d] @ centroid), abs=1e-5)
    for d in (d1, d3):  # fusion features: ranks and scores of the stages, RRF
        assert d["lexical_rank"] >= 1 and d["rrf"] == pytest.approx(
            1 / (60 + d["lexical_rank"]) + 1 / (60 + d["dense_rank"]))
        assert d["dense_cos"] == pytest.approx(d["dense_score"], abs=1e-5)


def test_features_do_not_depend_on_segmentation(small, tmp_path):
    one = polyindex.open(tmp_path).create_collection("one", ["lexical", "dense"])
    one.add(DOCS[:4])  # the same live documents, in one segment and without tombstones
    for text in ("wing flutter", "heat transfer model", "cake"):
        a, b = features_of(small, text), features_of(one, text)
        assert set(a) == set(b)
        for doc in a:
            for name in schema.NAMES:
                if name.startswith(("title.", "body.", "all.", "q_")):
                    np.testing.assert_allclose(a[doc][name], b[doc][name], rtol=1e-6, err_msg=name)


def test_features_after_writes_follow_the_live_rows(tmp_path):
    """Statistics are kept per segment and live mask and summed per term when read: after a
    delete and an upsert the next query's features are those of the live rows indexed
    fresh, nothing carried over from the snapshot before."""
    eng = polyindex.open(tmp_path)
    living = eng.create_collection("living", ["lexical", "dense"], segment_size=2)
    living.add(DOCS[:2])
    living.add(DOCS[2:])
    texts = ("wing flutter", "heat transfer model", "cake sugar")
    for text in texts:  # fills the first snapshot's statistics
        features_of(living, text)
    living.delete(["gone", "d2"])
    new = {"_id": "d5", "title": "wing", "text": "wing wing transfer sugar"}
    living.add([new, {**DOCS[0], "text": "flutter model model"}])  # d1 upserted
    fresh = eng.create_collection("fresh", ["lexical", "dense"])
    fresh.add([{**DOCS[0], "text": "flutter model model"}, DOCS[2], DOCS[3], new])
    # live: d1 [wing flutter | flutter model model], d3, d4, d5 [wing | wing wing transfer
    # sugar]: wing and flutter in 2 of 4 rows each (before the writes: 3 of 5 and 3 of 5)
    after = features_of(living, "wing flutter")
    assert after["d1"]["all.idf_sum"] == pytest.approx(2 * math.log(1 + 2.5 / 2.5), rel=1e-6)
    compared = 0
    for text in texts:
        a, b = features_of(living, text), features_of(fresh, text)
        assert set(a) == set(b) and "d2" not in a
        for doc in a:
            for name in schema.NAMES:
                if name.startswith(("title.", "body.", "all.", "q_", "doc_unique", "doc_kl")):
                    np.testing.assert_allclose(a[doc][name], b[doc][name], rtol=1e-6,
                                               err_msg=f"{text}: {doc} {name}")
                    compared += 1
    assert compared > 100


def test_counts_under_a_new_mask_are_the_last_counts_less_the_rows_it_hid(tmp_path,
                                                                         monkeypatch):
    """A write that hides rows costs the next features those rows: the field counts under
    the new mask are the previous mask's less theirs, equal to counting every live row;
    a mask that brings a row back is counted in full."""
    from polyindex.rerank import kernels
    from polyindex.rerank.stats import _local_counts, lexical_of
    words = "wing flutter heat model test cake sugar butter transfer shock".split()
    rng = np.random.default_rng(3)
    coll = polyindex.open(tmp_path).create_collection("c", ["lexical"], model=None)
    coll.add([{"id": f"d{i}", "title": " ".join(rng.choice(words, 2)),
               "text": " ".join(rng.choice(words, int(rng.integers(1, 12))))}
              for i in range(300)])
    opened = coll.view().segments[0]
    row_ptr, title_len, ids = forward_index(opened)
    count = kernels.field_counts

    def full(mask):
        return count(row_ptr, title_len, ids, lexical_of(opened).n_terms, True, mask)

    def same(got, want):
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)

    first = np.ones(300, bool)
    first[::7] = False
    same(_local_counts(opened, first), full(first))
    second = first.copy()
    second[3::11] = False  # a later write hides more rows
    monkeypatch.setattr(kernels, "field_counts", None)  # only the hidden rows are counted
    same(_local_counts(opened, second), full(second))
    back = second.copy()
    back[0] = True  # row 0 lives again: no subtraction can give it
    monkeypatch.setattr(kernels, "field_counts", count)
    same(_local_counts(opened, back), full(back))


def test_numba_forest_scores_like_lightgbm():
    import lightgbm as lgb

    from polyindex.rerank.forest import Forest
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 12)).astype(np.float32)
    X[rng.random(X.shape) < 0.1] = np.nan
    X[:, 3] = np.where(rng.random(3000) < 0.5, 0, X[:, 3])
    y = rng.integers(0, 3, 3000)
    for extra in ({}, {"zero_as_missing": True}, {"use_missing": False}):
        b = lgb.train({"objective": "lambdarank", "verbose": -1, "num_threads": 1,
                       "min_data_in_leaf": 20, **extra},
                      lgb.Dataset(X, y, group=[30] * 100), 40)
        np.testing.assert_array_equal(Forest(b.model_to_string()).predict(X), b.predict(X))


def test_lexical_only_profile_leaves_dense_ranks_missing(small):
    f = features_of(small, "flutter", profile="lexical")
    assert all(math.isnan(v["dense_rank"]) and math.isnan(v["dense_score"]) for v in f.values())


def test_forward_index_matches_a_rebuild_from_the_documents(small):
    snap = small.view()
    for seg in snap.segments:
        stored = forward_index(seg)
        rebuilt = _build_forward(seg.docs, seg.indexes["lexical"])
        for a, b in zip(stored, rebuilt):
            np.testing.assert_array_equal(a, b)


# --------------------------------------------------------------------------- training

TOPICS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "zeta", "iota",
          "lambda", "epsilon"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Relevant documents hold the topic in their title once; decoys repeat it in the body,
    so BM25 (and the hybrid order) prefers the decoys and a ranker can learn the title."""
    tmp = tmp_path_factory.mktemp("ltr")
    docs, queries, qrels = [], [], []
    rng = np.random.default_rng(0)
    filler = "river mountain ocean forest desert city harbor valley glacier canyon".split()
    for t, topic in enumerate(TOPICS):
        for j in range(3):
            words = " ".join(rng.choice(filler, 4))
            docs.append({"_id": f"r{t}_{j}", "title": f"{topic} report",
                         "text": f"{words} {topic} {words}"})
            docs.append({"_id": f"x{t}_{j}", "title": "notes",
                         "text": f"{topic} {topic} {topic} {words}"})
        queries.append({"_id": f"q{t}", "text": f"{topic}"})
        qrels += [f"q{t}\tr{t}_{j}\t1" for j in range(3)]
    (tmp / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    (tmp / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(qrels) + "\n")
    eng = polyindex.open(tmp / "data")
    coll = eng.create_collection("topics", ["lexical", "dense"])
    coll.add(docs)
    eng.close()  # train-ranker below is the directory's next writer
    from polyindex.rerank import train as train_mod
    old = dict(train_mod.PARAMS)
    train_mod.PARAMS.update(min_data_in_leaf=5)  # a tiny data set
    try:
        result = CliRunner().invoke(polyindex.cli.main.app, [
            "train-ranker", "--data", str(tmp / "data"), "--collection", "topics",
            "--queries", str(tmp / "queries.jsonl"), "--qrels", str(tmp / "qrels.tsv"),
            "--name", "mine", "--window", "20", "--log-features", str(tmp / "f.parquet"), "--json"])
    finally:
        train_mod.PARAMS.clear()
        train_mod.PARAMS.update(old)
    assert result.exit_code == 0, result.output
    coll = polyindex.open(tmp / "data").collection("topics")  # sees the new profile
    return coll, tmp, json.loads(result.output.strip().splitlines()[-1])


def _ndcg(run, qrels):
    import ir_measures
    from ir_measures import nDCG
    return ir_measures.calc_aggregate([nDCG @ 10], qrels, [
        ir_measures.ScoredDoc(q, d, s) for q, hits in run.items() for d, s in hits])[nDCG @ 10]


def test_trained_ranker_beats_the_hybrid_order_on_its_training_split(trained):
    coll, tmp, report = trained
    assert report["rounds"] >= 1 and report["features"] == len(schema.NAMES) >= 40
    assert "mine" in coll.profiles() and coll.profiles()["mine"]["rerank"] == {"model": "mine", "window": 20}
    qrels = {f"q{t}": {f"r{t}_{j}": 1 for j in range(3)} for t in range(len(TOPICS))}
    texts = [(f"q{t}", topic) for t, topic in enumerate(TOPICS)]
    from polyindex.rerank.train import split_queries
    train_idx, _ = split_queries(len(texts))
    train_q = [texts[i] for i in train_idx]
    runs = {}
    for profile in ("hybrid", "mine"):
        hits = coll.query_batch([t for _, t in train_q], k=10, profile=profile)
        runs[profile] = {q: [(h.id, h.score) for h in hs] for (q, _), hs in zip(train_q, hits)}
    split_qrels = {q: qrels[q] for q, _ in train_q}
    assert _ndcg(runs["mine"], split_qrels) > _ndcg(runs["hybrid"], split_qrels) + 0.1
    import pyarrow.parquet as pq
    logged = pq.read_table(tmp / "f.parquet")
    assert {"qid", "doc_id", "label", "split", "all.bm25_k1.2_b0.75"} <= set(logged.column_names)


def test_profile_with_rerank_reorders_and_explains(trained):
    coll, _, _ = trained
    hybrid = coll.query("gamma", k=20, profile="hybrid")
    hits = coll.query("gamma", k=20, profile="mine", explain=True)
    assert {h.id for h in hits} == {h.id for h in hybrid}  # the same window, reordered
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert hits[0].id.startswith("r")
    for h in hits:
        rr = h.explain["rerank"]
        assert rr["model_score"] == pytest.approx(h.score)
        assert set(rr["features"]) == set(schema.NAMES)
        contrib = rr["contributions"]
        assert "bias" in contrib and len(contrib) > len(schema.NAMES)
        assert sum(contrib.values()) == pytest.approx(h.score, abs=1e-6)  # SHAP is additive
        assert h.explain["stages"]["dense"] is not None  # stage ranks are still explained


def test_unknown_feature_schema_version_is_refused(trained):
    coll, tmp, _ = trained
    files = coll.table.artifacts()["ranker-mine"]
    folder = coll.folder / "artifacts" / "ranker-mine"
    meta_file = next(f for f in files if f.endswith(".json"))
    meta = json.loads((folder / meta_file).read_text())
    bad = tmp / "bad"
    bad.mkdir()
    model_file = next(f for f in files if f.endswith(".txt"))
    (bad / model_file).write_text((folder / model_file).read_text())
    (bad / meta_file).write_text(json.dumps({**meta, "schema_version": 999}))
    with pytest.raises(InvalidArgument, match="feature schema version 999.*retrain"):
        Ranker.load(bad, files, "ranker 'bad'")


def test_models_are_cached_and_unknown_names_refused(trained):
    coll, _, _ = trained
    snap = coll.view()
    assert registry.resolve(snap, "mine") is registry.resolve(snap, "mine")
    with pytest.raises(InvalidArgument, match="no trained ranker of that name"):
        coll.query("gamma", profile={**HYBRID, "rerank": {"model": "nope", "window": 10}})


def test_shipped_general_ranker_serves(trained):
    coll, _, _ = trained
    profile = "ltr" if "ltr" in coll.profiles() else \
        {**HYBRID, "rerank": {"model": "general", "window": 20}}
    hits = coll.query("delta", k=10, profile=profile, explain=True)
    assert len(hits) == 10 and hits[0].explain["rerank"]["features"]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
