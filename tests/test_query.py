"""The query pipeline end to end on a small collection with the real model and indexes."""
import math

import faiss
import numpy as np
import pytest

import polyindex
from polyindex import InputError, InvalidArgument, ResourceExhausted

DOCS = [
    {"_id": "wing", "title": "Wing flutter", "text": "Aeroelastic flutter of a swept wing at transonic speed.", "year": 1961, "lang": "en"},
    {"_id": "heat", "title": "Heat transfer", "text": "Heat transfer to a blunt body in hypersonic flow.", "year": 1965, "lang": "en"},
    {"_id": "layer", "title": "Boundary layers", "text": "Transition of the laminar boundary layer on a flat plate.", "year": 1970, "lang": "en"},
    {"_id": "cake", "title": "Chocolate cake", "text": "Bake the chocolate cake for forty minutes with butter and sugar.", "year": 1999, "lang": "en"},
    {"_id": "pasta", "title": "Pasta", "text": "Boil the spaghetti in salted water, add tomato sauce.", "year": 2001, "lang": "it"},
    {"_id": "soccer", "title": "Football", "text": "The striker scored a late goal in the cup final.", "year": 2010, "lang": "en"},
    {"_id": "chess", "title": "Chess openings", "text": "The Sicilian defence is a sharp reply to the king pawn opening.", "year": 1980, "lang": "de"},
    {"_id": "cells", "title": "Cell biology", "text": "Mitochondria produce energy for the cell through respiration.", "year": 1995, "lang": "en"},
]


@pytest.fixture(scope="module")
def coll(tmp_path_factory):
    eng = polyindex.open(tmp_path_factory.mktemp("q"))
    c = eng.create_collection("small", ["lexical", "dense"], fields={"year": "int", "lang": "string"},
                              segment_size=3,
                              profiles={"mix": {"retrieve": [{"index": "lexical", "k": 50},
                                                             {"index": "dense", "k": 50}],
                                                "fuse": {"method": "weighted",
                                                         "weights": {"lexical": 0.3, "dense": 0.7}}}})
    for start in range(0, len(DOCS), 3):  # several segments, on purpose
        c.add(DOCS[start:start + 3])
    return c


def ids(hits):
    return [h.id for h in hits]


def test_single_stage_profiles(coll):
    assert coll.count() == len(DOCS)
    assert coll.info()["segments"] == 3
    assert ids(coll.query("chocolate butter", profile="lexical", k=3))[0] == "cake"
    # dense matches meaning without shared words
    assert ids(coll.query("dessert recipe with cocoa", profile="dense", k=1)) == ["cake"]
    lex = coll.query("chocolate", profile="lexical", k=10)
    assert ids(lex) == ["cake"]  # only matching documents come back from lexical


def test_hybrid_is_rrf_of_stage_ranks(coll):
    hits = coll.query("hypersonic heat flow", profile="hybrid", k=5, explain=True)
    assert hits[0].id == "heat"
    for h in hits:
        stages = h.explain["stages"]
        w = {"lexical": 1.0, "dense": 1.1}  # the built-in hybrid weights its dense leg
        expected = sum(w[kind] / (60 + s["rank"]) for kind, s in stages.items() if s is not None)
        assert math.isclose(h.score, expected, rel_tol=1e-9)
    assert hits == sorted(hits, key=lambda h: -h.score)


def test_weighted_user_profile(coll):
    hits = coll.query("chess king pawn", profile="mix", k=3, explain=True)
    assert hits[0].id == "chess"
    assert 0 < hits[0].score <= 1.0 + 1e-9


def test_hybrid_adaptive_weighs_each_query_by_its_dense_list(coll):
    """``hybrid-adaptive``: min-max normalized lexical and dense scores, the dense weight moved
    by how peaked that query's own dense list is (``fusion.adapted_weights``)."""
    from polyindex.rerank import fusion
    seen = set()
    for text in ("hypersonic heat flow", "chocolate cake recipe", "sport"):
        lex = coll.query(text, profile="lexical", k=1000)
        dense = coll.query(text, profile="dense", k=1000)
        w_lex, w_dense = fusion.adapted_weights([0.45, 0.55], 1,
                                                np.array([h.score for h in dense]), 0.15, 0.7)
        seen.add(round(w_dense, 6))

        def norm(hits):
            s = np.array([h.score for h in hits], np.float64)
            lo, hi = (s.min(), s.max()) if len(s) else (0, 0)
            return {h.id: ((v - lo) / (hi - lo) if hi > lo else 1.0) for h, v in zip(hits, s)}
        nl, nd = norm(lex), norm(dense)
        want = {d: w_lex * nl.get(d, 0.0) + w_dense * nd.get(d, 0.0) for d in nl.keys() | nd.keys()}
        hits = coll.query(text, profile="hybrid-adaptive", k=len(DOCS))
        assert [h.id for h in hits] == sorted(want, key=lambda d: -want[d])
        for h in hits:
            assert math.isclose(h.score, want[h.id], rel_tol=1e-6, abs_tol=1e-9)
    assert len(seen) > 1  # the queries were fused with weights of their own


