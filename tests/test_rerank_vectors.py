"""LTR features per named vector field (``vec_sim@FIELD``): computed, trained on, refused
by a collection whose named fields differ (issue 18)."""
from __future__ import annotations

import numpy as np
import pytest

import polyindex
from polyindex.errors import InvalidArgument
from polyindex.query.candidates import collect, store
from polyindex.rerank import schema, train

TOPICS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta", "zeta", "iota",
          "lambda", "epsilon"]
D = 8
RETRIEVE = [{"index": "lexical", "k": 20}, {"index": "dense@image", "k": 20}]


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """Relevant documents' images lie near their topic's image; decoys repeat the topic in
    the text (BM25 prefers them) and have unrelated images: the image similarity is what a
    ranker must learn."""
    tmp = tmp_path_factory.mktemp("ltrvec")
    rng = np.random.default_rng(0)
    centers = unit(rng.standard_normal((len(TOPICS), D)))
    docs, images = [], {}
    for t, topic in enumerate(TOPICS):
        for j in range(3):
            images[f"r{t}_{j}"] = unit(centers[t] + 0.2 * rng.standard_normal(D))
            docs.append({"id": f"r{t}_{j}", "title": "report", "text": f"a {topic} note",
                         "vectors": {"image": images[f"r{t}_{j}"]}})
            images[f"x{t}_{j}"] = unit(rng.standard_normal(D))
            docs.append({"id": f"x{t}_{j}", "title": "notes", "text": f"{topic} {topic} {topic}",
                         "vectors": {"image": images[f"x{t}_{j}"]}})
    eng = polyindex.open(tmp / "data")
    coll = eng.create_collection("v", ["lexical", "dense@image:metric=cosine,Flat"], model=None)
    coll.add(docs)
    coll.save_profile("cands", {"retrieve": RETRIEVE, "fuse": {"method": "rrf", "k": 60}})
    queries = [(f"q{t}", topic) for t, topic in enumerate(TOPICS)]
    qvec = unit(centers + 0.3 * rng.standard_normal(centers.shape)).astype(np.float32)
    qrels = {f"q{t}": {f"r{t}_{j}": 1 for j in range(3)} for t in range(len(TOPICS))}
    cands = collect(coll, queries, qrels, profile="cands", window=20,
                    field_vectors={"image": qvec})
    assert cands.names == schema.NAMES + ("vec_sim@image",)
    ranker = train.fit(cands, None, params={"min_data_in_leaf": 5}, max_rounds=30)
    store(coll, "mine", ranker, window=20, retrieve=RETRIEVE)
    yield eng, coll, ranker, queries, qvec, images
    eng.close()


def test_the_feature_equals_the_numpy_similarity(setup):
    _, coll, ranker, queries, qvec, images = setup
    assert "vec_sim@image" in ranker.meta["features"]
    hits = coll.query(queries[2][1], vector={"image": qvec[2]}, k=10, profile="mine",
                      explain=True)
    assert len(hits) == 10
    for h in hits:
        got = h.explain["rerank"]["features"]["vec_sim@image"]
        assert got == pytest.approx(float(qvec[2] @ images[h.id] / np.linalg.norm(qvec[2])),
                                    abs=1e-5)
    # a query without the field's vector: the feature is missing (NaN -> None), and ranks
    hits = coll.query(queries[2][1], k=10, explain=True,
                      profile={"retrieve": [{"index": "lexical", "k": 20}],
                               "rerank": {"model": "mine", "window": 20}})
    assert hits and all(h.explain["rerank"]["features"]["vec_sim@image"] is None for h in hits)


def test_the_ranker_learns_the_image_similarity(setup):
    _, coll, _, queries, qvec, _ = setup
    good = {"cands": 0, "mine": 0}
    for t, (_, text) in enumerate(queries):
        for prof in good:
            top = coll.query(text, vector={"image": qvec[t]}, k=3, profile=prof)
            good[prof] += sum(h.id.startswith(f"r{t}_") for h in top)
    assert good["mine"] > good["cands"]
    assert good["mine"] >= 0.8 * 3 * len(queries)


def test_a_collection_with_other_named_fields_refuses_the_model(setup, tmp_path):
    _, _, ranker, queries, qvec, images = setup
    eng = polyindex.open(tmp_path / "other")
    coll = eng.create_collection("w", ["lexical", "dense@image:metric=cosine,Flat",
                                       "dense@tag:dim=2,Flat"], model=None)
    coll.add([{"id": d, "text": "alpha", "vectors": {"image": v, "tag": [1.0, 0.0]}}
              for d, v in images.items()])
    store(coll, "mine", ranker, window=20, retrieve=RETRIEVE)
    with pytest.raises(InvalidArgument, match=r"named vector fields \['image'\], this "
                                              r"collection has \['image', 'tag'\]"):
        coll.query("alpha", vector={"image": qvec[0]}, profile="mine")
    eng.close()


def test_collections_without_named_fields_keep_the_fixed_schema():
    from polyindex.index.registry import from_factory
    kinds = {k.name: k for k in map(from_factory, ["lexical", "dense:Flat"])}
    assert schema.names_for(kinds) == schema.NAMES
    kinds["dense@image"] = from_factory("dense@image:Flat")
    assert schema.names_for(kinds)[-1] == "vec_sim@image"