def test_filters(coll):
    old = coll.query("transfer flow layer wing", profile="hybrid", k=10, filter={"year": {"lt": 1966}})
    assert set(ids(old)) <= {"wing", "heat"} and "heat" in ids(old)
    assert ids(coll.query("spaghetti", profile="dense", k=10, filter={"lang": "it"})) == ["pasta"]
    got = coll.query("anything at all", profile="dense", k=10,
                     filter={"or": [{"lang": {"in": ["de"]}}, {"id": "cells"}]})
    assert set(ids(got)) == {"chess", "cells"}
    none = coll.query("chocolate", profile="lexical", k=10, filter={"not": {"lang": "en"}})
    assert ids(none) == []
    with pytest.raises(InvalidArgument, match="not a declared field"):
        coll.query("x", profile="lexical", filter={"colour": "red"})
    with pytest.raises(InvalidArgument, match="unknown operator"):
        coll.query("x", profile="lexical", filter={"year": {"between": [1, 2]}})


def test_errors(coll):
    with pytest.raises(InvalidArgument, match="unknown rank profile 'nope'.*hybrid"):
        coll.query("x", profile="nope")
    with pytest.raises(InvalidArgument):
        coll.query("x", k=0)
    with pytest.raises(ResourceExhausted):
        coll.query("x", k=10_001)
    with pytest.raises(InvalidArgument, match=r"shape \(3,\).*dimension 384"):
        coll.query(vector=[0.1, 0.2, 0.3], profile="dense")
    with pytest.raises(InvalidArgument, match="NaN"):
        coll.query(vector=[float("nan")] * 384, profile="dense")
    with pytest.raises(InvalidArgument, match="needs query text"):
        coll.query(vector=[0.05] * 384, profile="lexical")
    with pytest.raises(InvalidArgument, match="non-empty"):
        coll.query("   ", profile="lexical")
    with pytest.raises(InputError, match="field 'year' must be int.*|id='bad'"):
        coll.add([{"_id": "bad", "text": "t", "year": "nineteen"}])
    assert coll.get(["bad"]) == [None]


def test_batch_equals_single_and_vectors(coll):
    texts = ["wing flutter", "football goal", "energy in cells"]
    batch = coll.query_batch(texts, profile="hybrid", k=4)
    assert [ids(b) for b in batch] == [ids(coll.query(t, profile="hybrid", k=4)) for t in texts]
    vec = coll.encoder.encode(["football goal"])[0]
    assert ids(coll.query(vector=vec, profile="dense", k=3)) == ids(coll.query("football goal", profile="dense", k=3))


def test_dense_equals_raw_faiss(coll):
    snap = coll.view()
    emb = np.concatenate([s.indexes["dense"].matrix() for s in snap.segments])
    doc_ids = np.concatenate([s.docs.ids for s in snap.segments])
    raw = faiss.IndexFlatIP(emb.shape[1])
    raw.add(emb)
    q = coll.encoder.encode(["swept wing at transonic speed"])
    scores, rows = raw.search(q, 5)
    hits = coll.query(vector=q[0], profile="dense", k=5)
    assert ids(hits) == doc_ids[rows[0]].tolist()
    assert np.allclose([h.score for h in hits], scores[0], atol=1e-5)


def test_get_returns_metadata_and_persists(coll):
    doc = coll.get(["pasta"])[0]
    assert doc.title == "Pasta" and doc.metadata == {"year": 2001, "lang": "it"}
    again = polyindex.open(coll.folder.parent, readonly=True).collection("small")
    assert ids(again.query("spaghetti tomato", profile="hybrid", k=3)) == \
        ids(coll.query("spaghetti tomato", profile="hybrid", k=3))
